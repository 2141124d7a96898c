"""Differential fuzzing: random shard_map programs, original vs rewritten, on 8 host devices.

Each case draws a mesh (1-D to 3-D, axis sizes 2 to 8, at most 8 devices, devices in
JAX's order or permuted), the axis or axes to gather/scatter over (several in either
order), which mesh axes the shard_map makes manual (all, or only some), a dot layout (batch, contracting and free dims, each
operand's dims in random order), which operand and dim is gathered (or which result
dim is scattered), sizes (divisible by the group where the collective needs it, any
size elsewhere), an element type (f32, bf16, f16), the export form (Shardy or GSPMD)
and the pass options (bidirectional, unroll). The program is built with
jax.shard_map, lowered, rewritten with threshold-mib=0, and both versions run on the
same random inputs and are compared.

    python -m overlap_hlo.tools.fuzz --cases 1000 [--seed 0]
    overlap-fuzz --cases 1000

Prints how many cases were rewritten and agreed, left unchanged (and why), disagreed
or crashed; exits 1 if any disagreed or crashed.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

AXES = ("x", "y", "z")
MESHES = [(n,) for n in range(2, 9)] + [(2, 2), (2, 3), (3, 2), (2, 4), (4, 2), (2, 2, 2)]
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Case:
    """Every random choice of one program; `describe()` is its reproducer."""

    mesh: tuple[int, ...]
    axes: tuple[str, ...]          # the collective's mesh axes
    kind: str                      # "gather" or "scatter"
    batch: tuple[int, ...]         # sizes of the batch dims
    contracting: tuple[int, ...]
    lhs_free: tuple[int, ...]
    rhs_free: tuple[int, ...]
    lhs_order: tuple[int, ...]     # permutation of the lhs's logical dims
    rhs_order: tuple[int, ...]
    operand: int                   # gather: which operand is gathered
    role: str                      # "batch", "contracting", "free" (of that operand / result)
    index: int                     # which dim of that role
    dtype: str
    shardy: bool
    bidirectional: bool
    unroll: int
    seed: int
    devices: tuple[int, ...] = ()  # the mesh's device order; () is JAX's own
    manual: tuple[str, ...] = ()   # shard_map's manual axes; () is every mesh axis

    @property
    def group(self) -> int:
        sizes = dict(zip(AXES, self.mesh))
        return math.prod(sizes[a] for a in self.axes)

    def describe(self) -> str:
        return repr(self)


def draw(rng: random.Random, seed: int) -> Case:
    """A random case (every dim the collective touches is divisible by the group)."""
    rank = rng.choice((1, 1, 2, 3))
    mesh = rng.choice([m for m in MESHES if len(m) == rank])
    names = AXES[:rank]
    axes = tuple(rng.sample(names, rng.choice((1, 1, 2)) if rank > 1 else 1))
    others = [a for a in names if a not in axes]
    manual = tuple(a for a in names if a in axes or rng.random() < 0.5) \
        if others and rng.random() < 0.3 else ()
    count = math.prod(mesh)
    devices = tuple(rng.sample(range(count), count)) if rng.random() < 0.3 else ()
    group = math.prod(dict(zip(AXES, mesh))[a] for a in axes)
    size = lambda: rng.randint(1, 6)  # noqa: E731
    batch = tuple(size() for _ in range(rng.choice((0, 0, 1))))
    contracting = tuple(size() for _ in range(rng.choice((1, 1, 2))))
    lhs_free = tuple(size() for _ in range(rng.choice((0, 1, 1, 2))))
    rhs_free = tuple(size() for _ in range(rng.choice((0, 1, 1, 2))))
    kind = rng.choice(("gather", "scatter"))
    operand = rng.randint(0, 1)
    if kind == "gather":
        own_free = lhs_free if operand == 0 else rhs_free
        roles = [("contracting", len(contracting))] + [("batch", len(batch))] * bool(batch) \
            + [("free", len(own_free))] * bool(own_free)
    else:
        roles = [("batch", len(batch))] * bool(batch) + \
            [("free", len(lhs_free) + len(rhs_free))] * bool(lhs_free or rhs_free)
        if not roles:
            lhs_free, roles = (size(),), [("free", 1)]
    role, count = rng.choice(roles)
    index = rng.randrange(count)
    # Make the touched dim divisible: a gathered dim is `group` shards of its size.
    scale = lambda dims, i: tuple(d * group if j == i else d for j, d in enumerate(dims))  # noqa: E731
    if role == "batch":
        batch = scale(batch, index)
    elif role == "contracting":
        contracting = scale(contracting, index)
    elif kind == "gather":
        if operand == 0:
            lhs_free = scale(lhs_free, index)
        else:
            rhs_free = scale(rhs_free, index)
    elif index < len(lhs_free):
        lhs_free = scale(lhs_free, index)
    else:
        rhs_free = scale(rhs_free, index - len(lhs_free))
    shardy = rng.random() < 0.5
    lhs_rank = len(batch) + len(contracting) + len(lhs_free)
    rhs_rank = len(batch) + len(contracting) + len(rhs_free)
    return Case(mesh, axes, kind, batch, contracting, lhs_free, rhs_free,
                tuple(rng.sample(range(lhs_rank), lhs_rank)),
                tuple(rng.sample(range(rhs_rank), rhs_rank)),
                operand, role, index, rng.choice(DTYPES), shardy,
                rng.random() < 0.5, rng.choice((1, 1, 2, 3)), seed, devices,
                # XLA aborts compiling partially manual GSPMD programs (the original too)
                manual if len(manual) < rank and shardy else ())


def _letters(case: Case):
    """einsum letters of each operand (in storage order) and of the result."""
    b = "ab"[:len(case.batch)]
    c = "cd"[:len(case.contracting)]
    lf, rf = "ef"[:len(case.lhs_free)], "gh"[:len(case.rhs_free)]
    lhs_logical, rhs_logical = b + c + lf, b + c + rf
    lhs = "".join(lhs_logical[i] for i in case.lhs_order)
    rhs = "".join(rhs_logical[i] for i in case.rhs_order)
    sizes = dict(zip(b + c + lf + rf, case.batch + case.contracting + case.lhs_free
                     + case.rhs_free))
    return lhs, rhs, b + lf + rf, sizes


def _touched_letter(case: Case) -> str:
    b, c = "ab"[:len(case.batch)], "cd"[:len(case.contracting)]
    if case.role == "batch":
        return b[case.index]
    if case.role == "contracting":
        return c[case.index]
    if case.kind == "gather":
        return ("ef" if case.operand == 0 else "gh")[case.index]
    free = "ef"[:len(case.lhs_free)] + "gh"[:len(case.rhs_free)]
    return free[case.index]


def build(case: Case):
    """(jitted shard_map program, inputs) for `case`."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    names = AXES[:len(case.mesh)]
    devices = np.array(jax.devices()[:math.prod(case.mesh)])
    if case.devices:
        devices = devices[list(case.devices)]
    # Auto axes: JAX 0.12 cannot lower psum_scatter in a partially manual shard_map
    # over an Explicit mesh.
    axis_type = getattr(jax.sharding, "AxisType", None)
    types = {} if axis_type is None else {"axis_types": (axis_type.Auto,) * len(names)}
    mesh = jax.sharding.Mesh(devices.reshape(case.mesh), names, **types)
    lhs, rhs, out, sizes = _letters(case)
    letter = _touched_letter(case)
    spec_axis = case.axes if len(case.axes) > 1 else case.axes[0]
    dtype = getattr(jnp, case.dtype)
    axis = case.axes if len(case.axes) > 1 else case.axes[0]

    def spec(letters: str, sharded: bool) -> P:
        return P(*[spec_axis if sharded and ch == letter else None for ch in letters])

    if case.kind == "gather":
        gathered = lhs if case.operand == 0 else rhs
        dim = gathered.index(letter)

        def fn(a, w):
            g = jax.lax.all_gather(a if case.operand == 0 else w, axis, axis=dim, tiled=True)
            operands = (g, w) if case.operand == 0 else (a, g)
            return jnp.einsum(f"{lhs},{rhs}->{out}", *operands,
                              preferred_element_type=jnp.float32).astype(dtype)

        in_specs = (spec(lhs, case.operand == 0), spec(rhs, case.operand == 1))
        out_specs = P()
    else:
        dim = out.index(letter)

        def fn(a, w):
            y = jnp.einsum(f"{lhs},{rhs}->{out}", a, w)
            return jax.lax.psum_scatter(y, axis, scatter_dimension=dim, tiled=True)

        in_specs = (spec(lhs, False), spec(rhs, False))
        out_specs = spec(out, True)
    jitted = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                   check_vma=False, axis_names=set(case.manual or names)))
    rng = np.random.default_rng(case.seed)
    inputs = [jax.device_put(jnp.asarray(rng.standard_normal([sizes[ch] for ch in letters]),
                                         dtype), NamedSharding(mesh, s))
              for letters, s in ((lhs, in_specs[0]), (rhs, in_specs[1]))]
    return jitted, inputs


def tolerance(dtype: str) -> float:
    """Largest accepted |rewritten - original| relative to the output's scale: f32 to
    rounding, bf16/f16 four ulps (summation order and one more rounding differ)."""
    return {"float32": 1e-5, "bfloat16": 4 * 2 ** -7, "float16": 4 * 2 ** -10}[dtype]


def run(case: Case) -> tuple[str, str]:
    """(outcome, detail): outcome is "rewritten", "unchanged", "mismatch", "crash", or
    "not generated" / "original fails" when JAX or XLA rejects the original program."""
    import jax

    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", case.shardy)
    try:
        return _run(case)
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)


def _run(case: Case) -> tuple[str, str]:
    import numpy as np

    import overlap_hlo

    try:
        jitted, inputs = build(case)
        lowered = jitted.lower(*inputs)
    except Exception as err:   # the generator made a program JAX rejects
        return "not generated", f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    try:
        want = np.asarray(lowered.compile()(*inputs), np.float64)
    except Exception as err:   # e.g. XLA:CPU has no bf16 x bf16 -> f32 dot for some shapes
        return "original fails", f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    options = dict(threshold_mib=0, bidirectional=case.bidirectional, unroll=case.unroll)
    try:
        sites = overlap_hlo.remarks(lowered.as_text(), **options)
        rewritten = overlap_hlo.rewrite_lowered(lowered, **options)
        got = np.asarray(rewritten.compile()(*inputs), np.float64)
    except Exception:
        return "crash", traceback.format_exc(limit=4)
    if not any(site.applied for site in sites):
        reasons = "; ".join(site.reason for site in sites) or "no candidate site"
        return "unchanged", reasons
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    error = float(np.max(np.abs(got - want))) / scale if want.size else 0.0
    if not error <= tolerance(case.dtype):
        return "mismatch", f"relative error {error:.3g}"
    return "rewritten", f"relative error {error:.2g}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="print every case")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    outcomes: Counter = Counter()
    reasons: Counter = Counter()
    failures = []
    start = time.perf_counter()
    for i in range(args.cases):
        case = draw(rng, seed=args.seed * 1_000_003 + i)
        outcome, detail = run(case)
        outcomes[outcome] += 1
        if outcome in ("unchanged", "not generated", "original fails"):
            reasons[f"{outcome}: {detail}"] += 1
        if outcome in ("mismatch", "crash"):
            failures.append((case, detail))
            print(f"FAILED case {i}: {outcome}: {detail}\n  {case.describe()}", flush=True)
        elif args.verbose:
            print(f"case {i}: {outcome}: {detail}", flush=True)
    elapsed = time.perf_counter() - start
    passed = outcomes["rewritten"] + outcomes["unchanged"]
    print(f"{args.cases} cases in {elapsed:.0f} s (seed {args.seed}): "
          f"{outcomes['rewritten']} rewritten and agreed, {outcomes['unchanged']} left "
          f"unchanged, {outcomes['mismatch']} mismatched, {outcomes['crash']} crashed, "
          f"{outcomes['not generated']} not generated, {outcomes['original fails']} whose "
          "original program XLA could not run")
    for reason, count in reasons.most_common():
        print(f"  {count:5d}  {reason}")
    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

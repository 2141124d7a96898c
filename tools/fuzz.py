"""Differential fuzzing: random shard_map programs, original vs rewritten, on 8 host devices.

Each case draws a mesh (1-D to 3-D, axis sizes 2 to 8, at most 8 devices, devices in
JAX's order or permuted), the axis or axes to gather/scatter over (several in either
order), which mesh axes the shard_map makes manual (all, or only some), a dot layout
(batch, contracting and free dims, each operand's dims in random order), which operand
and dim is gathered (or which result dim is scattered, or the product summed by a psum),
sizes (divisible by the group where the collective needs it, any size elsewhere), an
element type (f32, bf16, f16; f8 for gathers), what surrounds the site (CONTEXTS:
branches, loops, nested jax.jit calls, a stage under a branch), the export form (Shardy
or GSPMD), the pass options (bidirectional, unroll) and the forms (every backend's, or
the TPU forms with their summing rings, or the GPU forms: their uninitialised buffers
filled with NaN, so that an element a ring fails to write shows). The program is built with
jax.shard_map, lowered, rewritten with threshold-mib=0, and both versions run on the
same random inputs and are compared.

That generator is fuzz_sites, the fallback; the other cases come from one module each:
fuzz_huge (dims beyond int32, checked on the IR), fuzz_promoted (reduce_scatters that
sum in a wider type than their operand: hand-written modules, checked against numpy),
fuzz_api (sequences of calls through overlap() with Python and JAX scalars, static
arguments and precision contexts, checked against jax.jit), fuzz_exchange (all_to_alls
beside a dot: MoE dispatch and combine, Ulysses, partial sums, a transposed product, on
random meshes, axes, sizes and types), fuzz_block (tensor-parallel blocks: psums after
row-parallel matmuls, residual adds and norms between them, in a scan or not, the batch
split over another mesh axis or not) and fuzz_wrapped (sites wrapped in what users write
around them: calls, linear ops, zero sizes, per-platform branches, two collectives of one
product, predicates from shard_map inputs); fuzz_common holds the meshes, element types
and comparison they share. Each generator module ends in one record, `GENERATOR =
Generator(name, share, case class, draw, build=... or run=...)`, and GENERATORS below
names the modules, one line each: this module draws among them by share, runs each case
and counts (by outcome, and by generator).
Besides a mismatch or a crash, a site the tool reports as an internal error and a
collective next to a dot with no site record (silent) fail a case.

    python -m overlap_hlo.tools.fuzz --cases 1000 [--seed 0]
    overlap-fuzz --cases 1000

Prints how many cases were rewritten and agreed, left unchanged (and why), disagreed,
crashed, hit an internal error or left a site silent; exits 1 if any did.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
import warnings
from collections import Counter
from importlib import import_module

from .cli import EXIT_FAILURE, EXIT_OK
from .fuzz_common import Generator, _in_f32, _leaves, judge

__all__ = [
    "FAILURES", "GENERATORS", "build", "draw_any", "judge", "main", "run", "silent_sites",
    "use_host_devices",
]

HOST_DEVICES = "--xla_force_host_platform_device_count=8"

# The generators, one line each (fuzz_<name>.GENERATOR), in the order draw_any tries
# their shares; the one without a share takes the rest.
GENERATORS: tuple[Generator, ...] = tuple(
    import_module(f".fuzz_{name}", __package__).GENERATOR for name in (
        "huge",
        "promoted",
        "api",
        "exchange",
        "block",
        "wrapped",
        "sites",
    ))
(FALLBACK,) = (generator for generator in GENERATORS if generator.share is None)
BY_CASE = {generator.case: generator for generator in GENERATORS}


def use_host_devices() -> None:
    """Eight host CPU devices and no TPU backend start-up, for the JAX this process has
    not initialised yet (main() calls it first; tests/conftest.py does the same)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if HOST_DEVICES not in flags.split():
        os.environ["XLA_FLAGS"] = f"{flags} {HOST_DEVICES}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def draw_any(rng: random.Random, seed: int):
    """One case of any generator, each picked with its share (in GENERATORS' order), the
    fallback with what is left."""
    pick, bound = rng.random(), 0.0
    for generator in GENERATORS:
        if generator.share is not None:
            bound += generator.share
            if pick < bound:
                return generator.draw(rng, seed)
    return FALLBACK.draw(rng, seed)


def build(case):
    """(jitted shard_map program, inputs) for a case of a generator that builds one."""
    return BY_CASE[type(case)].build(case)


def run(case) -> tuple[str, str]:
    """(outcome, detail): outcome is "rewritten", "unchanged", "mismatch", "crash", or
    "not generated" / "original fails" when JAX or XLA rejects the original program.
    A case whose generator runs it itself goes there; the others are built and compared."""
    import jax

    if BY_CASE[type(case)].run is not None:
        return BY_CASE[type(case)].run(case)
    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", case.shardy)
    try:
        return _run(case)
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)


def _run(case) -> tuple[str, str]:
    import overlap_hlo
    from overlap_hlo.targets.cpu import rewrite_runnable

    try:
        jitted, inputs = build(case)
        lowered = jitted.lower(*inputs)
    except Exception as err:   # the generator made a program JAX rejects
        return "not generated", f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    if getattr(case, "platforms", ()):
        return _run_exported(case, jitted, inputs)
    try:
        want = _leaves(lowered.compile()(*inputs))
    except Exception as err:   # e.g. XLA:CPU has no bf16 x bf16 -> f32 dot for some shapes
        return "original fails", f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    options = dict(threshold_mib=0, bidirectional=case.bidirectional, unroll=case.unroll)
    if case.target:   # half the TPU cases (odd seeds) put a summing ring's own shard last
        options.update(target=case.target, tpu_summing_rings=case.target == "tpu",
                       own_shard_last=case.target == "tpu" and case.seed % 2 == 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # sites left unchanged are counted below
            if case.target:   # buffers left uninitialised there: NaN here
                sites, _, rewritten = rewrite_runnable(lowered, **options)
            else:
                sites = overlap_hlo.remarks(lowered.as_text(), **options)
                rewritten = overlap_hlo.rewrite_lowered(lowered, **options)
        got = _leaves(rewritten.compile()(*inputs))
    except Exception:
        return "crash", traceback.format_exc(limit=4)
    reference = (lambda: _in_f32(jitted, inputs)) if case.dtype != "float32" else None
    return _outcome(lowered.as_text(), sites, got, want, case.dtype, reference)


def _outcome(text: str, sites, got, want, dtype: str, reference) -> tuple[str, str]:
    """The verdict on one rewritten program: a mismatch, a site the tool failed on
    ("internal error"), a collective next to a dot with no record ("silent"), else
    rewritten or unchanged."""
    from overlap_hlo.ir.unsupported import Kind
    agrees, error = judge(got, want, dtype, reference)
    if not agrees:
        return "mismatch", error
    internal = [site for site in sites if site.kind == Kind.INTERNAL_ERROR]
    if internal:
        return "internal error", internal[0].format()
    silent = silent_sites(text, sites)
    if silent:
        return "silent", f"no record for the collective at {silent[0]}"
    if not any(site.applied for site in sites):
        reasons = "; ".join(sorted({site.reason for site in sites})) or "no candidate site"
        return "unchanged", reasons
    return "rewritten", error


def silent_sites(text: str, sites) -> list[str]:
    """The collectives of `text` next to a dot that no site record names."""
    import overlap_hlo
    from overlap_hlo.ir.normalize import normalize
    from overlap_hlo.rewrite.coverage import candidates, unreported

    module = overlap_hlo.parse(text)
    with module.context:
        normalize(module.operation)
        return [str(c.where) for c in unreported(candidates(module.operation), sites)]


def _run_exported(case, jitted, inputs) -> tuple[str, str]:
    """A multi-platform export (case.platforms), rewritten with rewrite_exported and
    called on the CPU against the original export."""
    import jax
    from jax import export

    import overlap_hlo

    shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) for x in inputs]
    try:
        exported = export.export(jitted, platforms=case.platforms)(*shapes)
        want = _leaves(exported.call(*inputs))
    except Exception as err:
        return "original fails", f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
    options = dict(threshold_mib=0, bidirectional=case.bidirectional, unroll=case.unroll)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            text = exported.mlir_module()
            sites = overlap_hlo.remarks(text, **options)
            got = _leaves(overlap_hlo.rewrite_exported(exported, **options).call(*inputs))
    except Exception:
        return "crash", traceback.format_exc(limit=4)
    return _outcome(text, sites, got, want, case.dtype, None)


FAILURES = ("mismatch", "crash", "internal error", "silent")


def main(argv=None) -> int:
    use_host_devices()   # before anything imports jax
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="print every case")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    outcomes: Counter = Counter()
    reasons: Counter = Counter()
    drawn: Counter = Counter()
    failures = []
    start = time.perf_counter()
    for i in range(args.cases):
        seed = args.seed * 1_000_003 + i
        case = draw_any(rng, seed)
        drawn[BY_CASE[type(case)].name] += 1
        if args.verbose:   # before running: XLA may abort the process
            print(f"case {i}: {case.describe()}", flush=True)
        outcome, detail = run(case)
        outcomes[outcome] += 1
        if outcome in ("unchanged", "not generated", "original fails"):
            reasons[f"{outcome}: {detail}"] += 1
        if outcome in FAILURES:
            failures.append((case, detail))
            print(f"FAILED case {i}: {outcome}: {detail}\n  {case.describe()}", flush=True)
        elif args.verbose:
            print(f"  -> {outcome}: {detail}", flush=True)
    elapsed = time.perf_counter() - start
    passed = outcomes["rewritten"] + outcomes["unchanged"]
    print(f"{args.cases} cases in {elapsed:.0f} s (seed {args.seed}): "
          f"{outcomes['rewritten']} rewritten and agreed, {outcomes['unchanged']} left "
          f"unchanged, {outcomes['mismatch']} mismatched, {outcomes['crash']} crashed, "
          f"{outcomes['internal error']} internal errors, {outcomes['silent']} silent sites, "
          f"{outcomes['not generated']} not generated, {outcomes['original fails']} whose "
          "original program XLA could not run")
    for reason, count in reasons.most_common():
        print(f"  {count:5d}  {reason}")
    print("by generator: " + ", ".join(f"{g.name} {drawn[g.name]}" for g in GENERATORS))
    print(f"{passed} passed, {len(failures)} failed")
    return EXIT_FAILURE if failures else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

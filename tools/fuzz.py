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

That generator is fuzz_sites; the other cases come from one module each:
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
and comparison they share. This module draws among them, runs each case and counts.
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

from .cli import EXIT_FAILURE, EXIT_OK
from .fuzz_api import ApiCase, draw_api, run_api
from .fuzz_block import BlockCase, build_block, draw_block
from .fuzz_common import _in_f32, _leaves, judge
from .fuzz_exchange import EXCHANGES, ExchangeCase, build_exchange, draw_exchange
from .fuzz_huge import HugeCase, draw_huge, run_huge
from .fuzz_promoted import PromotedCase, draw_promoted, run_promoted
from .fuzz_sites import Case, build_site, draw
from .fuzz_wrapped import WrappedCase, build_wrapped, draw_wrapped

__all__ = [   # the driver, and the generators' names the tests reach through this module
    "EXCHANGES", "FAILURES", "ApiCase", "BlockCase", "Case", "ExchangeCase", "HugeCase",
    "PromotedCase", "WrappedCase", "build", "draw", "draw_any", "draw_promoted", "judge",
    "main", "run", "silent_sites", "use_host_devices",
]

HOST_DEVICES = "--xla_force_host_platform_device_count=8"
HUGE_SHARE = 0.05      # of the cases: dims beyond int32, checked on the IR only
PROMOTED_SHARE = 0.04  # reduce_scatters summing in a wider type (hand-written modules)
API_SHARE = 0.04       # call sequences through overlap() against jax.jit's
EXCHANGE_SHARE = 0.10  # all_to_all next to a dot (MoE dispatch and combine, Ulysses)
BLOCK_SHARE = 0.10     # tensor-parallel blocks: psum, residual, norm, next dot
WRAPPED_SHARE = 0.15   # sites wrapped in calls, linear ops, branches, platforms (fuzz_wrapped)


def use_host_devices() -> None:
    """Eight host CPU devices and no TPU backend start-up, for the JAX this process has
    not initialised yet (main() calls it first; tests/conftest.py does the same)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if HOST_DEVICES not in flags.split():
        os.environ["XLA_FLAGS"] = f"{flags} {HOST_DEVICES}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def draw_any(rng: random.Random, seed: int):
    """One case of any generator, in the shares above."""
    pick, bound = rng.random(), 0.0
    for share, generator in ((HUGE_SHARE, lambda: draw_huge(rng)),
                             (PROMOTED_SHARE, lambda: draw_promoted(rng, seed)),
                             (API_SHARE, lambda: draw_api(rng, seed)),
                             (EXCHANGE_SHARE, lambda: draw_exchange(rng, seed)),
                             (BLOCK_SHARE, lambda: draw_block(rng, seed)),
                             (WRAPPED_SHARE, lambda: draw_wrapped(rng, seed))):
        bound += share
        if pick < bound:
            return generator()
    return draw(rng, seed=seed)


# The generators whose cases run on their own (not as a jitted program and inputs),
# and those that build such a program (the others are fuzz_sites' Case).
RUNNERS = {HugeCase: run_huge, PromotedCase: run_promoted, ApiCase: run_api}
BUILDERS = {ExchangeCase: build_exchange, BlockCase: build_block, WrappedCase: build_wrapped}


def build(case):
    """(jitted shard_map program, inputs) for a case of any generator that builds one."""
    return BUILDERS.get(type(case), build_site)(case)


def run(case) -> tuple[str, str]:
    """(outcome, detail): outcome is "rewritten", "unchanged", "mismatch", "crash", or
    "not generated" / "original fails" when JAX or XLA rejects the original program."""
    import jax

    if type(case) in RUNNERS:
        return RUNNERS[type(case)](case)
    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", case.shardy)
    try:
        return _run(case)
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)


def _run(case: Case) -> tuple[str, str]:
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
    failures = []
    start = time.perf_counter()
    for i in range(args.cases):
        seed = args.seed * 1_000_003 + i
        case = draw_any(rng, seed)
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
    print(f"{passed} passed, {len(failures)} failed")
    return EXIT_FAILURE if failures else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

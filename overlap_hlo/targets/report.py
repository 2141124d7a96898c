"""Per-site report of a module compiled for a TPU slice or a GPU target, before and after
the rewrite.

    rep = overlap_hlo.targets.report.build("model.mlir text", "v5e:2x4", bidirectional=True)
    print(rep.format()); json.dump(rep.to_json(), f)

Both modules are compiled ahead of time (`overlap_hlo.targets.tpu`, `.gpu`) and their
schedules modelled (`overlap_hlo.targets.schedule`; on GPU with kernels priced by the
analytic model, `gpu_timing`). A site is found in the compiled module by the
source location its remark names: the rewrite keeps the collective's location on every
op it builds, and XLA carries it into the instructions' metadata. A site's time in a
module is the communication exposed at its location, plus the compute of the
instructions at its location, plus the matmuls beside its collectives (the original's
dots). XLA may drop a collective's location (a small reduce-scatter becomes an
all-reduce) but keeps its dots': the positions of the site's dots, which its `Site`
record names, find it then.

Its parts: `report_rows` (a site's row), `report_render` (Report: the table, verdict,
JSON), `candidates` (the option sets tried and the choice among them), `report_build`
(compiling and assembling the reports). Their names used elsewhere are exported here.
"""
from __future__ import annotations

from overlap_hlo.ir import compat
from overlap_hlo.plan.xla_flags import ring_options
from overlap_hlo.rewrite.pipeline import DEFAULT_PIPELINE
from overlap_hlo.targets import aot, candidates, gpu, report_build, schedule, tpu
from overlap_hlo.targets.candidates import (  # noqa: F401 (exported)
    CANDIDATES, ORIGINAL, PER_PASS, _Candidate, _fastest, _kept, _left_by_pass, _PerPass,
    profile_decides)
from overlap_hlo.targets.report_build import _Kind, analyze_compiled  # noqa: F401 (exported)
from overlap_hlo.targets.report_render import Report
from overlap_hlo.targets.report_rows import (  # noqa: F401 (exported)
    SLOWER_TOLERANCE, SiteRow, _at, _row, _site_time, _SiteTime, _where)
from overlap_hlo.targets.schedule import Analysis


def build(source, topology: str | tpu.Topology, pipeline: str = DEFAULT_PIPELINE, *,
          input_name: str | None = None, timeline: bool = False,
          trip_counts: schedule.TripCounts = schedule.trip_count, **options) -> Report:
    """Compile `source` for `topology`, original and rewritten with `options`, and report
    every site. When the slice's profile decides, the module kept is the CANDIDATES'
    fastest in the compiled schedule, or the original. Raises tpu.TpuError subclasses
    when it cannot compile. `trip_counts` reads a loop's iterations (by default from
    the compiled loop itself)."""
    return build_variants(source, topology, {"rewritten": options}, pipeline,
                          input_name=input_name, timeline=timeline,
                          trip_counts=trip_counts)["rewritten"]


def build_variants(source, topology: str | tpu.Topology | gpu.Target, variants: dict[str, dict],
                   pipeline: str = DEFAULT_PIPELINE, *, input_name: str | None = None,
                   timeline: bool = False,
                   trip_counts: schedule.TripCounts = schedule.trip_count) -> dict[str, Report]:
    """One report per option set in `variants` (name -> options), the original
    compiled once and each distinct rewritten module once."""
    # CANDIDATES and _row as bound here when called: callers (and tests) replace them here.
    return report_build.build_variants(source, topology, variants, pipeline,
                                       input_name=input_name, timeline=timeline,
                                       trip_counts=trip_counts, forms=CANDIDATES, row_of=_row)


def _per_pass(pipeline: str, tried: dict[str, _Candidate], original: Analysis,
              input_name: str | None) -> _PerPass | None:
    """`candidates.fastest_per_pass` with CANDIDATES and _row as bound here."""
    return candidates.fastest_per_pass(pipeline, tried, original, input_name,
                                       forms=CANDIDATES, row_of=_row)


def rewrite_lowered(lowered, topology: str | tpu.Topology | gpu.Target,
                    pipeline: str = DEFAULT_PIPELINE, **options):
    """`lowered` (a `jax.stages.Lowered`) with the module the compiled schedule keeps for
    `topology`, and the `Report` that chose it: `overlap_hlo.rewrite_lowered` decides
    each site by the cost model alone, this by compiling the candidates for the target
    (`build`). The original kept (no candidate faster), `lowered` itself is returned.
    The rings are ordered for the slice's device numbering (partition i on device i);
    on a GPU target the Lowered compiles with the XLA options the rings need, for that
    executable only."""
    rep = build(lowered, topology, pipeline, **options)
    if rep.chosen == ORIGINAL or not rep.any_rewritten:
        return lowered, rep
    flags = ring_options(compat.lowering_platforms(lowered))
    return compat.replace_lowered_module(lowered, aot.as_module(rep.module), flags), rep

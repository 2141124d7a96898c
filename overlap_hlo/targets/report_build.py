"""Compiling for the report: what differs between a TPU slice and a GPU target
(`_Kind`), the modelled schedule of a compiled module, and one Report per option set
(`build_variants`), the original compiled once."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from overlap_hlo import api
from overlap_hlo.rewrite.pipeline import DEFAULT_PIPELINE
from overlap_hlo.targets import aot, gpu, schedule, tpu
from overlap_hlo.targets.candidates import CANDIDATES, _Candidate, choose, profile_decides
from overlap_hlo.targets.gpu_timing import GpuTiming
from overlap_hlo.targets.report_render import Report
from overlap_hlo.targets.report_rows import _row, site_rows
from overlap_hlo.targets.schedule import Analysis, Timing


@dataclass(frozen=True)
class _Kind:
    """What differs between a TPU slice and a GPU target for the report."""

    platform: str
    timing: Timing
    compile: Callable
    compile_rewritten: Callable      # with the flags rewritten modules are compiled with
    options: Callable[[dict], dict]
    times: str = ""

    @classmethod
    def of(cls, topo) -> _Kind:
        if isinstance(topo, gpu.Target):
            hw = topo.hardware
            return cls("GPU", GpuTiming(hw, 0.0, topo.device_count),
                       lambda module: gpu.compile_module(module, topo),
                       lambda module: gpu.compile_module(module, topo, rewritten=True),
                       lambda options: gpu.gpu_options(options, topo),
                       f"kernels priced by the analytic model on {hw.name}, not XLA's "
                       "estimates; rewritten modules compiled with " + " ".join(
                           f"--{flag}={value}" for flag, value in gpu.RING_FLAGS.items()))
        compile_for = lambda module: tpu.compile_module(module, topo)  # noqa: E731
        return cls("TPU", Timing(topo.hardware, topo.chip.clock_ghz, topo.device_count,
                                 topo.links), compile_for, compile_for,
                   lambda options: tpu.tpu_options(options, topo))


def analyze_compiled(compiled: aot.Compiled, timing: Timing, timeline: bool = False,
            trip_counts: schedule.TripCounts = schedule.trip_count) -> Analysis:
    """The modelled schedule of one compiled module, with its TPU temp bytes."""
    return schedule.analyze(compiled.hlo_module, timing, timeline=timeline,
                            trip_counts=trip_counts,
                            temp_bytes=compiled.memory.temp_size_in_bytes)


def build_variants(source, topology: str | tpu.Topology | gpu.Target, variants: dict[str, dict],
                   pipeline: str = DEFAULT_PIPELINE, *, input_name: str | None = None,
                   timeline: bool = False,
                   trip_counts: schedule.TripCounts = schedule.trip_count,
                   forms: dict[str, dict] = CANDIDATES,
                   row_of: Callable = _row) -> dict[str, Report]:
    """One report per option set in `variants` (name -> options), the original
    compiled once and each distinct rewritten module once; `forms` are the candidates
    tried where the slice's profile decides, `row_of` makes a site's row."""
    topo = tpu.topology(topology) if isinstance(topology, str) else topology
    kind = _Kind.of(topo)
    timing = kind.timing
    original_compiled = kind.compile(aot.as_module(source))
    original = analyze_compiled(original_compiled, timing, timeline, trip_counts)
    analyses = {api.serialize(original_compiled.module, bytecode=True): original}

    def rewritten(options: dict, text: str = pipeline) -> _Candidate:
        # The sites' estimates are on the slice's profile also when a threshold decides.
        options = dict(options, hardware=options.get("hardware") or topo.hardware)
        module, sites = aot.rewrite(original_compiled.module, text, input_name=input_name,
                                    **options)
        key = api.serialize(module, bytecode=True)
        if key not in analyses:
            analyses[key] = analyze_compiled(kind.compile_rewritten(module), timing,
                                             timeline, trip_counts)
        return _Candidate(module, sites, analyses[key], (options, text))

    reports = {}
    for name, options in variants.items():
        options = kind.options(options)
        chosen, candidates = "", {}
        if profile_decides(options):
            chosen, candidates, result = choose(
                options, rewritten, pipeline, original_compiled.module, original,
                input_name, kind.platform, forms=forms, row_of=row_of)
        else:
            result = rewritten(options)
        rows = site_rows(result.sites, original, result.analysis, input_name, row_of)
        reports[name] = Report(topo.name, timing.hardware.name, timing.clock_ghz,
                               options, rows, original, result.analysis,
                               original.temp_bytes, result.analysis.temp_bytes,
                               result.module, chosen, candidates, kind.platform, kind.times,
                               getattr(topo, "requested", ""), result.sites,
                               result.built_with)
    return reports

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
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from jaxlib.mlir import ir

from overlap_hlo import api
from overlap_hlo.ir.locations import Where
from overlap_hlo.rewrite.pipeline import DEFAULT_PIPELINE, parse_pipeline, registered_passes
from overlap_hlo.targets import aot, gpu, schedule, tpu
from overlap_hlo.targets.gpu_timing import GpuTiming
from overlap_hlo.targets.schedule import Analysis, Timing


@dataclass
class SiteRow:
    location: str
    pattern: str
    applied: bool
    sites: int                      # remarks at this location (e.g. a layer called twice)
    permutes: int                   # collective-permute instructions in the schedule
    overlapped: int                 # of them, with a matmul between start and done
    permute_executions: int         # times the loops run them
    exposed_us: float               # communication waited for, after
    original_exposed_us: float      # the same in the original (its collective)
    before_us: float
    after_us: float
    compute_bound_us: float         # the smaller compute of the two: neither runs faster
    left_because: str = ""          # why a site was left unchanged (the remarks' kind)
    original_compute_us: float = 0.0
    rewritten_compute_us: float = 0.0
    # category (dots, accumulation, copies, initialisation, other) -> [before, after] us
    compute_breakdown: dict[str, list[float]] = field(default_factory=dict)
    collectives_left: list[str] = field(default_factory=list)
    original_collectives: list[str] = field(default_factory=list)
    trip_counts: list[int | None] = field(default_factory=list)
    loop_copies: int = 0
    loop_copy_bytes: int = 0
    model_before_us: float | None = None   # the analytic cost model (overlap_hlo.plan.cost)
    model_after_us: float | None = None
    permute_details: list[dict] = field(default_factory=list)
    synchronous: int = 0            # permutes scheduled as one synchronous instruction

    @property
    def speedup(self) -> float:
        return self.before_us / self.after_us if self.after_us else 1.0

    @property
    def got_slower(self) -> bool:
        """Its time grew by more than rounding, rewritten or not (a site left unchanged
        moves only with the compiler's choices around the rewritten ones)."""
        return self.after_us > self.before_us * (1 + SLOWER_TOLERANCE)

    @property
    def moved_here(self) -> bool:
        """A rewritten site with nothing at its location in the original: its collective
        was moved here by another pass (overlap-sequence-parallel carries an
        all_reduce's all_gather to the next dot), so what it saves shows at the site it
        came from, and its own before/after is no verdict."""
        return (self.applied and not self.original_collectives
                and self.before_us == 0.0 and self.original_exposed_us == 0.0)

    @property
    def slower(self) -> bool:
        """Rewritten and predicted slower than the original."""
        return self.applied and self.got_slower and not self.moved_here

    def why_slower(self) -> str:
        """The compute categories that grew, largest first, and exposed communication."""
        grew = sorted(((after - before, name) for name, (before, after)
                       in self.compute_breakdown.items() if after > before), reverse=True)
        parts = [f"{name} +{extra:.1f} us" for extra, name in grew if extra >= 0.05]
        waited = self.exposed_us - self.original_exposed_us
        if waited > 0:
            parts.append(f"exposed communication +{waited:.1f} us")
        return ", ".join(parts)


SLOWER_TOLERANCE = 0.005   # a site within 0.5% of the original is not called slower

# When the slice's profile decides (no threshold-mib, no form given), the report compiles
# these option sets and keeps the module whose schedule is predicted fastest, or the
# original when none is faster: the cost model prices sites one at a time, the compiled
# schedule sees what they do to each other (a weight no longer prefetched into fast
# memory beside a ring). The first is the cost model's own choice: its sites' records
# say what was decided when the original is kept. The last two build the summing rings
# the TPU forms otherwise leave unchanged (FSDP), in their two layouts (the own shard
# first or last: neither is faster everywhere); TPU only, and a module without one is
# the second, compiled once.
CANDIDATES = {"per site": {},
              "every site, two streams": {"threshold_mib": 0, "bidirectional": True},
              "every site, one stream": {"threshold_mib": 0, "bidirectional": False},
              "every site, two streams, summing rings": {
                  "threshold_mib": 0, "bidirectional": True, "tpu_summing_rings": True},
              "every site, two streams, summing rings, own shard last": {
                  "threshold_mib": 0, "bidirectional": True, "tpu_summing_rings": True,
                  "own_shard_last": True}}
ORIGINAL = "the original"
# A sixth candidate, built when the five disagree on which is fastest for different
# passes: each ring pass with the options of the candidate whose sites of that pass
# took least time in the compiled schedules, or left unchanged where the original's
# sites took less (a gather ring in two streams beside the original scatter, say).
PER_PASS = "each pass its fastest form"
UNCHANGED_MIB = 1e30   # the threshold that leaves a pass's sites unchanged there
KEPT = "slower in the compiled schedule"    # the kind of a site the check left unchanged


def profile_decides(options: dict) -> bool:
    """Whether the cost model decides each site and its form (tpu_options given)."""
    return options.get("threshold_mib") is None and options.get("bidirectional") is None


@dataclass
class Report:
    topology: str
    hardware: str
    clock_ghz: float
    options: dict
    sites: list[SiteRow]
    original: Analysis
    rewritten: Analysis
    original_temp_bytes: int
    rewritten_temp_bytes: int
    module: ir.Module | None = None     # the rewritten module, as compiled
    chosen: str = ""                    # the candidate kept, when the schedule chose
    candidates: dict[str, float] = field(default_factory=dict)   # name -> predicted us
    platform: str = "TPU"
    times: str = ""     # where compute times come from (default: the compiler's cycles)
    requested: str = ""   # the accelerator type the slice was named by ("v5e-8"), if any

    @property
    def where(self) -> str:
        """The topology as the report names it: "v5e-8 (v5e:2x4)" when asked by type."""
        return f"{self.requested} ({self.topology})" if self.requested else self.topology

    @property
    def original_us(self) -> float:
        return self.original.total_us

    @property
    def rewritten_us(self) -> float:
        return self.rewritten.total_us

    @property
    def compute_bound_us(self) -> float:
        return min(self.original.compute_us, self.rewritten.compute_us)

    @property
    def permutes(self) -> int:
        return len(self.rewritten.permutes)

    @property
    def overlapped(self) -> int:
        return sum(p.overlapped for p in self.rewritten.permutes)

    @property
    def synchronous(self) -> int:
        return sum(p.synchronous for p in self.rewritten.permutes)

    @property
    def times_from(self) -> str:
        return self.times or f"compiler cycles at {self.clock_ghz:g} GHz"

    def to_json(self) -> dict:
        return {
            "topology": self.topology, "requested": self.requested or None,
            "hardware": self.hardware,
            "clock_ghz": self.clock_ghz, "options": self.options,
            "sites": [dict(asdict(row), speedup=row.speedup, slower=row.slower,
                           moved_here=row.moved_here)
                      for row in self.sites],
            "original_us": self.original_us, "rewritten_us": self.rewritten_us,
            "compute_bound_us": self.compute_bound_us, "speedup": self.speedup,
            "sites_slower": [row.location for row in self.sites if row.slower],
            "original_compute_us": self.original.compute_us,
            "rewritten_compute_us": self.rewritten.compute_us,
            "original_exposed_us": self.original.exposed_us,
            "rewritten_exposed_us": self.rewritten.exposed_us,
            "permutes": self.permutes, "overlapped": self.overlapped,
            "synchronous": self.synchronous, "platform": self.platform,
            "times": self.times_from,
            "collectives_left": [
                {"name": c.name, "opcode": c.opcode, "location": c.location}
                for c in self.rewritten.collectives],
            "loops": [asdict(loop) for loop in self.rewritten.loops],
            "loop_copies": [asdict(c) for c in self.rewritten.loop_copies],
            "original_temp_bytes": self.original_temp_bytes,
            "rewritten_temp_bytes": self.rewritten_temp_bytes,
            "chosen": self.chosen, "candidates": self.candidates,
            "outside_sites": self.outside,
            "original_matmul_us": self.original.matmul_us,
            "rewritten_matmul_us": self.rewritten.matmul_us,
            "model_problems": self.model_problems(),
        }

    @property
    def speedup(self) -> float:
        return self.original_us / self.rewritten_us if self.rewritten_us else 1.0

    @property
    def outside(self) -> dict[str, list[float]]:
        """What no site's row holds, before and after: the totals less the rows' sums
        (exposed communication, compute, time), so that rows and this add up to the
        module."""
        def rest(total: float, parts) -> float:
            left = total - sum(parts)
            return 0.0 if abs(left) < 0.05 else left   # rounding: no "-0.0"

        rows = self.sites
        return {
            "exposed_us": [rest(self.original.exposed_us, (r.original_exposed_us for r in rows)),
                           rest(self.rewritten.exposed_us, (r.exposed_us for r in rows))],
            "compute_us": [rest(self.original.compute_us, (r.original_compute_us for r in rows)),
                           rest(self.rewritten.compute_us,
                                (r.rewritten_compute_us for r in rows))],
            "us": [rest(self.original_us, (r.before_us for r in rows)),
                   rest(self.rewritten_us, (r.after_us for r in rows))],
        }

    @property
    def kept(self) -> str:
        """What the module the report kept is, by what was chosen: "rewritten" (with
        the candidate the compiled schedule chose, if one did), or the original and why
        (the schedule found no faster candidate, or no site was rewritten)."""
        if self.chosen == ORIGINAL:
            return "the original, kept (no rewritten candidate was faster)"
        if not any(row.applied for row in self.sites):
            return "the original, kept (no site rewritten)"
        return f"rewritten ({self.chosen})" if self.chosen else "rewritten"

    def timeline_panels(self) -> dict[str, Analysis]:
        """The modelled schedules to draw, labelled by what was chosen: the original,
        then the module kept (`kept`)."""
        return {"original": self.original, self.kept: self.rewritten}

    def format(self) -> str:
        headers = ["location", "pass", "permutes overlapped", "exposed us", "compute us",
                   "before us", "after us", "speedup", "left"]
        rows = []
        for row in self.sites:
            rows.append([row.location, row.pattern.removeprefix("overlap-"),
                         f"{row.overlapped}/{row.permutes}"
                         + (f", {row.synchronous} sync" if row.synchronous else ""),
                         f"{row.original_exposed_us:.1f} -> {row.exposed_us:.1f}",
                         f"{row.original_compute_us:.1f} -> {row.rewritten_compute_us:.1f}",
                         f"{row.before_us:.1f}", f"{row.after_us:.1f}",
                         "moved here" if row.moved_here else
                         f"{row.speedup:.2f}x" + (" SLOWER" if row.slower else ""),
                         ", ".join(row.collectives_left) or "-"])
        out = self.outside
        rows.append(["outside the sites", "", "-",
                     f"{out['exposed_us'][0]:.1f} -> {out['exposed_us'][1]:.1f}",
                     f"{out['compute_us'][0]:.1f} -> {out['compute_us'][1]:.1f}",
                     f"{out['us'][0]:.1f}", f"{out['us'][1]:.1f}", "", "-"])
        rows.append(["total", "", f"{self.overlapped}/{self.permutes}"
                     + (f", {self.synchronous} sync" if self.synchronous else ""),
                     f"{self.original.exposed_us:.1f} -> {self.rewritten.exposed_us:.1f}",
                     f"{self.original.compute_us:.1f} -> {self.rewritten.compute_us:.1f}",
                     f"{self.original_us:.1f}", f"{self.rewritten_us:.1f}",
                     f"{self.speedup:.2f}x", f"{len(self.rewritten.collectives)}"])
        widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
        lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
                 for r in [headers, *rows]]
        for row in self.sites:
            if row.slower:
                lines.append(f"{row.location}: predicted slower ({row.before_us:.1f} -> "
                             f"{row.after_us:.1f} us): {row.why_slower() or 'see --json'}")
            if row.moved_here:
                lines.append(f"{row.location}: an all_gather moved here (from the "
                             "all_reduce before it, by overlap-sequence-parallel), now a "
                             "ring; its time counts in the module's total")
        mib = 2 ** 20
        lines.append(f"{self.platform} temporaries: {self.original_temp_bytes / mib:.1f} MiB -> "
                     f"{self.rewritten_temp_bytes / mib:.1f} MiB; "
                     f"{len(self.rewritten.loop_copies)} loop-carried copies in loop bodies"
                     + (" (a buffer shifted an odd number of times per iteration is "
                        "copied; with --unroll=2 it alternates between two)"
                        if self.rewritten.loop_copies else "")
                     + "; "
                     f"{self.where} ({self.hardware} links, {self.times_from})")
        if self.chosen:
            tried = ", ".join(f"{name} {us:.1f} us" for name, us in self.candidates.items())
            lines.append(f"chosen by the compiled schedule: {self.chosen} (candidates: "
                         f"{tried}; the original {self.original_us:.1f} us)")
        lines += [f"warning: {problem}" for problem in self.model_problems()]
        unknown = [loop.name for a in (self.original, self.rewritten) for loop in a.loops
                   if loop.trip_count is None]
        if unknown:
            lines.append(f"warning: trip count not recognised for {', '.join(unknown)}: "
                         "each counted once")
        lines.append(self.verdict())
        return "\n".join(lines) + "\n"

    def model_problems(self) -> list[str]:
        """Where the model disagrees with itself: a module whose compute is below the sum
        of its matmuls' estimates left a matmul out (as it did of libtpu's async
        collective fusions)."""
        return [f"the {name} module's modelled compute ({a.compute_us:.1f} us) is below its "
                f"matmuls' ({a.matmul_us:.1f} us): an instruction was priced as something "
                "else" for name, a in (("original", self.original), ("rewritten", self.rewritten))
                if a.compute_us < a.matmul_us * (1 - 1e-9)]

    def verdict(self) -> str:
        """One line: the predicted speedup of the whole module and the sites slower."""
        slower = [row for row in self.sites if row.slower]
        change = ("faster" if self.rewritten_us < self.original_us * (1 - SLOWER_TOLERANCE)
                  else "slower" if self.rewritten_us > self.original_us * (1 + SLOWER_TOLERANCE)
                  else "no faster")
        text = (f"verdict: predicted {change}, {self.original_us:.1f} us -> "
                f"{self.rewritten_us:.1f} us ({self.speedup:.2f}x) on {self.where}")
        text += (f"; {len(slower)} of {len(self.sites)} rewritten site(s) predicted slower"
                 if slower else "; no rewritten site predicted slower")
        left = [row for row in self.sites if not row.applied]
        if left:
            why = ", ".join(dict.fromkeys(row.left_because for row in left if row.left_because))
            text += (f"; {len(left)} of {len(self.sites)} site(s) left unchanged"
                     + (f" ({why})" if why else ""))
        moved = [row for row in left if row.got_slower]
        if moved:
            text += (f"; {len(moved)} site(s) left unchanged got slower around the rewritten "
                     f"ones ({', '.join(row.why_slower() or row.location for row in moved)})")
        return text + " (a model of the compiled schedule, not a measurement)"


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


@dataclass
class _Candidate:
    module: ir.Module
    sites: list
    analysis: Analysis


def build_variants(source, topology: str | tpu.Topology | gpu.Target, variants: dict[str, dict],
                   pipeline: str = DEFAULT_PIPELINE, *, input_name: str | None = None,
                   timeline: bool = False,
                   trip_counts: schedule.TripCounts = schedule.trip_count) -> dict[str, Report]:
    """One report per option set in `variants` (name -> options), the original
    compiled once and each distinct rewritten module once."""
    topo = tpu.topology(topology) if isinstance(topology, str) else topology
    kind = _Kind.of(topo)
    timing = kind.timing
    original_compiled = kind.compile(aot.as_module(source))
    original = analyze_compiled(original_compiled, timing, timeline, trip_counts)
    analyses = {api.serialize(original_compiled.module, bytecode=True): original}

    def rewritten(options: dict, text: str = pipeline) -> _Candidate:
        # The sites' estimates are on the slice's profile also when a threshold decides.
        module, sites = aot.rewrite(
            original_compiled.module, text, input_name=input_name,
            **dict(options, hardware=options.get("hardware") or topo.hardware.name))
        key = api.serialize(module, bytecode=True)
        if key not in analyses:
            analyses[key] = analyze_compiled(kind.compile_rewritten(module), timing,
                                             timeline, trip_counts)
        return _Candidate(module, sites, analyses[key])

    reports = {}
    for name, options in variants.items():
        options = kind.options(options)
        chosen, candidates = "", {}
        if profile_decides(options):
            tried = {label: rewritten(dict(options, **extra))
                     for label, extra in CANDIDATES.items()
                     if kind.platform == "TPU" or "tpu_summing_rings" not in extra}
            per_pass = _per_pass(pipeline, tried, original, input_name)
            mixed = None if per_pass is None else rewritten(options, per_pass.pipeline)
            # A pass left unchanged whose sites another pass built (a dot between a
            # gather and a scatter is the gather pass's): not what was measured.
            if mixed is not None and not any(site.applied and site.pattern in
                                             per_pass.unchanged for site in mixed.sites):
                tried[PER_PASS] = replace(mixed, sites=[_left_by_pass(site, per_pass)
                                                        for site in mixed.sites])
            candidates = {label: c.analysis.total_us for label, c in tried.items()}
            chosen = _fastest(tried, candidates)
            result = tried[chosen]
            if result.analysis.total_us >= original.total_us * (1 - SLOWER_TOLERANCE):
                chosen = ORIGINAL
                result = _Candidate(original_compiled.module,
                                    [_kept(site, min(candidates.values()), original.total_us)
                                     for site in next(iter(tried.values())).sites],
                                    original)
        else:
            result = rewritten(options)
        by_location: dict[str, list] = {}
        for site in result.sites:
            by_location.setdefault(site.location, []).append(site)
        rows = [_row(location, group, original, result.analysis, input_name)
                for location, group in by_location.items()]
        reports[name] = Report(topo.name, timing.hardware.name, timing.clock_ghz,
                               options, rows, original, result.analysis,
                               original.temp_bytes, result.analysis.temp_bytes,
                               result.module, chosen, candidates, kind.platform, kind.times,
                               getattr(topo, "requested", ""))
    return reports


@dataclass(frozen=True)
class _PerPass:
    """The pipeline of the PER_PASS candidate, and the passes it leaves unchanged, each
    with its sites' time in the original and in the fastest of the forms."""

    pipeline: str
    unchanged: dict[str, tuple[float, float]]   # pass -> (original us, fastest form us)


def _fastest(tried: dict[str, _Candidate], times: dict[str, float]) -> str:
    """The candidate predicted fastest; of those within SLOWER_TOLERANCE of it, the one
    with the fewest temporaries (one stream where two streams gain nothing)."""
    best = min(times.values())
    close = [label for label in tried if times[label] <= best * (1 + SLOWER_TOLERANCE)]
    return min(close, key=lambda label: (tried[label].analysis.temp_bytes, times[label]))


def _per_pass(pipeline: str, tried: dict[str, _Candidate], original: Analysis,
              input_name: str | None) -> _PerPass | None:
    """`pipeline` with each ring pass given the options of the candidate whose sites of
    that pass took least time in their compiled schedules (a tie: the first listed),
    or left unchanged where the original's sites of that pass took less than every
    form's; None when one candidate (or the original) is fastest for every pass, or
    when the pipeline nests anchors or gives a ring pass options of its own."""
    # pass -> candidate (the original last) -> location -> that site's time
    sites: dict[str, dict[str, dict[str, float]]] = {}
    first: dict[int, str] = {}                  # one label per distinct module
    for label, candidate in tried.items():
        if first.setdefault(id(candidate.analysis), label) != label:
            continue
        by_location: dict[str, list] = {}
        for site in candidate.sites:
            by_location.setdefault(site.location, []).append(site)
        for location, group in by_location.items():
            row = _row(location, group, original, candidate.analysis, input_name)
            per = sites.setdefault(row.pattern, {})
            per.setdefault(label, {})[location] = row.after_us
            per.setdefault(ORIGINAL, {})[location] = row.before_us
    times: dict[str, dict[str, float]] = {}
    for name, per in sites.items():
        per[ORIGINAL] = per.pop(ORIGINAL)       # last: chosen only when faster
        if len({frozenset(at) for at in per.values()}) != 1 or len(per) != len(first) + 1:
            return None     # the candidates' pipelines met different sites of this pass
        times[name] = {label: sum(at.values()) for label, at in per.items()}
    best = {name: min(per, key=per.get) for name, per in times.items()}
    if len(set(best.values())) < 2:
        return None
    elements, passes = parse_pipeline(pipeline), registered_passes()
    if any(e.nested is not None or (e.name in best and e.options) for e in elements):
        return None
    parts, unchanged = [], {}
    for element in elements:
        choice = best.get(element.name)
        known = passes[element.name].options() if element.name in passes else {}
        if choice == ORIGINAL:
            per = times[element.name]
            unchanged[element.name] = (per[ORIGINAL], min(v for k, v in per.items()
                                                         if k != ORIGINAL))
            extra = {"threshold-mib": str(UNCHANGED_MIB)}
        else:
            extra = api.pass_defaults(CANDIDATES.get(choice, {}))
        text = " ".join(f"{k}={v}" for k, v in extra.items() if k in known)
        parts.append(f"{element.name}{{{text}}}" if text else element.text)
    return _PerPass(f"builtin.module({','.join(parts)})", unchanged)


def _left_by_pass(site, per_pass: _PerPass):
    """A site of a pass the PER_PASS candidate leaves unchanged, saying why."""
    if site.pattern not in per_pass.unchanged:
        return site
    before, after = per_pass.unchanged[site.pattern]
    return replace(site, applied=False, kind=KEPT, rule="",
                   reason=f"{KEPT}: every form of this pass's sites is slower than the "
                          f"original ({after:.1f} us against {before:.1f} us)")


def _kept(site, best_us: float, original_us: float):
    """A rewritten site of a module the check did not keep, as left unchanged."""
    if not site.applied:
        return site
    return replace(site, applied=False, kind=KEPT, rule="",
                   reason=f"{KEPT}: no candidate is faster than the original "
                          f"({best_us:.1f} us against {original_us:.1f} us)")


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


def _at(hlo_location: str, where: Where, input_name: str | None) -> bool:
    """Whether an HLO location ("file:line:col"; HLO metadata spells the parsed input
    "-" or "") is the source position `where` of a site or a dot."""
    return where.line is not None and Where.parse(hlo_location, input_name) == where


def _where(instr) -> str:
    return instr.location.format() if instr.location else ""


@dataclass(frozen=True)
class _SiteTime:
    time_us: float
    compute_us: float
    exposed_us: float
    collectives: tuple
    compute_by_category: dict


def _site_time(analysis: Analysis, location: str, at_a_dot: Callable[[str], bool],
               also: tuple = ()) -> _SiteTime:
    """The site's time in one compiled module: its collectives' and permutes' waits,
    the compute at its location, the matmuls beside its collectives and the
    instructions named in `also` (copies the compiler put in its loops, which carry no
    location). A collective without a location belongs to the site when a matmul
    beside it sits at one of the site's dots (`at_a_dot` of its HLO location)."""
    collectives = [c for c in analysis.collectives if c.location == location or (
        not c.location and any(at_a_dot(_where(m)) for m in analysis.matmuls_beside(c)))]
    exposed = (sum(c.exposed_us for c in collectives)
               + sum(p.exposed_us for p in analysis.permutes_at(location)))
    names = set(analysis.names_by_location.get(location, ())) | set(also)
    names |= {dot.name for collective in collectives
              for dot in analysis.matmuls_beside(collective)}
    compute = sum(analysis.compute_by_name.get(name, 0.0) for name in names)
    return _SiteTime(compute + exposed, compute, exposed, tuple(collectives),
                     analysis.compute_by_category(names))


def _row(location, sites, original, rewritten, input_name) -> SiteRow:
    """One site's row; `sites` are its records (one per pass run that met it), which
    name its dots and carry the analytic model's estimates."""
    where = sites[0].where
    dots = {dot for site in sites for dot in site.dots}
    spellings = {loc for analysis in (rewritten, original)
                 for loc in (*analysis.names_by_location,
                             *(p.location for p in analysis.permutes),
                             *(c.location for c in analysis.collectives))}
    hlo_location = next((loc for loc in sorted(spellings) if _at(loc, where, input_name)),
                        location)

    def at_a_dot(hlo: str) -> bool:
        return any(_at(hlo, dot, input_name) for dot in dots)

    permutes = rewritten.permutes_at(hlo_location)
    loops = [loop for loop in rewritten.loops if loop.location == hlo_location]
    copies = [c for c in rewritten.loop_copies
              if any(loop.body == c.body for loop in loops)]
    before = _site_time(original, hlo_location, at_a_dot)
    after = _site_time(rewritten, hlo_location, at_a_dot,
                       also=tuple(c.name for c in copies if c.location != hlo_location))
    breakdown = {name: [before.compute_by_category.get(name, 0.0),
                        after.compute_by_category.get(name, 0.0)]
                 for name in schedule.CATEGORIES
                 if name in before.compute_by_category or name in after.compute_by_category}
    estimates = [site.estimate for site in sites if site.estimate is not None]
    return SiteRow(
        location=location, pattern=sites[0].pattern, applied=all(s.applied for s in sites),
        left_because=", ".join(dict.fromkeys(s.kind or s.reason for s in sites
                                             if not s.applied)),
        sites=len(sites), permutes=len(permutes),
        overlapped=sum(p.overlapped for p in permutes),
        synchronous=sum(p.synchronous for p in permutes),
        permute_executions=sum(p.executions for p in permutes),
        exposed_us=after.exposed_us, original_exposed_us=before.exposed_us,
        before_us=before.time_us, after_us=after.time_us,
        compute_bound_us=min(before.compute_us, after.compute_us),
        original_compute_us=before.compute_us, rewritten_compute_us=after.compute_us,
        compute_breakdown=breakdown,
        collectives_left=[c.opcode for c in after.collectives],
        original_collectives=[c.opcode for c in before.collectives],
        trip_counts=[loop.trip_count for loop in loops],
        loop_copies=len(copies), loop_copy_bytes=sum(c.bytes for c in copies),
        model_before_us=sum(e.before_us for e in estimates) if estimates else None,
        model_after_us=sum(e.after_us for e in estimates) if estimates else None,
        permute_details=[{"name": p.name, "computation": p.computation, "bytes": p.bytes,
                          "transfer_us": p.transfer_us, "window": list(p.window),
                          "window_cycles": p.window_cycles, "overlapped": p.overlapped,
                          "lane": p.lane, "executions": p.executions,
                          "exposed_us": p.exposed_us}
                         for p in permutes])

"""Calibrate the tpu-* profiles' compute-side figures on the TPU compiler's own estimates.

    python benchmarks/calibrate.py [--write] [--samples PATH] [--chips v5e,v6e]

Compiles the GPT layers of benchmarks/tpu.py (mlp, swiglu, qkv, fsdp; bf16) ahead of
time for v4:2x2x1, v5e:2x4, v5p:2x2x2 and v6e:2x4 through libtpu, original and
rewritten (default options and --bidirectional), and reads every site's
schedule-based time before and after (overlap_hlo.targets.report: the compiler's
estimated_cycles for compute, the profile's link figures for transfers). The
analytic model (overlap_hlo.plan.cost) is then fitted to those figures per chip: its
compute-side figures matmul_efficiency, step_overhead_us, step_us_per_mib and
loop_overhead_us, by least squares on the relative error of both predictions of
every site (a scan over the efficiency; for each, the overheads, linear in the
prediction, solved and kept >= 0). Peaks, link bandwidth, latency and link
efficiency stay datasheet figures: the schedule model times transfers from them
too, so nothing here could calibrate them.

The fitting set is the paper's dims, a quarter of their tokens and the quick dims
(d_model 512); the held-out set is two sizes between them (4096 tokens, d_model 2048;
2048 tokens, d_model 1024).
Printed per chip: median and largest |error| of the uncalibrated profile (its
guesses, cost.TPU_GUESSES) and of the calibrated one on both sets, on the paper's
dims alone, and with each layer left out of the fit it is checked on; then the
fitted figures.
--write stores the figures in benchmarks/results/calibration.json, which
overlap_hlo/plan/cost.py's CALIBRATED must equal (tests/targets/test_calibration.py checks it);
--samples PATH saves the compiled figures (or reads them back if PATH exists, to
refit without compiling).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from overlap_hlo.plan import cost  # noqa: E402
from overlap_hlo.plan.ring_plan import RingPlan  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "calibration.json")
SLICES = {"tpu-v4": "v4:2x2x1", "tpu-v5e": "v5e:2x4", "tpu-v5p": "v5p:2x2x2",
          "tpu-v6e": "v6e:2x4"}
VARIANTS = {"default": {"threshold_mib": 0},
            "bidirectional": {"threshold_mib": 0, "bidirectional": True}}
OVERHEADS = ("step_overhead_us", "step_us_per_mib", "loop_overhead_us")
FITTED = ("matmul_efficiency", *OVERHEADS)
EFFICIENCIES = np.linspace(0.05, 1.0, 191)   # the scan; refined around its best point
# (batch, seq, d_model, hidden) of benchmarks/tpu.py's Dims: the paper's, a quarter of
# its tokens, the quick dims; held out: two sizes between them.
PAPER = (2, 4096, 4096, 16384)
FIT_DIMS = [PAPER, (1, 2048, 4096, 16384), (1, 1024, 512, 2048)]
HELD_OUT_DIMS = [(1, 4096, 2048, 8192), (1, 2048, 1024, 4096)]


@dataclass(frozen=True)
class Sample:
    """One site of one compiled layer: what the model is given and what the schedule says."""

    profile: str
    layer: str
    dims: str          # "fit" or "held-out"
    variant: str
    pattern: str
    shapes: tuple      # cost.SiteShape per remark at the site's location
    schedule_before_us: float
    schedule_after_us: float
    size: tuple = ()   # (batch, seq, d_model, hidden)

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["shapes"] = [shape_to_json(s) for s in self.shapes]
        return data

    @classmethod
    def from_json(cls, data: dict) -> Sample:
        shapes = tuple(shape_from_json(s) for s in data["shapes"])
        return cls(**{**data, "shapes": shapes, "size": tuple(data.get("size", ()))})


def shape_to_json(shape: cost.SiteShape) -> dict:
    """Every field of `shape` (its plan's init fields); ValueError for a shape its pass
    prices itself (`priced_by`: a method of the pass, not data)."""
    if shape.priced_by is not None:
        raise ValueError("a site its pass prices itself (priced_by) cannot be saved")
    data = {f.name: getattr(shape, f.name) for f in dataclasses.fields(cost.SiteShape)
            if f.name not in ("plan", "priced_by")}
    data["plan"] = {f.name: getattr(shape.plan, f.name)
                    for f in dataclasses.fields(RingPlan) if f.init}
    return data


def shape_from_json(data: dict) -> cost.SiteShape:
    """`shape_to_json`'s inverse; a field the file lacks (saved by an older version)
    takes its default."""
    known = {f.name for f in dataclasses.fields(RingPlan) if f.init}
    plan = RingPlan(**{k: v for k, v in data["plan"].items() if k in known})
    fields = {f.name for f in dataclasses.fields(cost.SiteShape)} - {"plan", "priced_by"}
    return cost.SiteShape(plan=plan, **{k: v for k, v in data.items() if k in fields})


def predict(sample: Sample, hw: cost.Hardware) -> tuple[float, float]:
    """The model's (before, after) for the site on `hw`."""
    estimates = [cost.estimate(shape, hw) for shape in sample.shapes]
    return sum(e.before_us for e in estimates), sum(e.after_us for e in estimates)


def errors(samples: list[Sample], hw: cost.Hardware) -> np.ndarray:
    """Relative errors model / schedule - 1, before and after of every site."""
    found = []
    for s in samples:
        before, after = predict(s, hw)
        found += [before / s.schedule_before_us - 1, after / s.schedule_after_us - 1]
    return np.array(found)


# --- the fit ---------------------------------------------------------------------------

def overhead_terms(sample: Sample) -> list[float]:
    """What each of OVERHEADS is multiplied by in the site's predicted after."""
    return [sum(sh.plan.rounds for sh in sample.shapes),
            sum(sh.plan.rounds * sh.block_bytes / 2**20 for sh in sample.shapes),
            sum(sh.plan.trip_count for sh in sample.shapes)]


def fit(samples: list[Sample], base: cost.Hardware) -> cost.Hardware:
    """`base` with the FITTED figures that minimise the squared relative errors."""
    terms = np.array([overhead_terms(s) for s in samples], float)
    before = np.array([s.schedule_before_us for s in samples])
    after = np.array([s.schedule_after_us for s in samples])

    def solve(efficiency: float) -> tuple[float, np.ndarray]:
        """(loss, overheads) at `efficiency`, the overheads solved for."""
        bare = dataclasses.replace(base, matmul_efficiency=float(efficiency),
                                   **{name: 0.0 for name in OVERHEADS})
        predicted = np.array([predict(s, bare) for s in samples])
        loss_before = np.sum((predicted[:, 0] / before - 1) ** 2)
        # after = A + terms . overheads: linear in the overheads
        columns = terms / after[:, None]
        target = 1 - predicted[:, 1] / after
        residual, overheads = _nonnegative_lstsq(columns, target)
        return loss_before + residual, overheads

    def loss(efficiency: float) -> float:
        return solve(efficiency)[0]

    losses = [loss(e) for e in EFFICIENCIES]
    i = int(np.argmin(losses))
    low, high = EFFICIENCIES[max(i - 1, 0)], EFFICIENCIES[min(i + 1, len(EFFICIENCIES) - 1)]
    ratio = (5 ** 0.5 - 1) / 2   # golden-section search between the scan's neighbours
    for _ in range(40):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if loss(a) < loss(b):
            high = b
        else:
            low = a
    efficiency = (low + high) / 2
    overheads = solve(efficiency)[1]
    return dataclasses.replace(base, matmul_efficiency=float(efficiency),
                               **{name: float(x) for name, x in zip(OVERHEADS, overheads)})


def _nonnegative_lstsq(columns: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
    """(squared residual, x >= 0) minimising |columns x - target|: every subset of
    free unknowns (the others 0), the best solution with none negative."""
    width = columns.shape[1]
    best = (float(np.sum(target ** 2)), np.zeros(width))
    for mask in range(1, 2 ** width):
        free = [i for i in range(width) if mask >> i & 1]
        x = np.zeros(width)
        x[free] = np.linalg.lstsq(columns[:, free], target, rcond=None)[0]
        if np.all(x >= 0):
            residual = float(np.sum((columns @ x - target) ** 2))
            if residual < best[0]:
                best = (residual, x)
    return best


def rounded(hw: cost.Hardware) -> dict:
    """The fitted figures as they go into cost.py."""
    return {"matmul_efficiency": round(hw.matmul_efficiency, 3),
            **{name: round(getattr(hw, name), 2) for name in OVERHEADS}}


def datasheet(profile: str) -> cost.Hardware:
    """The profile with its uncalibrated compute-side guesses."""
    return dataclasses.replace(cost.PROFILES[profile], **cost.TPU_GUESSES)


# --- compiling the calibration shapes ----------------------------------------------

def collect(profiles: list[str], layers: list[str], sets: list | None = None) -> list[Sample]:
    """Compile every layer on every chip's slice and read its sites; `sets` is
    [(name, (batch, seq, d_model, hidden))], by default FIT_DIMS and HELD_OUT_DIMS."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.sharding import Mesh

    from benchmarks import tpu as bench
    from overlap_hlo import api
    from overlap_hlo.targets import report, tpu

    assert bench.Dims(*PAPER) == bench.PAPER
    if sets is None:
        sets = ([("fit", dims) for dims in FIT_DIMS]
                + [("held-out", dims) for dims in HELD_OUT_DIMS])
    samples = []
    for profile in profiles:
        topo = tpu.topology(SLICES[profile])
        mesh = Mesh(np.array(topo.devices).reshape(1, topo.device_count), ("dp", "tp"))
        for which, sizes in sets:
            dims = bench.Dims(*sizes)
            for layer in layers:
                started = time.perf_counter()
                lowered, _ = bench.lowerings(layer, dims, mesh)
                module = tpu.as_module(lowered)
                reports = report.build_variants(module, topo, VARIANTS)
                for variant, rep in reports.items():
                    # The report's options: the slice's links and the TPU forms.
                    options = tpu.tpu_options(dict(VARIANTS[variant]), topo)
                    options.setdefault("hardware", profile)
                    remarks = api.remarks(module, **options)
                    for row in rep.sites:
                        estimates = [r.estimate for r in remarks
                                     if r.location == row.location and r.estimate]
                        if (not estimates) != (row.model_before_us is None):
                            raise AssertionError(f"{layer} {row.location}: remarks and "
                                                 "report disagree on the model's figures")
                        if not estimates or not row.before_us or not row.after_us \
                                or not row.applied:   # a site the TPU forms leave
                            continue
                        sample = Sample(profile, layer, which, variant, row.pattern,
                                        tuple(e.shape for e in estimates),
                                        row.before_us, row.after_us, tuple(sizes))
                        check_round_trip(sample, topo.hardware, row)
                        samples.append(sample)
                print(f"  {profile} {which:8s} {dims.batch}x{dims.seq} d{dims.model} "
                      f"{layer:6s} {time.perf_counter() - started:5.1f} s", flush=True)
    return samples


def check_round_trip(sample: Sample, hw: cost.Hardware, row) -> None:
    """The shapes give the report's own model figures."""
    before, after = predict(sample, hw)
    if not (np.isclose(before, row.model_before_us, rtol=1e-6)
            and np.isclose(after, row.model_after_us, rtol=1e-6)):
        raise AssertionError(f"{sample.layer} {row.location}: model {before}, {after} != "
                             f"report {row.model_before_us}, {row.model_after_us}")


# --- reporting -------------------------------------------------------------------------

def summary(errs: np.ndarray) -> str:
    a = np.abs(errs)
    return f"{np.median(a):4.0%} / {a.max():4.0%}" if len(a) else "-"


def left_out_errors(samples: list[Sample], profile: str) -> np.ndarray:
    """Errors on each layer's fitting sites of the fit made without that layer."""
    chosen = [s for s in samples if s.profile == profile and s.dims == "fit"]
    found = []
    for layer in sorted({s.layer for s in chosen}):
        others = [s for s in chosen if s.layer != layer]
        if others:
            hw = fit(others, datasheet(profile))
            found.append(errors([s for s in chosen if s.layer == layer], hw))
    return np.concatenate(found) if found else np.array([])


def table(samples: list[Sample], fitted: dict[str, cost.Hardware]) -> str:
    lines = ["| chip | set | sites | datasheet median / max error | calibrated median / max "
             "error | matmul efficiency | step us | step us per MiB | loop us |",
             "|---|---|---|---|---|---|---|---|---|"]
    for profile, hw in fitted.items():
        for which in ("fit", "held-out"):
            chosen = [s for s in samples if s.profile == profile and s.dims == which]
            figures = rounded(hw)
            lines.append(
                f"| {profile} | {which} | {len(chosen)} | "
                f"{summary(errors(chosen, datasheet(profile)))} | "
                f"{summary(errors(chosen, hw))} | {figures['matmul_efficiency']} | "
                f"{figures['step_overhead_us']} | {figures['step_us_per_mib']} | "
                f"{figures['loop_overhead_us']} |")
        paper = [s for s in samples if s.profile == profile and s.size == PAPER]
        if paper:
            lines.append(f"| {profile} | the paper's dims (in the fit) | {len(paper)} | "
                         f"{summary(errors(paper, datasheet(profile)))} | "
                         f"{summary(errors(paper, hw))} | | | | |")
        chosen = [s for s in samples if s.profile == profile and s.dims == "fit"]
        lines.append(f"| {profile} | fit, each layer left out of its fit | {len(chosen)} | "
                     f"{summary(errors(chosen, datasheet(profile)))} | "
                     f"{summary(left_out_errors(samples, profile))} | | | | |")
    return "\n".join(lines)


def site_table(samples: list[Sample], fitted: dict[str, cost.Hardware]) -> str:
    lines = ["| chip | set | layer | variant | site | schedule before -> after us | "
             "datasheet model | calibrated model |", "|---|---|---|---|---|---|---|---|"]
    for s in samples:
        old, new = predict(s, datasheet(s.profile)), predict(s, fitted[s.profile])
        lines.append(
            f"| {s.profile} | {s.dims} | {s.layer} | {s.variant} | "
            f"{s.pattern.removeprefix('overlap-')} | {s.schedule_before_us:.0f} -> "
            f"{s.schedule_after_us:.0f} | {old[0]:.0f} -> {old[1]:.0f} "
            f"({old[0] / s.schedule_before_us - 1:+.0%}, {old[1] / s.schedule_after_us - 1:+.0%})"
            f" | {new[0]:.0f} -> {new[1]:.0f} ({new[0] / s.schedule_before_us - 1:+.0%}, "
            f"{new[1] / s.schedule_after_us - 1:+.0%}) |")
    return "\n".join(lines)


def versions() -> dict:
    from benchmarks import tpu as bench   # loads jax: only when the figures are written
    return bench.versions()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help=f"store the fitted figures in {os.path.relpath(RESULTS)}")
    parser.add_argument("--samples", metavar="PATH.json",
                        help="save the compiled figures here, or refit from them if it exists")
    parser.add_argument("--chips", default=",".join(p.removeprefix("tpu-") for p in SLICES))
    parser.add_argument("--layers", default="mlp,swiglu,qkv,fsdp")
    parser.add_argument("--sites", action="store_true", help="print every site")
    args = parser.parse_args(argv)
    profiles = [f"tpu-{c}" for c in args.chips.split(",")]
    started = time.perf_counter()
    if args.samples and os.path.exists(args.samples):
        with open(args.samples) as f:
            saved = json.load(f)
        info = saved["info"]
        samples = [Sample.from_json(s) for s in saved["samples"] if s["profile"] in profiles]
    else:
        info = {"versions": versions(),
                "date": datetime.date.today().isoformat()}
        print(f"jax {info['versions']['jax']}, libtpu {info['versions']['libtpu']}", flush=True)
        samples = collect(profiles, args.layers.split(","))
        if args.samples:
            with open(args.samples, "w") as f:
                json.dump({"info": info, "samples": [s.to_json() for s in samples]}, f,
                          indent=1)
    fitted = {p: fit([s for s in samples if s.profile == p and s.dims == "fit"],
                     datasheet(p)) for p in profiles}
    seconds = time.perf_counter() - started
    print(f"\nAnalytic model against the schedule-based figures (libtpu "
          f"{info['versions']['libtpu']} estimated_cycles, jax {info['versions']['jax']}), "
          "|model / schedule - 1| over the before and after of every site:\n")
    print(table(samples, fitted))
    if args.sites:
        print("\n" + site_table(samples, fitted))
    print(f"\n{seconds:.0f} s")
    if args.write:
        source = (f"calibrated on libtpu {info['versions']['libtpu']} estimated_cycles "
                  f"(benchmarks/calibrate.py, {info['date']})")
        data = {"source": source, "versions": info["versions"],
                "profiles": {p: rounded(hw) for p, hw in fitted.items()}}
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        print(f"wrote {RESULTS}; overlap_hlo/cost.py:\nCALIBRATION = {source!r}\n"
              f"CALIBRATED = {json.dumps(data['profiles'], indent=4)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

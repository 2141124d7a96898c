"""When decomposing pays: a per-site time model and hardware profiles.

For one site on a ring of N devices, with D the time of the site's dots whole, C_r the
time of round r's partial dots and T_m the time of one shift of one block:

    collective then dot:  ceil((N - 1) / L) * latency + (N - 1) * T_bL + D
    decomposed:           sum over rounds r of max(C_r, T_m if a shift is in flight)
                          (a reduce_scatter ring: max(C_r, T_m + C_r / chains), as
                          each chain sends the sum its dot has just made)
                          + rounds * step overhead + loop iterations * loop overhead

where the rounds, the blocks each multiplies, the shifts in flight in each and the
loop's iterations are the ring's plan (`ring_plan.RingPlan`, the schedule the pass
builds): one block per round with one stream, two with a bidirectional ring (whose two
shifts use both directions of the links, so a round still costs one T_m). A dot's time
is a roofline: FLOPs / (peak FLOP/s for the element type x matmul efficiency) or, when
longer, the bytes it moves in device memory at MEMORY_EFFICIENCY x the datasheet
bandwidth; each partial dot reads the weights whole, and each block's share of the
sliced operand and result once (over a free dim each block is a dot of its own; a
ring that sums multiplies a round's blocks side by side in one). A ring that also
assembles the gathered tensor for other readers reads and writes each block once more.
T_m = latency + bytes / (one-direction link bandwidth x
link efficiency); T_bL is a block's bytes over L link directions at once: the
library collective is given its best case, L = 2 (a bidirectional ring) or, where the
group is a whole sub-slice spanning several torus axes, the fewest links into any
member (`Links.collective_directions`: 3 on a 2x2x2 cube), in ceil((N-1)/L) steps that
each pay one latency (twice that on a chip whose compiler makes a reduce_scatter
over every device an all-reduce: `Hardware.all_reduce_whole_scatter`). The step overhead of a round is a fixed time plus a time
per MiB of the shifted block. A site is decomposed when the decomposed time beats the
original by `margin`. Every figure is a prediction, not a measurement: peaks, links
and memory are datasheet numbers; the tpu-* profiles' matmul efficiency and overheads
are fitted to the TPU compiler's own estimates (`CALIBRATED`, made by
benchmarks/calibrate.py), the other profiles' are guesses.
"""
from __future__ import annotations

import functools
import json
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from overlap_hlo.plan.ring_plan import SCATTER, RingPlan

MARGIN = 0.05
MEMORY_EFFICIENCY = 0.8     # of the datasheet device-memory bandwidth (an assumption)


@dataclass(frozen=True)
class Hardware:
    """Datasheet figures of one accelerator and its links."""

    name: str
    tflops: dict[str, float]     # peak dense matmul TFLOP/s by element type
    link_gbps: float             # GB/s one direction, to one ring neighbour
    latency_us: float            # per collective_permute
    step_overhead_us: float      # slicing and bookkeeping per ring round
    loop_overhead_us: float      # per while-loop iteration
    matmul_efficiency: float = 0.7
    link_efficiency: float = 0.8
    source: str = ""
    step_us_per_mib: float = 0.0  # per ring round and MiB of the block (its copies, adds)
    platform: str = ""            # "tpu", "gpu" or "cpu": the rewrite's forms for it
    hbm_gbps: float = 0.0         # device memory GB/s (0: memory traffic not priced)
    # The compiler runs a reduce-scatter over every device as an all-reduce (XLA's TPU
    # compiler on the 3-D torus chips, v4 and v5p; libtpu 0.0.50.1).
    all_reduce_whole_scatter: bool = False
    # A dot that adds to a sum reads and writes it beside its own time, not hidden
    # under its matmul (libtpu's estimates; GPU GEMMs take the sum as an epilogue).
    serial_sums: bool = False
    # The compiler copies an all-gather the program returns into the output buffer,
    # where an all-reduce writes it in place (libtpu 0.0.50.1 and 0.0.42.1).
    copies_returned_gathers: bool = False
    # Its price of a ring that sums over a contracting gathered dim was checked against
    # the compiler (benchmarks/RESULTS.md): the cost model then decides such rings
    # where the slice is known, unless told otherwise.
    decides_summing_rings: bool = False

    def matmul_us(self, flops: float, element_type: str) -> float:
        peak = self.tflops.get(element_type) or self.tflops.get("default") or min(self.tflops.values())
        return flops / (peak * 1e12 * self.matmul_efficiency) * 1e6

    def dot_us(self, flops: float, nbytes: float, element_type: str) -> float:
        """A dot's time on a roofline: its FLOPs or the bytes it reads and writes in
        device memory, whichever takes longer."""
        return max(self.matmul_us(flops, element_type), self.memory_us(nbytes))

    def memory_us(self, nbytes: float) -> float:
        """Moving `nbytes` through device memory (0 when the profile has no bandwidth)."""
        return nbytes / (self.hbm_gbps * 1e9 * MEMORY_EFFICIENCY) * 1e6 if self.hbm_gbps else 0.0

    def returned_gather_us(self, nbytes: float) -> float:
        """The copy of a returned all-gather of `nbytes` (`copies_returned_gathers`): read
        and written at half the streaming rate, as libtpu's estimates have it
        (benchmarks/RESULTS.md); priced even where libtpu makes no copy of a small one,
        so the decision errs towards leaving the site unchanged."""
        return self.memory_us(4 * nbytes) if self.copies_returned_gathers else 0.0

    def step_us(self, block_bytes: float) -> float:
        """The overhead of one ring round shifting blocks of `block_bytes`."""
        return self.step_overhead_us + self.step_us_per_mib * block_bytes / 2**20

    def shift_us(self, nbytes: float, directions: int = 1) -> float:
        """One step of a ring moving `nbytes` per device, over 1 or 2 link directions."""
        bandwidth = self.link_gbps * 1e9 * self.link_efficiency * directions
        return self.latency_us + nbytes / bandwidth * 1e6

    def collective_us(self, nbytes: float, n: int, directions: int = 2) -> float:
        """The library collective moving `nbytes` blocks among `n` devices, at its
        best: n-1 blocks into each device over `directions` link directions at once
        (2: a bidirectional ring; more where the group spans several torus axes,
        `Links.collective_directions`), in ceil((n-1)/directions) steps."""
        bandwidth = self.link_gbps * 1e9 * self.link_efficiency * directions
        return (math.ceil((n - 1) / directions) * self.latency_us
                + (n - 1) * nbytes / bandwidth * 1e6)

    @classmethod
    def from_file(cls, path: str) -> Hardware:
        """A profile from a JSON file with the fields of this class."""
        data = _read_json(path)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a hardware profile is a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{path}: unknown hardware fields {sorted(unknown)}")
        missing = {"name", "tflops", "link_gbps", "latency_us", "step_overhead_us",
                   "loop_overhead_us"} - set(data)
        if missing:
            raise ValueError(f"{path}: missing hardware fields {sorted(missing)}")
        profile = cls(**data)
        profile.validate(path)
        return profile

    def validate(self, where: str) -> None:
        """Every figure a number, rates and efficiencies positive (latency and overheads
        may be 0), none above MAX_FIGURE, and the rates they make (FLOP/s, bytes/s) at
        least 1, so that no predicted time divides by zero or overflows."""
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"{where}: 'name' must be a non-empty string")
        if not isinstance(self.source, str):
            raise ValueError(f"{where}: 'source' must be a string")
        if self.platform not in PLATFORMS:
            raise ValueError(f"{where}: 'platform' must be one of "
                             f"{', '.join(repr(p) for p in PLATFORMS)}")
        if (not isinstance(self.tflops, dict) or not self.tflops
                or not all(isinstance(k, str) and _number(v) and v > 0
                           for k, v in self.tflops.items())):
            raise ValueError(f"{where}: 'tflops' must map element types to positive numbers")
        figures = {f"tflops[{k}]": v for k, v in self.tflops.items()}
        for name in ("link_gbps", "matmul_efficiency", "link_efficiency"):
            if not _number(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{where}: '{name}' must be a positive number")
            figures[name] = getattr(self, name)
        for name in ("latency_us", "step_overhead_us", "loop_overhead_us", "step_us_per_mib",
                     "hbm_gbps"):
            if not _number(getattr(self, name)) or getattr(self, name) < 0:
                raise ValueError(f"{where}: '{name}' must be a number >= 0")
            figures[name] = getattr(self, name)
        for name in ("all_reduce_whole_scatter", "serial_sums", "copies_returned_gathers",
                     "decides_summing_rings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{where}: '{name}' must be true or false")
        for name, value in figures.items():
            if not _at_most(value, MAX_FIGURE):
                raise ValueError(f"{where}: '{name}' must be at most {MAX_FIGURE:g}")
        slowest = min(self.tflops.values()) * 1e12 * self.matmul_efficiency
        if not slowest >= 1:
            raise ValueError(f"{where}: 'tflops' x 'matmul_efficiency' gives "
                             f"{slowest:.3g} FLOP/s; at least 1 is needed")
        link = self.link_gbps * 1e9 * self.link_efficiency
        if not link >= 1:
            raise ValueError(f"{where}: 'link_gbps' x 'link_efficiency' gives "
                             f"{link:.3g} bytes/s; at least 1 is needed")


MAX_FIGURE = 1e12           # the largest number a profile may hold (no real figure is near)
MAX_PROFILE_BYTES = 1 << 20  # a profile is a few hundred bytes; 1 MiB at most


def _number(value) -> bool:
    """A JSON number (not a bool, not nan)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _at_most(value, limit: float) -> bool:
    try:
        return abs(float(value)) <= limit
    except OverflowError:   # an integer too large for a float
        return False


def _read_json(path: str):
    """The JSON value in `path`: a regular file of at most MAX_PROFILE_BYTES.

    Opened without blocking, so that a FIFO is refused instead of waiting for a writer.
    Every failure is a ValueError naming the file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        raise ValueError(f"{path}: cannot read: {err.strerror or err}") from None
    limit = f"larger than the {MAX_PROFILE_BYTES >> 20} MiB limit for a profile file"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path}: not a regular file")
        if info.st_size > MAX_PROFILE_BYTES:
            raise ValueError(f"{path}: {info.st_size} bytes, {limit}")
        raw = os.read(fd, MAX_PROFILE_BYTES + 1)
    except OSError as err:
        raise ValueError(f"{path}: cannot read: {err.strerror or err}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_PROFILE_BYTES:
        raise ValueError(f"{path}: {limit}")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not valid JSON: not UTF-8 text") from None
    except RecursionError:
        raise ValueError(f"{path}: not valid JSON: nested too deeply") from None
    except ValueError as err:   # JSONDecodeError, or an integer with too many digits
        raise ValueError(f"{path}: not valid JSON: {err}") from None


# What a profile's `platform` may be ("": any; the forms every backend runs).
PLATFORMS = ("", "cpu", "gpu", "tpu")
_GPU = dict(latency_us=10.0, step_overhead_us=3.0, loop_overhead_us=5.0, platform="gpu")
_TPU_LATENCY_US = 5.0
# The tpu-* profiles' compute-side figures before calibration (guesses, not datasheet).
TPU_GUESSES = dict(matmul_efficiency=0.7, step_overhead_us=1.0, step_us_per_mib=0.0,
                   loop_overhead_us=2.0)
# Fitted to the schedule of the TPU compiler's estimated_cycles by
# benchmarks/calibrate.py --write (benchmarks/results/calibration.json holds the same).
CALIBRATION = "calibrated on libtpu 0.0.50.1 estimated_cycles (benchmarks/calibrate.py, 2026-12-06)"
CALIBRATED = {
    "tpu-v4": {"matmul_efficiency": 0.41, "step_overhead_us": 1.23, "step_us_per_mib": 0.0,
             "loop_overhead_us": 1.25},
    "tpu-v5e": {"matmul_efficiency": 0.975, "step_overhead_us": 0.39, "step_us_per_mib": 0.0,
             "loop_overhead_us": 2.05},
    "tpu-v5p": {"matmul_efficiency": 0.864, "step_overhead_us": 3.34, "step_us_per_mib": 0.28,
             "loop_overhead_us": 0.0},
    "tpu-v6e": {"matmul_efficiency": 0.902, "step_overhead_us": 1.23, "step_us_per_mib": 0.0,
             "loop_overhead_us": 0.62},
}


def _tpu(name: str, tflops: dict, link_gbps: float, hbm_gbps: float,
         datasheet: str, torus_3d: bool = False, summing_checked: bool = True) -> Hardware:
    """A tpu-* profile: datasheet peaks, links and memory, calibrated compute-side figures."""
    return Hardware(name, tflops, link_gbps=link_gbps, latency_us=_TPU_LATENCY_US,
                    platform="tpu", hbm_gbps=hbm_gbps, **CALIBRATED[name],
                    all_reduce_whole_scatter=torus_3d, serial_sums=True,
                    copies_returned_gathers=True, decides_summing_rings=summing_checked,
                    source=f"{datasheet}; compute-side figures "
                    f"(matmul efficiency, overheads) {CALIBRATION}")


PROFILES: dict[str, Hardware] = {p.name: p for p in [
    _tpu("tpu-v4", {"bf16": 275, "f32": 275, "int8": 275}, 50, 1200,
         "cloud.google.com/tpu/docs/v4: 275 TFLOP/s bf16/int8 per chip, HBM 1200 GB/s; "
         "ICI 50 GB/s per link per direction (Jouppi et al., ISCA 2023, six links)",
         torus_3d=True, summing_checked=False),
    _tpu("tpu-v5e", {"bf16": 197, "f32": 197, "int8": 393}, 50, 819,
         "cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, 393 TOP/s int8, HBM 819 GB/s; "
         "ICI 400 GB/s bidirectional per chip over 4 ports = 50 GB/s per port "
         "per direction"),
    _tpu("tpu-v5p", {"bf16": 459, "f32": 459, "int8": 918}, 100, 2765,
         "cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, HBM 2765 GB/s; ICI 4800 Gbps "
         "(600 GB/s) per chip over 6 ports = 100 GB/s per port per direction",
         torus_3d=True),
    _tpu("tpu-v6e", {"bf16": 918, "f32": 918, "int8": 1836}, 100, 1640,
         "cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16, 1836 TOP/s int8, HBM 1640 GB/s; "
         "ICI 800 GB/s bidirectional per chip over 4 ports = 100 GB/s per port "
         "per direction"),
    Hardware("h100-sxm", {"bf16": 989, "f16": 989, "f32": 494, "f8": 1979, "int8": 1979},
             link_gbps=450, hbm_gbps=3350, **_GPU,
             source="NVIDIA H100 datasheet (SXM, dense): 989 TFLOP/s bf16/fp16, 494 tf32, "
                    "1979 fp8; HBM3 3350 GB/s; NVLink 900 GB/s total = 450 GB/s per direction"),
    Hardware("h200", {"bf16": 989, "f16": 989, "f32": 494, "f8": 1979, "int8": 1979},
             link_gbps=450, hbm_gbps=4800, **_GPU,
             source="NVIDIA H200 datasheet (SXM, dense): 989 TFLOP/s bf16/fp16, 494 tf32, "
                    "1979 fp8; HBM3e 4800 GB/s; NVLink 900 GB/s total = 450 GB/s per direction"),
    Hardware("b200", {"bf16": 2250, "f16": 2250, "f32": 1100, "f8": 4500, "int8": 4500},
             link_gbps=900, hbm_gbps=8000, **_GPU,
             source="NVIDIA HGX B200 datasheet (per GPU, dense): 2250 TFLOP/s bf16/fp16, "
                    "1100 tf32, 4500 fp8/int8; HBM3e 8000 GB/s; NVLink 5 1800 GB/s total = "
                    "900 GB/s per direction"),
    Hardware("a100", {"bf16": 312, "f16": 312, "f32": 156, "int8": 624}, link_gbps=300,
             hbm_gbps=2039, **_GPU,
             source="NVIDIA A100 datasheet (SXM 80GB, dense): 312 TFLOP/s bf16/fp16, 156 tf32, "
                    "624 int8; HBM2e 2039 GB/s; NVLink 600 GB/s total = 300 GB/s per direction"),
    Hardware("host-cpu", {"f32": 0.02, "bf16": 0.005, "f16": 0.005, "int8": 0.02},
             link_gbps=2.0, latency_us=50.0, step_overhead_us=20.0, loop_overhead_us=20.0,
             matmul_efficiency=1.0, link_efficiency=1.0, platform="cpu",
             source="measured on the 2-core CI machine: ~80 GFLOP/s f32 for XLA:CPU "
                    "shared by 8 host devices; copies between host devices ~2 GB/s"),
]}


def hardware(name_or_path: str) -> Hardware:
    """A built-in profile by name, or a JSON profile file by path."""
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    if name_or_path.endswith(".json"):
        return Hardware.from_file(name_or_path)
    raise ValueError(f"unknown hardware '{name_or_path}' (profiles: "
                     f"{', '.join(PROFILES)}; or a .json profile file)")


@dataclass(frozen=True)
class Estimate:
    """Predicted microseconds for one site, before and after the rewrite, and the
    terms they were made of (for timelines)."""

    before_us: float
    after_us: float
    hardware: str
    shape: SiteShape                    # what it was made from, the ring's plan included
    block_compute_us: float = 0.0       # T_c: one block's partial dots
    shift_us: float = 0.0               # T_m: one block over one link direction
    collective_us: float = 0.0          # the whole collective (the original's)
    exposed_round: int = -1             # the (first) round with no shift in flight
    step_overhead_us: float = 0.0

    @property
    def plan(self) -> RingPlan:
        """The ring the prediction is for."""
        return self.shape.plan

    @property
    def group_size(self) -> int:
        return self.shape.group_size

    @property
    def blocks_per_round(self) -> tuple[int, ...]:
        return self.shape.plan.blocks

    @property
    def speedup(self) -> float:
        return self.before_us / self.after_us if self.after_us else math.inf

    def pays(self, margin: float = MARGIN) -> bool:
        return self.after_us < self.before_us * (1 - margin)

    def format(self) -> str:
        return (f"predicted {self.before_us:.1f} us -> {self.after_us:.1f} us "
                f"({self.speedup:.2f}x) on {self.hardware}")


@dataclass(frozen=True)
class SiteShape:
    """What the model needs to know of a site: its size and the ring's plan."""

    group_size: int
    flops: float               # all the site's dots together, whole (not per block)
    element_type: str          # of the dot operands: "bf16", "f32", ...
    block_bytes: float         # one shifted block
    plan: RingPlan
    whole_bytes: float = 0.0   # operands every partial dot reads whole (the weights)
    sliced_bytes: float = 0.0  # the sliced operands and the results, whole: one read
                               # or write of each block's share
    spans_all_devices: bool = False  # one group of every device (Ring.spans_all_devices)
    link_load: int = 1         # transfers sharing the busiest link in a ring step
    sum_bytes: float = 0.0     # a ring that sums its products: the sum, which every
                               # round after the first that multiplies reads and writes
    collective_directions: int = 2  # link directions the original collective uses
    returned_bytes: float = 0.0  # the whole result, where the all_gather completing it
                                 # is an output of the program
    assembled_bytes: float = 0.0  # the gathered tensor, where the ring writes each block
                                  # into a buffer for its other readers
    # A site that is more than its ring (an all_reduce's other half): its pattern's
    # estimate, which prices it whole. The pass's estimate calls it; `estimate` does not.
    priced_by: Callable[[SiteShape, Hardware], Estimate] | None = field(
        default=None, compare=False, repr=False)


def estimate(site: SiteShape, hw: Hardware) -> Estimate:
    """The two predicted times (module docstring); rounds, shifts in flight and loop
    iterations come from the site's ring plan. Computed once per site shape and
    profile (the layers of a model repeat theirs)."""
    return _estimate(site, site.priced_by, _Frozen(hw))


@dataclass(frozen=True)
class _Frozen:
    """A profile as a cache key: by its fields (its dict of peaks as their items)."""

    hw: Hardware

    def __hash__(self) -> int:
        return hash((self.hw.name, self.hw.link_gbps, tuple(sorted(self.hw.tflops.items()))))


@functools.lru_cache(maxsize=1024)
def _estimate(site: SiteShape, priced_by, frozen: _Frozen) -> Estimate:
    hw = frozen.hw
    n, plan = site.group_size, site.plan
    t_c = hw.matmul_us(site.flops / n, site.element_type)
    t_m = hw.shift_us(site.block_bytes * site.link_load)
    collective = hw.collective_us(site.block_bytes, n, site.collective_directions)
    if plan.kind == SCATTER and site.spans_all_devices and hw.all_reduce_whole_scatter:
        collective *= 2     # an all-reduce: a reduce-scatter, then an all-gather
    before = collective + hw.dot_us(site.flops, site.whole_bytes + site.sliced_bytes,
                                    site.element_type)

    def compute(k: int) -> float:   # round k's dots: each reads the weights whole
        blocks = plan.blocks[k]
        return hw.dot_us(blocks * site.flops / n, plan.dots(k) * site.whole_bytes
                         + blocks * site.sliced_bytes / n, site.element_type)

    after = sum(_round_us(plan, compute(k), t_m if sends else 0.0)
                for k, sends in enumerate(plan.sends))
    step = hw.step_us(site.block_bytes)
    after += plan.rounds * step + plan.trip_count * hw.loop_overhead_us
    after += hw.memory_us(2 * site.assembled_bytes)   # each block read, then written
    if hw.serial_sums and site.sum_bytes:
        adds = sum(1 for blocks in plan.blocks if blocks) - 1
        after += adds * hw.memory_us(2 * site.sum_bytes)
    idle = plan.idle_rounds[0] if plan.idle_rounds else -1
    return Estimate(before, after, hw.name, site, t_c, t_m, collective, idle, step)


def _round_us(plan: RingPlan, compute: float, shift: float) -> float:
    """One round: its dots and its shifts run side by side. A reduce_scatter ring sends
    the sum a chain has just computed, so a chain's shift starts after its dot: with
    two chains in the round (a block's halves, or the two streams' blocks) the shift
    waits for one of them, else for the whole round's compute."""
    if plan.kind != SCATTER or not shift:
        return max(compute, shift)
    chains = plan.chains if plan.streams == 1 else plan.streams
    return max(compute, shift + compute / chains)


def element_name(element_type) -> str:
    text = str(element_type)
    return {"f8E4M3FN": "f8", "f8E5M2": "f8", "i8": "int8", "ui8": "int8"}.get(text, text)

"""Shared pieces of the benchmarks: the programs, their inputs, the variants and a timer.

Importing this module sets `--xla_force_host_platform_device_count=8` before JAX loads,
so every benchmark runs on 8 host CPU devices in one process.

A case is one tensor-parallel projection written with `jax.shard_map` on a ring of 8
devices (axis "x"), at one (seq, d) size:

| case      | program                                          | hand-written loop           |
| --------- | ------------------------------------------------ | --------------------------- |
| mlp_up    | all_gather([seq/8, d]) @ [d, 4d/8]               | ppermute the shard, write   |
| mlp_down  | psum_scatter([seq, 4d/8] @ [4d/8, d])            | ppermute the accumulator    |
| attn_qkv  | g = all_gather([seq/8, d]); g@wq, g@wk, g@wv     | one ring, three dots        |
|           | (each [d, d/8])                                  |                             |
| attn_out  | psum_scatter([seq, d/8] @ [d/8, d])              | ppermute the accumulator    |

Each case is built in these variants: the original program, the original lowering
rewritten by `overlap_hlo.rewrite_lowered` with each option set of `OPTION_SETS`
(threshold_mib=0 always, so every site is rewritten), and the collective matmul written
by hand with `jax.lax.ppermute` in a `fori_loop`, as in JAX's shard_map documentation.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Callable

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")   # host devices; no TPU backend start-up

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import overlap_hlo  # noqa: E402

AXIS = "x"
DEVICES = 8

ORIGINAL = "original"
HAND = "hand (JAX ppermute)"
# Rewritten variants: name -> keyword options of overlap_hlo.rewrite_lowered.
OPTION_SETS: dict[str, dict] = {
    "rewritten": {"threshold_mib": 0},
    "rewritten bidir": {"threshold_mib": 0, "bidirectional": True},
    "rewritten unroll=2": {"threshold_mib": 0, "unroll": 2},
    "rewritten bidir+unroll=2": {"threshold_mib": 0, "bidirectional": True, "unroll": 2},
}
VARIANTS = [ORIGINAL, *OPTION_SETS, HAND]
# Diagnostic only (memory.py, reduce_scatter cases): the hand loop shaped like the rewrite.
HAND_PEELED = "hand, last round peeled"

KINDS = ("mlp_up", "mlp_down", "attn_qkv", "attn_out")
SIZES = ((2048, 512), (4096, 1024))     # (seq, d)


# --- the programs (bodies of jax.shard_map, per-device shapes) -------------------------

def gather_dot(x, w):
    """all_gather of the sequence-sharded activations, then the column-parallel dot."""
    return jax.lax.all_gather(x, AXIS, axis=0, tiled=True) @ w


def gather_dot3(x, wq, wk, wv):
    """One all_gather feeding three dots (attention Q/K/V projections)."""
    g = jax.lax.all_gather(x, AXIS, axis=0, tiled=True)
    return g @ wq, g @ wk, g @ wv


def dot_scatter(h, w):
    """Row-parallel dot, then reduce_scatter of the partial sums along the sequence."""
    return jax.lax.psum_scatter(h @ w, AXIS, scatter_dimension=0, tiled=True)


def hand_gather_dots(x, *ws):
    """Collective matmul for all_gather(x) @ w (for each w), written with ppermute.

    Each step multiplies the shard it holds while the next one travels: position q
    sends to q-1, so after i shifts this device holds the shard of (idx + i) mod size.
    """
    size = jax.lax.axis_size(AXIS)
    idx = jax.lax.axis_index(AXIS)
    shift = [(j, (j - 1) % size) for j in range(size)]
    blk = x.shape[0]

    def write(outs, cur, i):
        start = ((idx + i) % size) * blk
        return tuple(jax.lax.dynamic_update_slice(out, cur @ w, (start, 0))
                     for out, w in zip(outs, ws))

    def body(i, carry):
        outs, cur = carry
        nxt = jax.lax.ppermute(cur, AXIS, shift)
        return write(outs, cur, i), nxt

    outs = tuple(jnp.zeros((blk * size, w.shape[1]), x.dtype) for w in ws)
    outs, cur = jax.lax.fori_loop(0, size - 1, body, (outs, x))
    outs = write(outs, cur, size - 1)
    return outs if len(ws) > 1 else outs[0]


def hand_dot_scatter(h, w, peel_last: bool = False):
    """Collective matmul for psum_scatter(h @ w), written with ppermute.

    The accumulator travels (position q sends to q-1): at step i this device adds the
    rows of block (idx + i + 1) mod size, the block whose owner the accumulator reaches
    after the remaining shifts. `peel_last` runs the last round after the loop (a
    diagnostic for the memory benchmark: it shows what peeling that round costs).
    """
    size = jax.lax.axis_size(AXIS)
    idx = jax.lax.axis_index(AXIS)
    shift = [(j, (j - 1) % size) for j in range(size)]
    blk = h.shape[0] // size

    def part(i):
        rows = jax.lax.dynamic_slice_in_dim(h, ((idx + i + 1) % size) * blk, blk, axis=0)
        return rows @ w

    def body(i, acc):
        return jax.lax.ppermute(acc, AXIS, shift) + part(i)

    if not peel_last:
        return jax.lax.fori_loop(1, size, body, part(0))
    acc = jax.lax.fori_loop(1, size - 1, body, part(0))
    return jax.lax.ppermute(acc, AXIS, shift) + part(size - 1)


def hand_dot_scatter_peeled(h, w):
    return hand_dot_scatter(h, w, peel_last=True)


# --- cases ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    original: Callable
    hand: Callable
    in_specs: tuple
    out_specs: object
    collective: str


SPECS = {
    "mlp_up": Spec(gather_dot, hand_gather_dots, (P(AXIS), P(None, AXIS)),
                   P(None, AXIS), "all_gather->dot"),
    "mlp_down": Spec(dot_scatter, hand_dot_scatter, (P(None, AXIS), P(AXIS, None)),
                     P(AXIS), "dot->reduce_scatter"),
    "attn_qkv": Spec(gather_dot3, hand_gather_dots, (P(AXIS),) + (P(None, AXIS),) * 3,
                     (P(None, AXIS),) * 3, "all_gather->3 dots"),
    "attn_out": Spec(dot_scatter, hand_dot_scatter, (P(None, AXIS), P(AXIS, None)),
                     P(AXIS), "dot->reduce_scatter"),
}


@dataclass(frozen=True)
class Case:
    kind: str
    seq: int
    d: int

    @property
    def spec(self) -> Spec:
        return SPECS[self.kind]

    @property
    def name(self) -> str:
        return f"{self.kind} seq={self.seq} d={self.d}"

    def global_shapes(self) -> list[tuple[int, int]]:
        s, d = self.seq, self.d
        return {"mlp_up": [(s, d), (d, 4 * d)],
                "mlp_down": [(s, 4 * d), (4 * d, d)],
                "attn_qkv": [(s, d), (d, d), (d, d), (d, d)],
                "attn_out": [(s, d), (d, d)]}[self.kind]

    def describe(self) -> str:
        """Per-device shapes, e.g. `all_gather [512,1024] -> [4096,1024] @ [1024,512]`."""
        n = DEVICES
        s, d = self.seq, self.d
        return {"mlp_up": f"AG [{s//n},{d}]->[{s},{d}] @ [{d},{4*d//n}]",
                "mlp_down": f"[{s},{4*d//n}] @ [{4*d//n},{d}] -> RS [{s//n},{d}]",
                "attn_qkv": f"AG [{s//n},{d}]->[{s},{d}] @ 3x[{d},{d//n}]",
                "attn_out": f"[{s},{d//n}] @ [{d//n},{d}] -> RS [{s//n},{d}]"}[self.kind]

    def flops(self) -> float:
        """Total FLOPs over all devices."""
        s, d = self.seq, self.d
        return {"mlp_up": 8.0 * s * d * d, "mlp_down": 8.0 * s * d * d,
                "attn_qkv": 6.0 * s * d * d, "attn_out": 2.0 * s * d * d}[self.kind]


def all_cases(kinds=KINDS, sizes=SIZES) -> list[Case]:
    return [Case(kind, seq, d) for seq, d in sizes for kind in kinds]


def mesh():
    return jax.make_mesh((DEVICES,), (AXIS,))


def inputs(case: Case, seed: int = 0) -> list[jax.Array]:
    """Unit-scale f32 inputs placed with the case's in_specs."""
    rng = np.random.default_rng(seed)
    m = mesh()
    args = []
    for i, (shape, spec) in enumerate(zip(case.global_shapes(), case.spec.in_specs)):
        scale = 1.0 if i == 0 else 1.0 / np.sqrt(shape[0])
        value = (rng.standard_normal(shape) * scale).astype(np.float32)
        args.append(jax.device_put(value, NamedSharding(m, spec)))
    return args


def jitted(case: Case, body: Callable):
    spec = case.spec
    return jax.jit(jax.shard_map(body, mesh=mesh(), in_specs=spec.in_specs,
                                 out_specs=spec.out_specs, check_vma=False))


def compile_variants(case: Case, args, variants=VARIANTS) -> dict[str, "jax.stages.Compiled"]:
    """Name -> compiled executable, for every variant of `case`."""
    lowered = jitted(case, case.spec.original).lower(*args)
    compiled = {}
    for name in variants:
        if name == ORIGINAL:
            compiled[name] = lowered.compile()
        elif name == HAND:
            compiled[name] = jitted(case, case.spec.hand).lower(*args).compile()
        elif name == HAND_PEELED:
            compiled[name] = jitted(case, hand_dot_scatter_peeled).lower(*args).compile()
        else:
            compiled[name] = overlap_hlo.rewrite_lowered(lowered, **OPTION_SETS[name]).compile()
    return compiled


def rewritten_sites(case: Case, args, name: str) -> int:
    """How many sites the option set `name` rewrites in `case` (a sanity check)."""
    lowered = jitted(case, case.spec.original).lower(*args)
    sites = overlap_hlo.remarks(lowered.as_text(), **OPTION_SETS[name])
    return sum(site.applied for site in sites)


def check_agree(compiled: dict, args, rtol: float = 1e-4) -> dict[str, float]:
    """Run each variant once and compare with the original; name -> max abs error
    relative to the output scale. Raises if a variant disagrees."""
    want = [np.asarray(a) for a in jax.tree.leaves(compiled[ORIGINAL](*args))]
    scale = max(float(np.max(np.abs(w))) for w in want)
    errors = {}
    for name, fn in compiled.items():
        got = [np.asarray(a) for a in jax.tree.leaves(fn(*args))]
        err = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want)) / scale
        if not all(np.allclose(g, w, rtol=rtol, atol=rtol * scale) for g, w in zip(got, want)):
            raise AssertionError(f"{name} disagrees with {ORIGINAL}: max rel error {err:.3g}")
        errors[name] = err
    return errors


# --- timing ---------------------------------------------------------------------------
#
# This machine is shared: other people's test runs take the same 2 cores, and a call that
# overlaps one of them can take 3x as long. Each call therefore also records how many
# cores other processes kept busy meanwhile (from /proc/stat minus this process's own
# CPU time, in 10 ms ticks, one tick forgiven), and a call that shared the machine is run
# again, a bounded number of times. Short calls (a few ticks) are judged coarsely.

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _busy_ticks() -> tuple[int, int]:
    """(ticks all CPUs spent busy, ticks this process spent), or (0, 0) off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq + steal, int(own[11]) + int(own[12])


def run_once(fn, args) -> tuple[float, float, float]:
    """(wall seconds of one call, cores other processes kept busy during it, CPU seconds
    this process spent on it, all threads)."""
    busy0, own0 = _busy_ticks()
    cpu = time.process_time()
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    busy1, own1 = _busy_ticks()
    # Both counts are sampled in ticks and may disagree by one: that tick is forgiven.
    foreign = max(0, (busy1 - busy0) - (own1 - own0) - 1) / _TICK
    return wall, foreign / wall, cpu


@dataclass
class Timings:
    seconds: dict[str, list[float]]     # per variant, one entry per round
    foreign: dict[str, list[float]]     # cores busy elsewhere during that call
    cpu: dict[str, list[float]]         # CPU seconds of this process during that call
    reruns: int                         # calls run again because the machine was shared


def interleaved_times(fns: dict[str, Callable], args, rounds: int, warmup: int = 2,
                      max_foreign: float = 0.25, max_reruns: int | None = None) -> Timings:
    """Seconds per call of each function, measured round-robin.

    Every function first runs `warmup` times. Then each round calls every function once,
    the order rotating by one each round, so no variant always runs first or right after
    the same neighbour: slow drifts of the machine (other processes, frequency, caches)
    fall on all variants alike instead of on whichever ran in a bad stretch. A call
    during which other processes kept more than `max_foreign` cores busy is run again
    (twice at most; at most `max_reruns` reruns in all, by default half the calls).
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            run_once(fns[name], args)
    budget = rounds * len(names) // 2 if max_reruns is None else max_reruns
    timings = Timings({n: [] for n in names}, {n: [] for n in names},
                      {n: [] for n in names}, 0)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            wall, foreign, cpu = run_once(fns[name], args)
            for _ in range(2):
                if foreign <= max_foreign or timings.reruns >= budget:
                    break
                timings.reruns += 1
                wall, foreign, cpu = run_once(fns[name], args)
            timings.seconds[name].append(wall)
            timings.foreign[name].append(foreign)
            timings.cpu[name].append(cpu)
    return timings


def summary(samples: list[float]) -> dict[str, float]:
    """Median and quartiles, in milliseconds."""
    q1, med, q3 = np.percentile(np.asarray(samples) * 1e3, [25, 50, 75])
    return {"median_ms": float(med), "q1_ms": float(q1), "q3_ms": float(q3),
            "iqr_ms": float(q3 - q1)}


# --- reporting ------------------------------------------------------------------------

def machine() -> dict[str, object]:
    return {"platform": platform.platform(), "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "jax": jax.__version__, "backend": jax.default_backend(),
            "devices": jax.device_count(), "xla_flags": os.environ.get("XLA_FLAGS", "")}


def header() -> dict[str, object]:
    """What `print_header` prints, for the JSON files as well."""
    return {"machine": machine(),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
            "loadavg": loadavg()}


def write_json(path: str, info: dict, **fields) -> None:
    """The run's header `info` with `fields` added, as JSON at `path`."""
    with open(path, "w") as f:
        json.dump({**info, **fields}, f, indent=1)
    print(f"wrote {path}")


def loadavg() -> str:
    """The 1/5/15-minute load averages, e.g. `0.52 1.10 0.90`."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def print_header(info: dict) -> None:
    m = info["machine"]
    print(f"machine: {m['platform']}, {m['processor']}, {m['cpu_count']} CPUs "
          f"({m['affinity']} usable), python {m['python']}, jax {m['jax']} "
          f"({m['backend']}, {m['devices']} devices)")
    print(f"XLA_FLAGS: {m['xla_flags']}")
    print(f"date: {info['date']}, load average {info['loadavg']}")
    print(f"command: {info['command']}")


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])

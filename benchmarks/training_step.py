"""Whole training steps, original against rewritten, compiled ahead of time for TPU slices
(libtpu) and NVIDIA GPUs (XLA's GPU compiler), no TPU or GPU needed.

    python benchmarks/training_step.py [--targets v5e:2x4,v5p:2x2x2,v6e:2x4,h100:8]
                                       [--models sp,tp,fsdp_tp] [--json PATH] [--tiny]

A step is forward, backward and optimizer of a Llama-style dense decoder (70B-class
dims: d_model 8192, GQA 64/8 heads of 128, SwiGLU 28672, one 4096-token sequence; 2
layers under `lax.scan`), bf16, tensor parallel over 8 devices in `jax.shard_map`:
`jax.value_and_grad` of a mean-square loss, then SGD. Inputs are shapes only
(`jax.ShapeDtypeStruct`): nothing is allocated.

| model | per layer, in the shard_map body (per device)                                  |
| ----- | ------------------------------------------------------------------------------- |
| sp    | Megatron with sequence parallelism: x [seq/8, d]; all_gather(norm(x)) -> Q/K/V,  |
|       | causal GQA attention, @ wo -> psum_scatter; the same around the SwiGLU MLP       |
| tp    | plain Megatron: x [seq, d] replicated; norm(x) -> Q/K/V, attention, @ wo -> psum; |
|       | SwiGLU MLP, @ w_down -> psum                                                     |
| fsdp_tp | sp over 4 devices, times 2-way FSDP: two sequences, one per FSDP group; each   |
|       | weight also split along d_model over the FSDP axis and all_gathered per layer  |
| moe   | sp's attention; the MLP 8 SwiGLU experts of half the width, one per device,     |
|       | top-1 routed (capacity twice the even share): all_to_all dispatch -> experts ->  |
|       | all_to_all combine                                                               |

The backward pass brings the transposes (an all_gather's gradient is a psum_scatter and
the reverse; the replicated activations' gradients in `tp` are psums; in `fsdp_tp` the
weight gradients are psum_scattered over the FSDP axis) and the norm weights' gradients
(all-reduces). Each step is handed to `overlap_hlo.targets.report.
build` as `overlap-report` does (no pass options: the target's cost profile decides each
site and the compiled schedules check the choice among the report's candidates, or keep
the original). Per model and target it prints the report and then one summary row:
predicted step time of the original and of the module kept, the perfect-overlap bound
(the original's time over its compute alone), compute and exposed communication before
and after, permutes overlapped, what the row outside every site holds, and XLA's own
answer: the same step written without shard_map (sp, tp and fsdp_tp), partitioned and
compiled by XLA with the compiler's defaults (`xla_auto`).

Every time is a MODEL of a compiled schedule, not a measurement: on TPU libtpu's
schedule with its own cycle estimates (overlap_hlo.targets.schedule), on GPU XLA's
latency-hiding scheduler with kernels priced by the analytic model
(overlap_hlo.targets.gpu_timing).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from importlib import metadata

os.environ.setdefault("JAX_PLATFORMS", "cpu")   # the host side never loads libtpu

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

AXIS = "tp"
FSDP = "fsdp"
TARGETS = ("v5e:2x4", "v5p:2x2x2", "v6e:2x4", "h100:8")
MODELS = ("sp", "tp", "fsdp_tp", "moe")
MODEL_NAMES = {"sp": "Megatron + sequence parallelism (all_gather / psum_scatter)",
               "tp": "Megatron, psum after the row-parallel matmuls",
               "fsdp_tp": "2-way FSDP x 4-way Megatron + sequence parallelism",
               "moe": "sequence-parallel attention, expert-parallel MoE MLP (all_to_all)"}
# (axis sizes, names) of each model's mesh over the 8 devices
MESHES = {"sp": ((8,), (AXIS,)), "tp": ((8,), (AXIS,)), "fsdp_tp": ((2, 4), (FSDP, AXIS)),
          "moe": ((8,), (AXIS,))}


@dataclass(frozen=True)
class Dims:
    model: int = 8192
    heads: int = 64
    kv_heads: int = 8
    head_dim: int = 128
    hidden: int = 28672
    seq: int = 4096
    layers: int = 2
    devices: int = 8


LLAMA_70B = Dims()
TINY = Dims(model=256, heads=16, kv_heads=8, head_dim=16, hidden=512, seq=64)


# --- the step ---------------------------------------------------------------------------

def param_shapes(dims: Dims, model: str = "sp") -> dict[str, tuple[int, ...]]:
    """Global shapes, stacked over layers (dim 0)."""
    d, L = dims.model, dims.layers
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    attn = {"norm_attn": (L, d), "wq": (L, d, q), "wk": (L, d, kv), "wv": (L, d, kv),
            "wo": (L, q, d), "norm_mlp": (L, d)}
    if model == "moe":   # one expert per device, half the dense MLP's width
        E, h = dims.devices, dims.hidden // 2
        return {**attn, "router": (L, d, E), "eg": (L, E, d, h), "eu": (L, E, d, h),
                "ed": (L, E, h, d)}
    return {**attn, "wg": (L, d, dims.hidden), "wu": (L, d, dims.hidden),
            "wd": (L, dims.hidden, d)}


# Heads and hidden units split over the tensor-parallel axis; norm weights replicated.
PARAM_SPECS = {"norm_attn": P(), "wq": P(None, None, AXIS), "wk": P(None, None, AXIS),
               "wv": P(None, None, AXIS), "wo": P(None, AXIS), "norm_mlp": P(),
               "wg": P(None, None, AXIS), "wu": P(None, None, AXIS), "wd": P(None, AXIS)}


# fsdp_tp: each weight's d_model dim split over the FSDP axis too (gathered per layer).
FSDP_PARAM_SPECS = {"norm_attn": P(), "wq": P(None, FSDP, AXIS), "wk": P(None, FSDP, AXIS),
                    "wv": P(None, FSDP, AXIS), "wo": P(None, AXIS, FSDP), "norm_mlp": P(),
                    "wg": P(None, FSDP, AXIS), "wu": P(None, FSDP, AXIS),
                    "wd": P(None, AXIS, FSDP)}
# moe: the attention's as sp's, the router replicated, each device its expert.
MOE_PARAM_SPECS = {**{name: PARAM_SPECS[name] for name in
                      ("norm_attn", "wq", "wk", "wv", "wo", "norm_mlp")},
                   "router": P(), "eg": P(None, AXIS), "eu": P(None, AXIS), "ed": P(None, AXIS)}
SPECS = {"sp": PARAM_SPECS, "tp": PARAM_SPECS, "fsdp_tp": FSDP_PARAM_SPECS,
         "moe": MOE_PARAM_SPECS}


def rms_norm(x, w):
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (normed * w.astype(jnp.float32)).astype(x.dtype)


def attention(g, p, dims: Dims):
    """Causal softmax attention over the local heads of the full sequence g [seq, d]:
    local query heads grouped over the local key/value heads (GQA)."""
    seq = g.shape[0]
    q = (g @ p["wq"]).reshape(seq, -1, dims.head_dim)          # [seq, heads/tp, dim]
    k = (g @ p["wk"]).reshape(seq, -1, dims.head_dim)          # [seq, kv_heads/tp, dim]
    v = (g @ p["wv"]).reshape(seq, -1, dims.head_dim)
    group = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    scores = jnp.einsum("qhd,khd->hqk", q, k).astype(jnp.float32) / np.sqrt(dims.head_dim)
    causal = (jax.lax.broadcasted_iota(jnp.int32, (seq, seq), 0)
              >= jax.lax.broadcasted_iota(jnp.int32, (seq, seq), 1))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e30), axis=-1).astype(g.dtype)
    return jnp.einsum("hqk,khd->qhd", weights, v).reshape(seq, -1)   # [seq, heads/tp*dim]


def swiglu(g, p):
    return (jax.nn.silu(g @ p["wg"]) * (g @ p["wu"])) @ p["wd"]


def layer_sp(x, p, dims: Dims):
    """x [seq/tp, d]: gather before the column-parallel matmuls, scatter after the
    row-parallel ones (Megatron sequence parallelism). Each collective on its own line:
    its source location names its row in the report (the backward pass's transpose of
    a collective keeps the location of the forward one)."""
    g = jax.lax.all_gather(rms_norm(x, p["norm_attn"]), AXIS, axis=0, tiled=True)
    o = attention(g, p, dims) @ p["wo"]
    x = x + jax.lax.psum_scatter(o, AXIS, scatter_dimension=0, tiled=True)
    g = jax.lax.all_gather(rms_norm(x, p["norm_mlp"]), AXIS, axis=0, tiled=True)
    return x + jax.lax.psum_scatter(swiglu(g, p), AXIS, scatter_dimension=0, tiled=True)


def layer_tp(x, p, dims: Dims):
    """x [seq, d] replicated: psum after the row-parallel matmuls (plain Megatron)."""
    x = x + jax.lax.psum(attention(rms_norm(x, p["norm_attn"]), p, dims) @ p["wo"], AXIS)
    return x + jax.lax.psum(swiglu(rms_norm(x, p["norm_mlp"]), p), AXIS)


def moe_mlp(x, p, dims: Dims):
    """Top-1 routed SwiGLU experts over x [tokens, d] (this device's), one expert per
    device: each expert takes up to twice its even share of a device's tokens (the rest
    pass through the residual), dispatched and combined with all_to_all."""
    tokens, experts = x.shape[0], dims.devices
    capacity = 2 * tokens // experts
    logits = (x @ p["router"]).astype(jnp.float32)                         # [T, E]
    expert = jnp.argmax(logits, axis=-1)
    gate = jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1).astype(x.dtype)
    chosen = jax.nn.one_hot(expert, experts, dtype=jnp.int32)              # [T, E]
    slot = jnp.sum(jnp.cumsum(chosen, axis=0) * chosen, axis=-1) - 1       # queue position
    dispatch = (chosen[:, :, None] * jax.nn.one_hot(slot, capacity, dtype=jnp.int32)[
        :, None, :]).astype(x.dtype)                                       # [T, E, C]
    sent = jnp.einsum("tec,td->ecd", dispatch, x)
    local = jax.lax.all_to_all(sent, AXIS, 0, 1, tiled=True)               # [1, E*C, d]
    h = jax.nn.silu(jnp.einsum("ecd,edh->ech", local, p["eg"])) * jnp.einsum(
        "ecd,edh->ech", local, p["eu"])
    out = jnp.einsum("ech,ehd->ecd", h, p["ed"])
    back = jax.lax.all_to_all(out, AXIS, 1, 0, tiled=True)                 # [E, C, d]
    return jnp.einsum("tec,ecd->td", dispatch * gate[:, None, None], back)


def layer_moe(x, p, dims: Dims):
    """x [seq/tp, d]: `layer_sp`'s attention, then the experts on this device's tokens."""
    g = jax.lax.all_gather(rms_norm(x, p["norm_attn"]), AXIS, axis=0, tiled=True)
    o = attention(g, p, dims) @ p["wo"]
    x = x + jax.lax.psum_scatter(o, AXIS, scatter_dimension=0, tiled=True)
    return x + moe_mlp(rms_norm(x, p["norm_mlp"]), p, dims)


def layer_fsdp_tp(x, p, dims: Dims):
    """`layer_sp` on this FSDP group's sequence, each weight all_gathered over the FSDP
    axis first (one line each: its own row in the report)."""
    p = dict(p,
             wq=jax.lax.all_gather(p["wq"], FSDP, axis=0, tiled=True),
             wk=jax.lax.all_gather(p["wk"], FSDP, axis=0, tiled=True),
             wv=jax.lax.all_gather(p["wv"], FSDP, axis=0, tiled=True),
             wo=jax.lax.all_gather(p["wo"], FSDP, axis=1, tiled=True),
             wg=jax.lax.all_gather(p["wg"], FSDP, axis=0, tiled=True),
             wu=jax.lax.all_gather(p["wu"], FSDP, axis=0, tiled=True),
             wd=jax.lax.all_gather(p["wd"], FSDP, axis=1, tiled=True))
    return layer_sp(x, p, dims)


LAYERS = {"sp": layer_sp, "tp": layer_tp, "fsdp_tp": layer_fsdp_tp, "moe": layer_moe}
# fsdp_tp: the rows of two sequences, the first FSDP group's first.
ACTIVATION_SPECS = {"sp": P(AXIS), "tp": P(), "fsdp_tp": P((FSDP, AXIS)), "moe": P(AXIS)}
# The axes the loss sums over (each device holds its rows); None: every device holds all.
LOSS_AXES = {"sp": (AXIS,), "tp": None, "fsdp_tp": (FSDP, AXIS), "moe": (AXIS,)}


def train_step(params, x, target, *, model: str, dims: Dims, lr: float = 1e-2,
               layer=None):
    """One SGD step; `layer` (h, p, dims) -> h: the model's shard_map layer by default,
    else a layer of global arrays (the auto-sharded step, whose loss needs no psum)."""
    manual = layer is None
    layer = layer or LAYERS[model]

    def loss_fn(params):
        out = jax.lax.scan(lambda h, p: (layer(h, p, dims), None), x, params)[0]
        error = out.astype(jnp.float32) - target.astype(jnp.float32)
        axes = LOSS_AXES[model] if manual else None
        if axes:   # each device holds its rows of the sequences
            return jax.lax.psum(jnp.sum(error * error), axes) / (error.size * dims.devices)
        return jnp.mean(error * error)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda w, g: w - lr * g, params, grads), loss


def lower(model: str, dims: Dims, devices, lr: float = 1e-2,
          dtype=jnp.bfloat16, auto: bool = False) -> "jax.stages.Lowered":
    """The step lowered for the model's mesh over `devices` (MESHES), shapes only;
    `auto`: written without shard_map (AUTO_MODELS), partitioned by XLA."""
    sizes, names = MESHES[model]
    mesh = Mesh(np.array(devices).reshape(sizes), names)
    act, specs = ACTIVATION_SPECS[model], SPECS[model]
    rows = dims.seq * (sizes[0] if len(sizes) == 2 else 1)   # a sequence per FSDP group

    def spec(shape, s):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, s))

    params = {name: spec(shape, specs[name])
              for name, shape in param_shapes(dims, model).items()}
    x = spec((rows, dims.model), act)
    if auto:   # plain jax.jit: GSPMD partitions the global step from the same shardings
        between = NamedSharding(mesh, act)
        step = jax.jit(lambda p, x, y: train_step(p, x, y, model=model, dims=dims, lr=lr,
                                                   layer=auto_layer(between, rows // dims.seq)),
                       out_shardings=({name: NamedSharding(mesh, s) for name, s in specs.items()},
                                      NamedSharding(mesh, P())))
        return step.lower(params, x, x)
    step = jax.jit(jax.shard_map(
        lambda p, x, y: train_step(p, x, y, model=model, dims=dims, lr=lr), mesh=mesh,
        in_specs=(specs, act, act), out_specs=(specs, P())))
    return step.lower(params, x, x)


# The models written without shard_map too: XLA's own answer (its windowed einsum) to
# the same step. (moe's routing per device is not written so.)
AUTO_MODELS = ("sp", "tp", "fsdp_tp")


def auto_layer(between: NamedSharding, sequences: int = 1):
    """`layer_sp` / `layer_tp` / `layer_fsdp_tp` on global arrays: the activations
    between the blocks kept in the sharding `between` (split over the sequence for sp,
    replicated for tp, one sequence per FSDP group for fsdp_tp), attention within each
    of the `sequences` the rows hold."""
    def layer(x, p, dims: Dims):
        x = jax.lax.with_sharding_constraint(x, between)
        g = rms_norm(x, p["norm_attn"])
        if sequences == 1:
            a = attention(g, p, dims)
        else:
            a = jax.vmap(lambda one: attention(one, p, dims))(
                g.reshape(sequences, -1, g.shape[-1])).reshape(g.shape[0], -1)
        x = jax.lax.with_sharding_constraint(x + a @ p["wo"], between)
        return x + swiglu(rms_norm(x, p["norm_mlp"]), p)
    return layer


# --- the reports ----------------------------------------------------------------------

def is_gpu(name: str) -> bool:
    from overlap_hlo.targets import gpu

    return name.split(":")[0].lower() in gpu.MODELS


def target_devices(name: str):
    """(the report's target object, its devices)."""
    from overlap_hlo.targets import gpu, tpu

    tgt = gpu.target(name) if is_gpu(name) else tpu.topology(name)
    return tgt, tgt.devices


def made_by(name: str, rep) -> str:
    """What made the figures of one report: compiler, version, timing model."""
    if is_gpu(name):
        return (f"XLA's GPU latency-hiding scheduler (jax-cuda12-pjrt "
                f"{versions().get('cuda plugin')}), {rep.times_from}")
    return (f"libtpu {versions().get('libtpu')}'s compiled schedule, modelled by "
            f"overlap_hlo.targets.schedule ({rep.times_from}, {rep.hardware} links)")


def measure(model: str, name: str, dims: Dims) -> dict:
    import overlap_hlo
    from overlap_hlo.ir.large_stack import on_large_stack
    from overlap_hlo.targets import report

    started = time.perf_counter()
    tgt, devices = target_devices(name)
    lowered = lower(model, dims, devices)
    lowered_s = time.perf_counter() - started
    with warnings.catch_warnings():   # the report lists the sites left unchanged itself
        warnings.simplefilter("ignore", overlap_hlo.SitesLeftUnchanged)
        rep = on_large_stack(lambda: report.build(lowered, tgt, input_name=f"{model}-step"))
    text = rep.format()
    seconds = time.perf_counter() - started
    out = rep.outside
    o, r = rep.original, rep.rewritten
    return {
        "model": model, "target": name, "date": _now(), "made_by": made_by(name, rep),
        "original_us": rep.original_us, "rewritten_us": rep.rewritten_us,
        "speedup": rep.speedup,
        # Perfect overlap: the original's compute alone, every transfer hidden.
        "perfect_overlap_us": o.compute_us, "perfect_overlap_speedup":
            rep.original_us / o.compute_us if o.compute_us else None,
        "original_compute_us": o.compute_us, "rewritten_compute_us": r.compute_us,
        "original_exposed_us": o.exposed_us, "rewritten_exposed_us": r.exposed_us,
        "permutes": rep.permutes, "overlapped": rep.overlapped,
        "synchronous": rep.synchronous,
        "outside_exposed_us": out["exposed_us"], "outside_compute_us": out["compute_us"],
        "kept": rep.kept, "chosen": rep.chosen, "candidates": rep.candidates,
        "sites": len(rep.sites), "sites_rewritten": sum(row.applied for row in rep.sites),
        "warnings": [line for line in text.splitlines() if line.startswith("warning:")],
        "report_text": text, "report": rep.to_json(),
        "lower_seconds": lowered_s, "seconds": seconds,
        **xla_auto(model, name, dims),
    }


def xla_auto(model: str, name: str, dims: Dims) -> dict:
    """XLA's own answer to the step: `lower(..., auto=True)` compiled for the target as
    XLA partitions it, with the compiler's defaults (libtpu's include its windowed
    einsum; XLA's GPU windowed einsum stays off: switched on, as benchmarks/gpu.py does
    for layers, it breaks this step, jaxlib 0.12.0.1), modelled like the others. Empty
    for models not in AUTO_MODELS."""
    if model not in AUTO_MODELS:
        return {}
    from overlap_hlo.targets import aot, gpu, report, tpu
    from overlap_hlo.targets.gpu_timing import GpuTiming
    from overlap_hlo.targets.schedule import Timing

    started = time.perf_counter()
    tgt, devices = target_devices(name)
    module = aot.as_module(lower(model, dims, devices, auto=True))
    if is_gpu(name):
        compiled = gpu.compile_module(module, tgt)
        timing = GpuTiming(tgt.hardware, 0.0, tgt.device_count)
    else:
        compiled = tpu.compile_module(module, tgt)
        timing = Timing(tgt.hardware, tgt.chip.clock_ghz, tgt.device_count, tgt.links)
    analysis = report.analyze_compiled(compiled, timing)
    return {"xla_auto_us": analysis.total_us, "xla_auto_compute_us": analysis.compute_us,
            "xla_auto_exposed_us": analysis.exposed_us,
            "xla_auto_collectives": sorted({c.opcode for c in analysis.collectives}),
            "xla_auto_permutes": len(analysis.permutes),
            "xla_auto_seconds": time.perf_counter() - started}


def summary_table(results: list[dict]) -> str:
    headers = ["model", "target", "original us", "rewritten us", "speedup",
               "bound (orig/compute)", "compute us before -> after",
               "exposed us before -> after", "permutes overlapped",
               "outside the sites: exposed us", "kept",
               "XLA auto-sharded us, / kept"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['target']} | failed: {r['error']} |")
            continue
        sync = f", {r['synchronous']} sync" if r["synchronous"] else ""
        lines.append(
            f"| {r['model']} | {r['target']} | {r['original_us']:.0f} | "
            f"{r['rewritten_us']:.0f} | {r['speedup']:.2f}x | "
            f"{r['perfect_overlap_speedup']:.2f}x | "
            f"{r['original_compute_us']:.0f} -> {r['rewritten_compute_us']:.0f} | "
            f"{r['original_exposed_us']:.0f} -> {r['rewritten_exposed_us']:.0f} | "
            f"{r['overlapped']}/{r['permutes']}{sync} | "
            f"{r['outside_exposed_us'][0]:.0f} -> {r['outside_exposed_us'][1]:.0f} | "
            f"{r['kept']} | {_xla_cell(r)} |")
    return "\n".join(lines)


def _xla_cell(r: dict) -> str:
    """XLA's auto-sharded step, and its time over the kept module's ("-": not written
    without shard_map)."""
    if "xla_auto_us" not in r:
        return "-"
    return f"{r['xla_auto_us']:.0f}, {r['xla_auto_us'] / r['rewritten_us']:.2f}x"


def provenance(results: list[dict]) -> str:
    return "\n".join(f"- {r['model']} on {r['target']} ({r['date']}, {r['seconds']:.0f} s): "
                     f"{r.get('made_by') or 'not compiled'}" for r in results)


# --- bookkeeping ----------------------------------------------------------------------

def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def versions() -> dict:
    from overlap_hlo.targets import gpu_plugin, tpu_plugin

    found = {}
    for package in ("jax", "jaxlib"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    found["libtpu"] = tpu_plugin.version()
    try:
        found["cuda plugin"] = gpu_plugin.jaxlib_version()
    except Exception:   # not installed: only the GPU rows need it
        found["cuda plugin"] = None
    return found


def source_state() -> dict:
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
        return done.stdout.rstrip("\n") if done.returncode == 0 else None

    changed = git("status", "--porcelain", "--", "overlap_hlo")
    return {"commit": git("rev-parse", "HEAD"),
            "uncommitted": [line[3:] for line in (changed or "").splitlines()]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help="comma-separated TPU slices and GPU targets "
                             "(default: %(default)s)")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, of {', '.join(MODELS)} (default: %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="write every report and row as JSON")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny dims (a smoke test of the script, not a benchmark)")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: of {', '.join(MODELS)}")
    dims = TINY if args.tiny else LLAMA_70B
    started = time.perf_counter()
    info = {"date": _now(), "versions": versions(), "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
            "dims": asdict(dims), "source": source_state()}
    print(f"{info['date']}: jax {info['versions']['jax']}, libtpu "
          f"{info['versions']['libtpu']}, CUDA plugin {info['versions']['cuda plugin']}; "
          f"dims {asdict(dims)}", flush=True)
    results = []
    for model in models:
        for name in args.targets.split(","):
            print(f"== {model} ({MODEL_NAMES[model]}) on {name}", flush=True)
            run_started = time.perf_counter()
            try:
                result = measure(model, name, dims)
            except Exception as err:   # recorded, and the rest runs
                first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                result = {"model": model, "target": name, "date": _now(),
                          "error": f"{type(err).__name__}: {first}",
                          "seconds": time.perf_counter() - run_started}
                print(f"failed: {result['error']}", flush=True)
            else:
                print(result["report_text"], end="")
                print(f"({result['seconds']:.0f} s, of which {result['lower_seconds']:.0f} s "
                      "lowering)", flush=True)
            results.append(result)
            if args.json:   # after each row: a long run interrupted keeps what it has
                _write_json(args.json, {**info, "seconds": time.perf_counter() - started,
                                        "results": results})
    info["seconds"] = time.perf_counter() - started
    print()
    print("Predicted step times: MODELS of compiled schedules, not measurements.")
    print(summary_table(results))
    print(provenance(results))
    print(f"total {info['seconds']:.0f} s")
    if args.json:
        _write_json(args.json, {**info, "results": results})
        print(f"wrote {args.json}")
    return 0 if all("error" not in r for r in results) else 1


def _write_json(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())

"""TPU schedules of GPT-style layers, compiled ahead of time by libtpu (no TPU needed).

    python benchmarks/tpu.py [--json benchmarks/results/tpu.json] [--plot docs/tpu-overlap.png]
                             [--table PATH.md] [--quick]

For each layer (bf16, the paper's GPT dims: d_model 4096, MLP 16384, 32 heads of 128,
2 x 4096 tokens per tensor-parallel group) on each slice, five executables of the same
compiler: the shard_map original (all_gather / psum_scatter written by hand), the
original rewritten by overlap_hlo (the TPU forms with default options and with
--bidirectional, and the forms every backend runs, --target=cpu), and
XLA's own windowed einsum on the auto-sharded form of the same layer (plain jax.jit with
shardings, no shard_map). Their schedules are modelled by overlap_hlo.targets.schedule:
permutes overlapped with a matmul, predicted time, exposed communication, the
compute-only bound, and TPU temporaries from the compiled memory stats. The analytic
cost model's prediction (overlap_hlo.plan.cost, through the remarks' Estimate) is set
against the schedule-based figure of each site, with the error.

| layer   | shard_map body (per device)                                              |
| ------- | ------------------------------------------------------------------------ |
| mlp     | all_gather(x, seq) @ w1 -> gelu -> @ w2 -> psum_scatter(seq)              |
| swiglu  | g = all_gather(x, seq); silu(g @ w_gate) * (g @ w_up) @ w_down -> scatter |
| qkv     | g = all_gather(x, seq); g @ wq, g @ wk, g @ wv (heads sharded)            |
| fsdp    | x_local @ all_gather(w, d_model) (weight sharded on its rows)             |
| gqa     | as qkv, keys and values d_model/8 wide (grouped-query attention, 8 of 64) |
| attn_out| o_local @ wo -> psum_scatter(seq) (heads sharded: the attention output)   |

Slices: v4:2x2x1 (8 TensorCores), v5e:2x4, v5p:2x2x2, v6e:2x4 (tensor parallelism over
all 8 devices) and the pod-scale v5p:4x4x4 (64 chips as 8 data-parallel x 8
tensor-parallel; each ring is 8 consecutive devices), plus the MLP and FSDP layers on
v6e:8x8 and the MLP on v5e:8x8, where the compiler keeps every collective-permute
synchronous. Every figure is a model of the
compiled schedule, not a measurement on a TPU.
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
from dataclasses import dataclass
from importlib import metadata

os.environ.setdefault("JAX_PLATFORMS", "cpu")   # the host side never loads libtpu

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from overlap_hlo.targets import report, tpu, tpu_plugin  # noqa: E402
from overlap_hlo.targets.schedule import Timing  # noqa: E402

# The TPU forms (the report's default target), and the forms every backend runs.
# "chosen": the slice's tpu-* profile decides each site and its form, and the report
# keeps the fastest of report.CANDIDATES in the compiled schedule, or the original.
VARIANTS = {"chosen": {},
            "rewritten": {"threshold_mib": 0},
            "bidirectional": {"threshold_mib": 0, "bidirectional": True},
            "portable forms": {"threshold_mib": 0, "target": "cpu"}}
XLA = "xla windowed einsum"
ORIGINAL = "original"
COLUMNS = [ORIGINAL, *VARIANTS, XLA]
# (topology, data-parallel ways, tensor-parallel ways)
SLICES = [("v4:2x2x1", 1, 8), ("v5e:2x4", 1, 8), ("v5p:2x2x2", 1, 8), ("v6e:2x4", 1, 8),
          ("v5p:4x4x4", 8, 8)]
LAYERS = ("mlp", "swiglu", "qkv", "fsdp")
# The rest of a 70B-class block (issue 17's layers), run alone: --layers gqa,attn_out.
MORE_LAYERS = ("gqa", "attn_out")
# Two more pod-scale points, kept to two layers for time. v5e slices of 32 chips and
# more keep collective-permutes synchronous (seen on v5e:4x8 and v5e:8x8).
EXTRA = [("mlp", ("v6e:8x8", 8, 8)), ("fsdp", ("v6e:8x8", 8, 8)), ("mlp", ("v5e:8x8", 8, 8))]


@dataclass(frozen=True)
class Dims:
    batch: int = 2          # sequences per tensor-parallel group
    seq: int = 4096
    model: int = 4096
    hidden: int = 16384

    @property
    def tokens(self) -> int:   # per device, for the FSDP layer
        return self.batch * self.seq // 2


PAPER = Dims()
QUICK = Dims(batch=1, seq=1024, model=512, hidden=2048)
# 70B-class: Llama-2/3-70B's d_model and MLP width, one 4096-token sequence per group.
LARGE = Dims(batch=1, seq=4096, model=8192, hidden=28672)


# --- the layers ------------------------------------------------------------------------

def ag(x, axis):
    return jax.lax.all_gather(x, "tp", axis=axis, tiled=True)


def rs(y, axis):
    return jax.lax.psum_scatter(y, "tp", scatter_dimension=axis, tiled=True)


def mlp(x, w1, w2):
    return rs(jax.nn.gelu(ag(x, 1) @ w1) @ w2, 1)


def swiglu(x, w_gate, w_up, w_down):
    g = ag(x, 1)
    return rs((jax.nn.silu(g @ w_gate) * (g @ w_up)) @ w_down, 1)


def qkv(x, wq, wk, wv):
    g = ag(x, 1)
    return g @ wq, g @ wk, g @ wv


def fsdp(x, w):
    return x @ ag(w, 0)


def attn_out(o, wo):
    return rs(o @ wo, 1)


def layer(name: str, dims: Dims, mesh: Mesh):
    """(shard_map body, auto-sharded body, [(global shape, spec)], out specs)."""
    b, s, d, f = dims.batch * mesh.shape["dp"], dims.seq, dims.model, dims.hidden
    seq = P("dp", "tp", None)
    cols, rows = P(None, "tp"), P("tp", None)

    def constrain(value, spec):
        return jax.lax.with_sharding_constraint(value, NamedSharding(mesh, spec))

    if name == "mlp":
        def auto(x, w1, w2):
            return jax.nn.gelu(constrain(x @ w1, P("dp", None, "tp"))) @ w2
        return mlp, auto, [((b, s, d), seq), ((d, f), cols), ((f, d), rows)], seq
    if name == "swiglu":
        def auto(x, w_gate, w_up, w_down):
            h = jax.nn.silu(x @ w_gate) * (x @ w_up)
            return constrain(h, P("dp", None, "tp")) @ w_down
        return (swiglu, auto, [((b, s, d), seq), ((d, f), cols), ((d, f), cols),
                               ((f, d), rows)], seq)
    if name == "qkv":
        def auto(x, wq, wk, wv):
            return x @ wq, x @ wk, x @ wv
        heads = P("dp", None, "tp")
        return qkv, auto, [((b, s, d), seq)] + [((d, d), cols)] * 3, (heads,) * 3
    if name == "gqa":
        kv = d // 8
        heads = P("dp", None, "tp")
        return (qkv, lambda x, wq, wk, wv: (x @ wq, x @ wk, x @ wv),
                [((b, s, d), seq), ((d, d), cols), ((d, kv), cols), ((d, kv), cols)],
                (heads,) * 3)
    if name == "attn_out":
        return attn_out, (lambda o, wo: o @ wo), [((b, s, d), P("dp", None, "tp")),
                                                   ((d, d), rows)], seq
    if name == "fsdp":
        tokens = P(("dp", "tp"), None)
        n = mesh.shape["dp"] * mesh.shape["tp"]
        return fsdp, (lambda x, w: x @ w), [((n * dims.tokens, d), tokens), ((d, f), rows)], \
            tokens
    raise ValueError(name)


def lowerings(name: str, dims: Dims, mesh: Mesh):
    """(shard_map lowering, auto-sharded lowering) of one layer on `mesh`."""
    body, auto, inputs, out_specs = layer(name, dims, mesh)
    args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
            for shape, spec in inputs]
    in_specs = tuple(spec for _, spec in inputs)
    manual = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs))
    outs = jax.tree.map(lambda spec: NamedSharding(mesh, spec), out_specs,
                        is_leaf=lambda x: isinstance(x, P))
    automatic = jax.jit(auto, out_shardings=outs)
    return manual.lower(*args), automatic.lower(*args)


# --- measuring ----------------------------------------------------------------------

def summary(analysis, bound_us: float | None = None) -> dict:
    permutes = analysis.permutes
    return {"permutes": len(permutes), "overlapped": sum(p.overlapped for p in permutes),
            "permute_executions": sum(p.executions for p in permutes),
            "predicted_us": analysis.total_us, "compute_us": analysis.compute_us,
            "exposed_us": analysis.exposed_us, "temp_bytes": analysis.temp_bytes,
            "collectives_left": sorted({c.opcode for c in analysis.collectives}),
            "loop_copies": len(analysis.loop_copies),
            "loops": [[loop.name, loop.trip_count] for loop in analysis.loops]}


def measure(name: str, dims: Dims, topology: str, dp: int, tp: int) -> dict:
    topo = tpu.topology(topology)
    mesh = Mesh(np.array(topo.devices).reshape(dp, tp), ("dp", "tp"))
    start = time.perf_counter()
    manual, automatic = lowerings(name, dims, mesh)
    reports = report.build_variants(manual, topo, VARIANTS)
    timing = Timing(topo.hardware, topo.chip.clock_ghz, topo.device_count, topo.links)
    xla = report.analyze_compiled(tpu.compile_module(tpu.as_module(automatic), topo), timing)
    first = next(iter(reports.values()))
    variants = {ORIGINAL: summary(first.original)}
    for variant, rep in reports.items():
        variants[variant] = summary(rep.rewritten)
        variants[variant]["sites"] = [_site(row) for row in rep.sites]
        variants[variant]["candidate"] = rep.chosen     # "" where no check ran
    variants[XLA] = summary(xla)
    bound = min(v["compute_us"] for v in variants.values())
    for v in variants.values():
        v["share"] = v["overlapped"] / v["permutes"] if v["permutes"] else None
        assert v["predicted_us"] >= bound, (name, topology, v)
    label = name if dims in (PAPER, QUICK) else f"{name} 70b"
    return {"layer": label, "topology": topology, "dp": dp, "tp": tp,
            "hardware": topo.hardware.name, "clock_ghz": topo.chip.clock_ghz,
            "compute_bound_us": bound, "variants": variants,
            "seconds": time.perf_counter() - start}


def _site(row) -> dict:
    def error(model, schedule):
        return None if model is None or not schedule else model / schedule - 1
    return {"location": row.location.rsplit("/", 1)[-1], "pattern": row.pattern,
            "permutes": row.permutes, "overlapped": row.overlapped,
            "schedule_before_us": row.before_us, "schedule_after_us": row.after_us,
            "model_before_us": row.model_before_us, "model_after_us": row.model_after_us,
            "model_before_error": error(row.model_before_us, row.before_us),
            "model_after_error": error(row.model_after_us, row.after_us)}


# --- reporting ----------------------------------------------------------------------

def source_state() -> dict:
    """The commit measured, and which of the rewrite's files differed from it."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
        return done.stdout.rstrip("\n") if done.returncode == 0 else None

    changed = git("status", "--porcelain", "--", "overlap_hlo", "passes")
    return {"commit": git("rev-parse", "HEAD"),
            "uncommitted": [line[3:] for line in (changed or "").splitlines()]}


def versions() -> dict:
    found = {}
    for package in ("jax", "jaxlib"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    found["libtpu"] = tpu_plugin.version()   # a private install has no site-packages entry
    return found


def table(results: list[dict]) -> str:
    headers = ["layer", "slice"] + [f"{c}" for c in COLUMNS]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in results:
        cells = [r["layer"], f"{r['topology']}" + (f" ({r['dp']}x{r['tp']})" if r["dp"] > 1
                                                   else "")]
        for column in COLUMNS:
            v = r["variants"][column]
            share = f"{v['overlapped']}/{v['permutes']}" if v["permutes"] else "-"
            compute = v["compute_us"] / r["variants"][ORIGINAL]["compute_us"]
            cells.append(f"{share}, {v['predicted_us']:.0f} us, compute {compute:.2f}x, "
                         f"{v['temp_bytes'] / 2**20:.1f} MiB"
                         + (f" ({v['candidate']})" if v.get("candidate") else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bound_table(results: list[dict]) -> str:
    lines = ["| layer | slice | compute-only bound us | original us | best rewritten us | "
             "xla us | left in xla |", "|---|---|---|---|---|---|---|"]
    for r in results:
        v = r["variants"]
        best = min(VARIANTS, key=lambda k: v[k]["predicted_us"])
        lines.append(f"| {r['layer']} | {r['topology']} | {r['compute_bound_us']:.0f} | "
                     f"{v[ORIGINAL]['predicted_us']:.0f} | {v[best]['predicted_us']:.0f} "
                     f"({best}) | {v[XLA]['predicted_us']:.0f} | "
                     f"{', '.join(v[XLA]['collectives_left']) or '-'} |")
    return "\n".join(lines)


def verdict(results: list[dict]) -> str:
    """The chosen forms against the original and XLA's windowed einsum."""
    chosen = [r["variants"]["chosen"]["predicted_us"] for r in results]
    original = [r["variants"][ORIGINAL]["predicted_us"] for r in results]
    xla = [r["variants"][XLA]["predicted_us"] for r in results]
    speedups = np.array(original) / np.array(chosen)
    against_xla = np.array(xla) / np.array(chosen)
    ratios = [r["variants"]["chosen"]["compute_us"]
              / r["variants"][ORIGINAL]["compute_us"] for r in results]
    shares = [(v["overlapped"], v["permutes"]) for r in results
              for v in [r["variants"]["chosen"]]]
    return (f"Chosen, over {len(results)} layer/slice pairs: against the original "
            f"{speedups.min():.2f}-{speedups.max():.2f}x, geometric mean "
            f"{np.exp(np.mean(np.log(speedups))):.3f}x, {int(np.sum(speedups < 0.995))} "
            f"slower; against XLA's windowed einsum {against_xla.min():.2f}-"
            f"{against_xla.max():.2f}x, at least as fast in "
            f"{int(np.sum(against_xla >= 0.995))}; compute {min(ratios):.2f}-"
            f"{max(ratios):.2f}x the original's; permutes overlapped "
            f"{sum(o for o, _ in shares)}/{sum(p for _, p in shares)}.")


def model_table(results: list[dict]) -> str:
    lines = ["| layer | slice | site | schedule before -> after us | model before -> after us "
             "| error before, after |", "|---|---|---|---|---|---|"]
    for r in results:
        for site in r["variants"]["chosen"]["sites"]:
            if site["model_after_us"] is None:
                continue
            lines.append(
                f"| {r['layer']} | {r['topology']} | {site['pattern'].removeprefix('overlap-')} "
                f"| {site['schedule_before_us']:.0f} -> {site['schedule_after_us']:.0f} | "
                f"{site['model_before_us']:.0f} -> {site['model_after_us']:.0f} | "
                f"{site['model_before_error']:+.0%}, {site['model_after_error']:+.0%} |")
    return "\n".join(lines)


def model_errors(results: list[dict]) -> str:
    """The analytic model against the schedule, over every rewritten site."""
    lines = []
    for variant in VARIANTS:
        for when in ("before", "after"):
            errors = sorted(abs(site[f"model_{when}_error"]) for r in results
                            for site in r["variants"][variant]["sites"]
                            if site[f"model_{when}_error"] is not None)
            if errors:
                lines.append(f"- {variant}, {when}: median |error| {np.median(errors):.0%}, "
                             f"largest {errors[-1]:.0%} ({len(errors)} sites)")
    return "Analytic model (overlap_hlo.plan.cost on the slice's profile) against the " \
           "schedule-based figure:\n" + "\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 0.5 + 0.32 * len(results)), sharey=True)
    labels = [f"{r['layer']} {r['topology']}" for r in results]
    y = np.arange(len(results))
    width = 0.8 / len(COLUMNS)
    for i, column in enumerate(COLUMNS):
        shares = [r["variants"][column]["share"] or 0 for r in results]
        ratio = [r["variants"][column]["predicted_us"] / r["variants"][ORIGINAL]["predicted_us"]
                 for r in results]
        axes[0].barh(y + i * width, shares, width, label=column)
        axes[1].barh(y + i * width, ratio, width, label=column)
    bound = [r["compute_bound_us"] / r["variants"][ORIGINAL]["predicted_us"] for r in results]
    axes[1].scatter(bound, y + 0.4 - width / 2, marker="|", color="black", s=120,
                    label="compute-only bound", zorder=3)
    axes[0].set_yticks(y + 0.4 - width / 2, labels)
    axes[0].invert_yaxis()
    axes[0].set_xlabel("permutes with a matmul between start and done")
    axes[1].set_xlabel("predicted step time / original's")
    axes[1].axvline(1.0, color="gray", linewidth=0.8)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle("TPU schedules compiled ahead of time by libtpu (modelled, not measured)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(text: str, table: str | None, json_path: str | None, payload: dict) -> None:
    """The markdown tables and the JSON record, where asked for."""
    if table:
        with open(table, "w") as f:
            f.write(text + "\n")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(payload, f, indent=1)
        print(f"wrote {json_path}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--plot", metavar="PATH.png")
    parser.add_argument("--table", metavar="PATH.md", help="write the markdown tables")
    parser.add_argument("--quick", action="store_true",
                        help="small shapes, v5e:2x4 and v6e:2x4 only (a smoke test)")
    parser.add_argument("--layers", default=",".join(LAYERS),
                        help=f"comma-separated, of {', '.join(LAYERS + MORE_LAYERS)}")
    parser.add_argument("--no-70b", action="store_true",
                        help="leave out the 70B-class dims (on the 8-device slices)")
    parser.add_argument("--slices", default=",".join(s for s, _, _ in SLICES))
    args = parser.parse_args(argv)
    dims = QUICK if args.quick else PAPER
    wanted = ["v5e:2x4", "v6e:2x4"] if args.quick else args.slices.split(",")
    slices = [s for s in SLICES if s[0] in wanted]
    started = time.perf_counter()
    info = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "versions": versions(), "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
            "dims": dims.__dict__, "large_dims": LARGE.__dict__, "source": source_state()}
    print(f"{info['date']}: jax {info['versions']['jax']}, libtpu {info['versions']['libtpu']}")
    runs = [(name, s, dims) for name in args.layers.split(",") for s in slices]
    if not args.quick and args.slices == parser.get_default("slices"):
        runs += [(name, s, dims) for name, s in EXTRA if name in args.layers.split(",")]
    if not args.quick and not args.no_70b:
        runs += [(name, s, LARGE) for name in args.layers.split(",") for s in slices
                 if s[1] == 1]
    results = []
    for name, (topology, dp, tp), size in runs:
        result = measure(name, size, topology, dp, tp)
        v = result["variants"]
        print(f"{name:7s} {topology:10s} " + "  ".join(
            f"{c}: {v[c]['overlapped']}/{v[c]['permutes']} {v[c]['predicted_us']:.0f}us"
            for c in COLUMNS) + f"  bound {result['compute_bound_us']:.0f}us"
            f"  ({result['seconds']:.0f} s)", flush=True)
        results.append(result)
    info["seconds"] = time.perf_counter() - started
    text = "\n\n".join([
        f"Date {info['date']}, jax {info['versions']['jax']}, libtpu "
        f"{info['versions']['libtpu']}; {info['seconds']:.0f} s on {info['machine']}; "
        f"commit {(info['source']['commit'] or '?')[:10]}"
        + (f" with uncommitted changes in {', '.join(info['source']['uncommitted'])}"
           if info['source']['uncommitted'] else "") + ".",
        "Each cell: permutes overlapped / permutes in the schedule, predicted step time, TPU "
        "temporaries.", verdict(results), table(results), bound_table(results),
        model_table(results),
        model_errors(results)])
    print(text)
    write_outputs(text, args.table, args.json, {**info, "results": results})
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

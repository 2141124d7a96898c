"""GPU schedules of GPT-style layers, compiled ahead of time by XLA's GPU compiler (no GPU
needed: JAX's CUDA plugin, `python -m overlap_hlo.targets.gpu_plugin install`).

    python benchmarks/gpu.py [--json PATH] [--table PATH.md] [--quick] [--targets h100:8,...]

The layers and dims are those of benchmarks/tpu.py (bf16 MLP, SwiGLU MLP, Q/K/V and
FSDP at the paper's dims and at 70B-class dims), tensor parallel over 8 GPUs of one
host. For each target (H100, H200, B200), the same compiler builds: the shard_map
original, the original rewritten by overlap_hlo (what `overlap-report --gpu` keeps by
default, then every site with one stream, with two, and with two unrolled by 2), and
XLA's own windowed einsum on the auto-sharded layer
(`xla_gpu_threshold_for_windowed_einsum_mib=0`,
`xla_gpu_multi_streamed_windowed_einsum=true`). Per executable: permutes with a GEMM
scheduled between start and done / permutes, permutes XLA made synchronous, GPU
temporaries, and the predicted step time.

Every time is a MODEL: kernels priced by the analytic cost model on the target's
datasheet profile (GEMMs on its roofline, other kernels as memory traffic), transfers
from its NVLink figures, walked in XLA's schedule (overlap_hlo.targets.gpu_timing). XLA
compiles without GEMM autotuning here, so its GEMM choices may differ on a real GPU.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")   # the host side never loads a GPU backend

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from benchmarks.tpu import (LARGE, LAYERS, PAPER, QUICK, Dims, lowerings, summary,  # noqa: E402
                            versions, write_outputs)
from overlap_hlo.targets import aot, gpu, report  # noqa: E402
from overlap_hlo.targets.gpu_timing import GpuTiming  # noqa: E402

VARIANTS = {"chosen": {},   # the target's profile decides, checked in the compiled schedule
            "rewritten": {"threshold_mib": 0, "bidirectional": False},
            "bidirectional": {"threshold_mib": 0, "bidirectional": True},
            "bidirectional, unroll=2": {"threshold_mib": 0, "bidirectional": True,
                                        "unroll": 2}}
XLA = "xla windowed einsum"
ORIGINAL = "original"
COLUMNS = [ORIGINAL, *VARIANTS, XLA]
TARGETS = ("h100:8", "h200:8", "b200:8")
WINDOWED_EINSUM = {"xla_gpu_threshold_for_windowed_einsum_mib": 0,
                   "xla_gpu_multi_streamed_windowed_einsum": True}


def cell(analysis) -> dict:
    row = summary(analysis)
    row["synchronous"] = sum(p.synchronous for p in analysis.permutes)
    return row


def measure(name: str, dims: Dims, target: str) -> dict:
    tgt = gpu.target(target)
    mesh = Mesh(np.array(tgt.devices).reshape(1, tgt.device_count), ("dp", "tp"))
    start = time.perf_counter()
    manual, automatic = lowerings(name, dims, mesh)
    reports = report.build_variants(manual, tgt, VARIANTS)
    timing = GpuTiming(tgt.hardware, 0.0, tgt.device_count)
    xla = aot.compile_module(aot.as_module(automatic), tgt.devices, tgt.name, gpu.ERRORS,
                             {**gpu.COMPILER_OPTIONS, **WINDOWED_EINSUM})
    first = next(iter(reports.values()))
    variants = {ORIGINAL: cell(first.original)}
    for variant, rep in reports.items():
        variants[variant] = cell(rep.rewritten)
        variants[variant]["candidate"] = rep.chosen
    variants[XLA] = cell(report.analyze_compiled(xla, timing))
    label = name if dims in (PAPER, QUICK) else f"{name} 70b"
    return {"layer": label, "target": target, "hardware": tgt.hardware.name,
            "variants": variants, "seconds": time.perf_counter() - start}


def table(results: list[dict]) -> str:
    lines = ["| layer | target | " + " | ".join(COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    for r in results:
        cells = []
        for column in COLUMNS:
            v = r["variants"][column]
            share = (f"{v['overlapped']}/{v['permutes']}"
                     + (f" ({v['synchronous']} sync)" if v["synchronous"] else "")
                     if v["permutes"] else "-")
            cells.append(f"{share}, {v['predicted_us']:.0f} us, "
                         f"{v['temp_bytes'] / 2**20:.0f} MiB"
                         + (f" ({v['candidate']})" if v.get("candidate") else ""))
        lines.append(f"| {r['layer']} | {r['target']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict(results: list[dict]) -> str:
    parts = []
    for column in VARIANTS:
        speedups = [r["variants"][ORIGINAL]["predicted_us"]
                    / r["variants"][column]["predicted_us"] for r in results]
        against = [r["variants"][XLA]["predicted_us"] / r["variants"][column]["predicted_us"]
                   for r in results]
        permutes = sum(r["variants"][column]["permutes"] for r in results)
        overlapped = sum(r["variants"][column]["overlapped"] for r in results)
        sync = sum(r["variants"][column]["synchronous"] for r in results)
        slower = sum(s < 0.995 for s in speedups)
        mean = statistics.geometric_mean(speedups)
        parts.append(f"{column}: {mean:.3f}x the original (geometric mean, "
                     f"{min(speedups):.2f}-{max(speedups):.2f}x, {slower} "
                     f"slower), at least as fast as XLA's windowed einsum in "
                     f"{sum(a >= 0.995 for a in against)} of {len(results)}; permutes "
                     f"overlapped {overlapped}/{permutes}, {sync} synchronous")
    return "\n".join(f"- {p}" for p in parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--table", metavar="PATH.md")
    parser.add_argument("--quick", action="store_true", help="small shapes, h100:8 only")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--layers", default=",".join(LAYERS))
    args = parser.parse_args(argv)
    targets = ["h100:8"] if args.quick else args.targets.split(",")
    sizes = [QUICK] if args.quick else [PAPER, LARGE]
    started = time.perf_counter()
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    results = []
    for size in sizes:
        for name in args.layers.split(","):
            for target in targets:
                r = measure(name, size, target)
                v = r["variants"]
                print(f"{r['layer']:11s} {target:7s} " + "  ".join(
                    f"{c}: {v[c]['overlapped']}/{v[c]['permutes']} {v[c]['predicted_us']:.0f}us"
                    for c in COLUMNS) + f"  ({r['seconds']:.0f} s)", flush=True)
                results.append(r)
    seconds = time.perf_counter() - started
    info = versions()
    text = "\n\n".join([
        f"Date {date}, jax {info.get('jax')}; {seconds:.0f} s. A MODEL of XLA's GPU "
        "schedule (analytic kernel times on datasheet profiles), not a measurement.",
        "Each cell: permutes with a GEMM between start and done / permutes (synchronous "
        "ones), predicted step time, GPU temporaries.",
        verdict(results), table(results)])
    print(text)
    write_outputs(text, args.table, args.json,
                  {"date": date, "seconds": seconds, "versions": info, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())

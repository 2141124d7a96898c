"""Bar charts of each variant's ratio to the original, from the benchmarks' JSON files.

    python benchmarks/execution.py --json exec.json
    python benchmarks/memory.py --json mem.json
    python benchmarks/plot_ratios.py exec.json [--memory mem.json] --out ratios

writes ratios.png and ratios.svg: one panel of run-time ratios (median of per-round
ratios, whiskers at the quartiles) and, with --memory, one of temporary-memory ratios.
Below 1 is better than the original; the dashed line marks 1.
"""
from __future__ import annotations

import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ORIGINAL = "original"   # as in benchmarks.common, which is not imported: no JAX needed here


def bars(ax, cases: list[str], variants: list[str], values, low=None, high=None,
         notes: dict[str, str] | None = None) -> None:
    """Grouped bars: one group per case, one bar per variant."""
    width = 0.8 / len(variants)
    x = np.arange(len(cases))
    colors = plt.get_cmap("tab10").colors
    for i, name in enumerate(variants):
        v = np.array([values[c][name] for c in cases])
        err = None
        if low is not None:
            err = np.array([[v[j] - low[c][name] for j, c in enumerate(cases)],
                            [high[c][name] - v[j] for j, c in enumerate(cases)]])
        pos = x - 0.4 + width * (i + 0.5)
        ax.bar(pos, v, width, label=name, color=colors[i % len(colors)], yerr=err,
               capsize=2, error_kw={"elinewidth": 0.8, "ecolor": "0.25"})
    ax.axhline(1.0, color="0.2", linestyle="--", linewidth=1)
    ax.set_xticks(x)
    ax.set_xticklabels([c.replace(" ", "\n", 1) + (notes or {}).get(c, "") for c in cases],
                       fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def common_variants(results: list[dict]) -> list[str]:
    """The variants every case has (diagnostic extras of some cases left out), in order."""
    return [v for v in results[0]["variants"]
            if v != ORIGINAL and all(v in r["variants"] for r in results)]


def execution_panel(ax, data: dict) -> None:
    results = data["results"]
    cases = [r["case"] for r in results]
    variants = common_variants(results)
    get = {key: {r["case"]: {v: r["variants"][v]["vs_original"][key] for v in variants}
                 for r in results} for key in ("ratio", "q1", "q3")}
    notes = {}
    for r in results:    # flag cases timed while other processes kept the CPUs busy
        calls = r["rounds"] * len(r["variants"])
        if r.get("shared_calls", 0) > 0.1 * calls:
            notes[r["case"]] = f"\n(CPUs busy: {r['shared_calls']}/{calls})"
    bars(ax, cases, variants, get["ratio"], get["q1"], get["q3"], notes)
    rounds = sorted({r["rounds"] for r in results})
    ax.set_ylabel("run time / original")
    ax.set_title("Run time relative to all_gather/reduce_scatter + dot (median of "
                 f"{'/'.join(map(str, rounds))} interleaved rounds, whiskers: quartiles; "
                 "CPUs busy: calls timed while other processes ran)",
                 fontsize=9)


def memory_panel(ax, data: dict) -> None:
    results = data["results"]
    cases = [r["case"] for r in results]
    variants = common_variants(results)
    values = {r["case"]: {v: r["variants"][v]["temp_vs_original"] for v in variants}
              for r in results}
    bars(ax, cases, variants, values)
    ax.set_ylabel("temporaries / original")
    ax.set_title("Temporary memory per device relative to the original "
                 "(XLA memory_analysis)", fontsize=9)
    ax.set_ylim(0, max(max(v.values()) for v in values.values()) * 1.35)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("execution", nargs="?", help="JSON from execution.py --json")
    parser.add_argument("--memory", metavar="JSON", help="JSON from memory.py --json")
    parser.add_argument("--out", required=True, metavar="PREFIX",
                        help="write PREFIX.png and PREFIX.svg")
    options = parser.parse_args(argv)
    panels = []
    for path, draw in ((options.execution, execution_panel), (options.memory, memory_panel)):
        if path:
            with open(path) as f:
                panels.append((json.load(f), draw))
    if not panels:
        parser.error("give the execution JSON, --memory JSON, or both")
    width = max(10.0, 1.6 * max(len(d["results"]) for d, _ in panels))
    height = 4.2 * len(panels) + 0.6
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, height), squeeze=False)
    for ax, (data, draw) in zip(axes[:, 0], panels):
        draw(ax, data)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8,
               bbox_to_anchor=(0.5, 1 - 0.3 / height), frameon=False)
    first = panels[0][0]
    m = first["machine"]
    fig.suptitle(f"overlap-hlo on {m['devices']} {m['backend']} devices, {m['cpu_count']} "
                 f"cores, jax {m['jax']} ({first['date'][:10]}); below 1 is better",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / height))
    for ext in ("png", "svg"):
        fig.savefig(f"{options.out}.{ext}", dpi=130)
        print(f"wrote {options.out}.{ext}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A timeline PICTURE from the cost model (a prediction): compute and communication
lanes of one site, collective-then-dot against the decomposed ring.

    python benchmarks/plot_timeline.py [--model gpt-175b] [--site mlp-up]
        [--hardware tpu-v5e] [--out docs/timeline]      # writes .png and .svg
"""
from __future__ import annotations

import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from predictions import MODELS, layer_modules  # noqa: E402

import overlap_hlo  # noqa: E402
from overlap_hlo.plan import cost  # noqa: E402

COMPUTE, COMM = "#3b7dd8", "#e8833a"


def lanes(estimate: cost.Estimate):
    """[(lane, start, length, label)] before and after, from the estimate's terms."""
    n, t_c, t_m = estimate.group_size, estimate.block_compute_us, estimate.shift_us
    collective = estimate.collective_us
    before = [("comm", 0.0, collective, "collective")]
    before += [("compute", collective + i * t_c, t_c, "") for i in range(n)]
    rounds = list(estimate.blocks_per_round)
    exposed = estimate.exposed_round % len(rounds)
    after, clock = [], 0.0
    for r, blocks in enumerate(rounds):
        length = blocks * t_c
        after.append(("compute", clock, length, f"{blocks} blocks" if blocks > 1 else ""))
        in_flight = r != exposed
        if in_flight:
            after.append(("comm", clock, t_m, "both ways" if max(rounds) > 1 else ""))
        clock += max(length, t_m if in_flight else 0.0) + estimate.step_overhead_us
    return before, after


def draw(before, after, title: str, out: str) -> None:
    fig, axes = plt.subplots(2, 1, figsize=(10, 3.6), sharex=True)
    end = max(max(s + w for _, s, w, _ in before), max(s + w for _, s, w, _ in after))
    for ax, bars, name in ((axes[0], before, "collective, then dot"),
                           (axes[1], after, "decomposed ring")):
        for lane, start, length, label in bars:
            y = 1 if lane == "compute" else 0
            ax.broken_barh([(start, length)], (y + 0.1, 0.8),
                           facecolors=COMPUTE if lane == "compute" else COMM,
                           edgecolor="white", linewidth=0.6)
            if label:
                ax.text(start + length / 2, y + 0.5, label, ha="center", va="center",
                        color="white", fontsize=7)
        total = max(s + w for _, s, w, _ in bars)
        ax.set_yticks([0.5, 1.5], ["communication", "compute"])
        ax.set_title(f"{name}: {total:.0f} us", loc="left", fontsize=9)
        ax.set_xlim(0, end * 1.02)
    axes[1].set_xlabel("microseconds (cost-model prediction)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(f"{out}.{ext}", dpi=130)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-175b", choices=sorted(MODELS))
    parser.add_argument("--site", default="mlp-up",
                        choices=["qkv", "attn-out", "mlp-up", "mlp-down"])
    parser.add_argument("--hardware", default="tpu-v5e", choices=sorted(cost.PROFILES))
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--bidirectional", action="store_true")
    parser.add_argument("--out", default="docs/timeline")
    args = parser.parse_args(argv)
    text = layer_modules(MODELS[args.model], args.tokens, args.tp)[args.site]
    (site,) = overlap_hlo.remarks(text, hardware=args.hardware,
                                  bidirectional=args.bidirectional, threshold_mib=0)
    before, after = lanes(site.estimate)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    ring = "bidirectional ring" if args.bidirectional else "one stream"
    draw(before, after, f"{args.model} {args.site}, {args.tokens} tokens, tp={args.tp}, "
         f"{args.hardware}, {ring}: {site.estimate.format()}", args.out)
    print(f"wrote {args.out}.png and {args.out}.svg: {site.estimate.format()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Draw modelled TPU schedules (before and after the rewrite) as a timeline.

matplotlib comes with the `bench` extra and is imported only when a timeline is drawn.
"""
from __future__ import annotations

import io

from overlap_hlo.targets.schedule import Analysis

COLORS = {"matmul": "#3b6fb6", "compute": "#9aa5b1", "copy": "#e39c37", "wait": "#d1495b",
          "permute": "#2a9d8f", "collective": "#8e5ea2"}


class MissingMatplotlib(ImportError):
    """Drawing needs matplotlib."""


def render(panels: dict[str, Analysis], image_format: str | None,
           title: str = "") -> bytes:
    """One panel per analysis (e.g. {"original": a, "rewritten": b}), lanes "compute"
    and one per link direction, as the bytes of an image file ("svg" or "png")."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise MissingMatplotlib("drawing a timeline needs matplotlib: "
                                "pip install 'overlap-hlo[bench]'") from None
    end = max((a.total_us for a in panels.values()), default=1.0) or 1.0
    lanes_of = {name: ["compute"] + sorted({s.lane for s in a.spans if s.lane != "compute"})
                for name, a in panels.items()}
    height = 1.0 + sum(0.7 + 0.35 * len(lanes) for lanes in lanes_of.values())
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, height), squeeze=False,
                             gridspec_kw={"height_ratios": [len(v) + 1 for v in lanes_of.values()]})
    for ax, (name, analysis) in zip(axes[:, 0], panels.items()):
        lanes = lanes_of[name]
        for row, lane in enumerate(lanes):
            for span in analysis.spans:
                if span.lane == lane:
                    ax.barh(row, span.end_us - span.start_us, left=span.start_us,
                            color=COLORS.get(span.kind, "#cccccc"), height=0.7,
                            linewidth=0)
        ax.set_yticks(range(len(lanes)), lanes)
        ax.invert_yaxis()
        ax.set_xlim(0, end * 1.02)
        ax.set_title(f"{name}: {analysis.total_us:.0f} us modelled, "
                     f"{analysis.exposed_us:.0f} us waiting on communication",
                     fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("microseconds")
    fig.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()],
               loc="upper right", ncol=len(COLORS), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format=image_format, dpi=120)
    finally:
        plt.close(fig)
    return buffer.getvalue()

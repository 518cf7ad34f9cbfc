"""Draw latency and first-audio time against concurrency, after versus before, into one PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def draw(levels: list[dict[str, Any]], path: Path, *, title: str) -> Path:
    """Write the chart of ``levels`` (one dict per level with 'after' and 'before' summaries) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    callers = [level["callers"] for level in levels]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    panels = (
        (left, "latency", "submit → done (s)"),
        (right, "first_audio", "submit → first audio byte (s)"),
    )
    styles = {"after": ("tab:blue", "task queue (after)"), "before": ("tab:red", "synchronous (before)")}
    for axis, metric, label in panels:
        for side, (colour, name) in styles.items():
            for q, dash in (("p50", "-"), ("p99", "--")):
                key = f"{metric}_{q}"
                points = [(c, lv[side][key]) for c, lv in zip(callers, levels, strict=True) if lv.get(side)]
                points = [(c, v) for c, v in points if v is not None]
                if points:
                    xs, ys = zip(*points, strict=True)
                    axis.plot(xs, ys, dash, marker="o", color=colour, label=f"{name} {q}")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xticks(callers, [str(c) for c in callers])
        axis.set_xlabel("concurrent callers")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path

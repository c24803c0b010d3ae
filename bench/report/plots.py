"""A table's figure: one line per row against context length (log2 x), drawn with matplotlib's Agg backend."""

from __future__ import annotations

from pathlib import Path

from bench.report.accuracy import Curves, length_label
from bench.report.manifest import Plot


def line_plot(curves: Curves, plot: Plot, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator

    fig, ax = plt.subplots(figsize=(7, 4))
    xs_all: set[int] = set()
    for label, points in curves.items():
        if points:
            xs = sorted(points)
            xs_all.update(xs)
            ax.plot(xs, [points[x] for x in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ticks: list[int] = []
    for x in sorted(xs_all):  # one tick where lengths sit close (32,000 and 32,768; 7,000 and 8,192)
        if not ticks or x / ticks[-1] >= 1.3:
            ticks.append(x)
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: length_label(int(round(x)))))
    ax.xaxis.set_minor_locator(NullLocator())
    if plot.logy:
        ax.set_yscale("log")
    ax.set_xlabel("context tokens (log2)")
    ax.set_ylabel(plot.ylabel)
    ax.set_title(plot.title, fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)

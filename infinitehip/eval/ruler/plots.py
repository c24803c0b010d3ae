"""Accuracy heatmaps (length x depth) of a RULER sweep, one PNG per task, beside the results JSON."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["accuracy_grid", "write_heatmaps"]


def accuracy_grid(results: list[dict]) -> tuple[list[int], list[float], list[list[float | None]]]:
    """(lengths, depths, accuracy[length][depth]); None where a cell has no sample."""
    lengths = sorted({r["length"] for r in results})
    depths = sorted({r["depth"] for r in results})
    grid: list[list[float | None]] = []
    for length in lengths:
        row = []
        for d in depths:
            hits = [r["correct"] for r in results if r["length"] == length and r["depth"] == d]
            row.append(sum(hits) / len(hits) if hits else None)
        grid.append(row)
    return lengths, depths, grid


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def write_heatmaps(results: list[dict], json_path: str | Path, method: str) -> list[Path]:
    """``<json stem>.<method>.<task>.png`` for each task in ``results``; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    import numpy as np

    json_path = Path(json_path)
    paths = []
    for task in dict.fromkeys(r["task"] for r in results):
        lengths, depths, grid = accuracy_grid([r for r in results if r["task"] == task])
        data = np.array([[np.nan if v is None else 100 * v for v in row] for row in grid], dtype=float)
        fig, ax = plt.subplots(figsize=(max(4.0, 1.5 + 0.8 * len(depths)), max(2.5, 1.2 + 0.5 * len(lengths))))
        im = ax.imshow(data, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        ax.set_yticks(range(len(lengths)), [str(n) for n in lengths])
        ax.set_xlabel("target needle depth")
        ax.set_ylabel("prompt tokens")
        for i in range(len(lengths)):
            for j in range(len(depths)):
                if not np.isnan(data[i, j]):
                    ax.text(j, i, f"{data[i, j]:.0f}", ha="center", va="center", fontsize=8)
        fig.colorbar(im, ax=ax, label="accuracy (%)")
        ax.set_title(f"{task}, {method}", fontsize=9)
        fig.tight_layout()
        path = json_path.with_name(f"{json_path.stem}.{_slug(method)}.{task}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths

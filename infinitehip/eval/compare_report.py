"""Reports of a method comparison: per-cell summary, markdown table, JSON (summary + every sample), PNG plot."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import mean

from infinitehip.eval.compare import CompareConfig, SampleRecord

FILES = {"markdown": "compare.md", "json": "compare.json", "plot": "compare.png"}


@dataclass
class CellSummary:
    """One (task, method, length): its samples over depths and trials."""

    task: str
    method: str
    length: int
    samples: int
    ran: int  # samples within the method's context limit
    correct: int
    context_limit: int
    prefill_seconds: float | None  # mean over the samples that ran
    decode_tokens_per_s: float | None  # total decoded tokens / total decode time
    peak_kv_bytes: int  # max over the samples
    dropped_tokens: float  # mean over the samples that ran

    @property
    def accuracy(self) -> float | None:
        """None when no sample fit the context."""
        return self.correct / self.ran if self.ran else None


def summarize(records: list[SampleRecord]) -> list[CellSummary]:
    cells: dict[tuple[str, str, int], list[SampleRecord]] = {}
    for r in records:
        cells.setdefault((r.task, r.method, r.length), []).append(r)
    out = []
    for (task, method, length), rs in cells.items():
        ran = [r for r in rs if r.ran]
        decode_s = sum(r.decode_seconds or 0.0 for r in ran)
        out.append(CellSummary(
            task, method, length, len(rs), len(ran), sum(r.status == "ok" for r in ran), rs[0].context_limit,
            mean(r.prefill_seconds for r in ran) if ran else None,
            sum(r.decode_tokens for r in ran) / decode_s if decode_s > 0 else None,
            max((r.peak_kv_bytes for r in ran), default=0),
            mean(r.dropped_tokens for r in ran) if ran else 0.0,
        ))
    return out


def _fmt(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def markdown_table(cells: list[CellSummary], title: str) -> str:
    lines = [f"# {title}", ""]
    for task in dict.fromkeys(c.task for c in cells):
        lines += [f"## {task}", "",
                  "| method | length | accuracy | prefill s | decode tok/s | peak KV MiB | dropped tokens |",
                  "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
        for c in [c for c in cells if c.task == task]:
            if c.ran == 0:
                acc = f"exceeds context ({c.context_limit})"
            else:
                acc = f"{c.correct}/{c.ran} ({c.accuracy:.0%})" + (f", {c.samples - c.ran} exceed context" if c.ran < c.samples else "")
            lines.append(f"| {c.method} | {c.length} | {acc} | {_fmt(c.prefill_seconds, '.2f')} | "
                         f"{_fmt(c.decode_tokens_per_s, '.1f')} | {c.peak_kv_bytes / 2**20:.1f} | {c.dropped_tokens:.0f} |")
        lines.append("")
    return "\n".join(lines)


def plot_accuracy(cells: list[CellSummary], path: Path, title: str) -> None:
    """Accuracy vs length, one line per method, one panel per task; cells that exceed the context: x at the bottom."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(c.task for c in cells))
    methods = list(dict.fromkeys(c.method for c in cells))
    lengths = sorted({c.length for c in cells})
    styles = ["-", "--", "-.", ":"]
    markers = ["o", "s", "^", "D", "v", "P"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for i, method in enumerate(methods):
            row = sorted((c for c in cells if c.task == task and c.method == method), key=lambda c: c.length)
            ys = [math.nan if c.accuracy is None else 100 * c.accuracy for c in row]
            (line,) = ax.plot([c.length for c in row], ys, linestyle=styles[i % len(styles)],
                              marker=markers[i % len(markers)], alpha=0.8, label=method)
            exceeded = [c.length for c in row if c.accuracy is None]
            if exceeded:  # drawn as x on the floor: the prompt did not fit the method's context
                ax.plot(exceeded, [-3] * len(exceeded), "x", color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n) for n in lengths])
        ax.minorticks_off()
        ax.set_ylim(-5, 105)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(task)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_reports(records: list[SampleRecord], config: CompareConfig, meta: dict, output_dir: str | Path) -> dict[str, Path]:
    """compare.md, compare.json (config, meta, cells, every sample) and compare.png; returns their paths."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = summarize(records)
    title = f"Method comparison: {meta.get('model', 'model')}"
    paths = {kind: out / name for kind, name in FILES.items()}
    paths["markdown"].write_text(markdown_table(cells, title))
    payload = {
        "config": asdict(config),
        "meta": meta,
        "cells": [{**asdict(c), "accuracy": c.accuracy} for c in cells],
        "samples": [{**asdict(r), "decode_tokens_per_s": r.decode_tokens_per_s} for r in records],
    }
    paths["json"].write_text(json.dumps(payload, indent=2))
    plot_accuracy(cells, paths["plot"], title)
    return paths

"""Accuracy and KV-memory tables: per row, the samples of its files pooled by prompt length (right answers / prompts),
and the KV cache each run allocated at its longest prompt."""

from __future__ import annotations

from collections import defaultdict

from bench.report.manifest import Manifest, Row, Table
from bench.report.store import ResultsError, samples

MIB = 1024 * 1024
Lines = list[tuple[Row, list[str]]]
Curves = dict[str, dict[int, float]]


def length_label(n: int) -> str:
    if n >= 1048576:
        return f"{round(n / 1048576)}M"
    return f"{n // 1024}K" if n % 1024 == 0 else f"{round(n / 1000)}K"  # 32000 tokens: "32K"


def column_labels(lengths: list[int]) -> list[str]:
    """length_label, with exact token counts where two lengths would read the same (32,000 and 32,768)."""
    labels = [length_label(n) for n in lengths]
    return [f"{n:,}" if labels.count(label) > 1 else label for n, label in zip(lengths, labels)]


def row_samples(manifest: Manifest, row: Row, task: str | None) -> list[dict]:
    """The samples of the row's files with its task (haystack, --seeds values), each with the fields a cell needs."""
    pooled = []
    for name in row.files:
        data = manifest.load(row, name)
        try:
            rows = samples(data)
        except ResultsError as exc:
            raise ResultsError(f"{row.where}: {manifest.store / name}: {exc}") from None
        for s in rows:
            missing = [k for k in ("task", "length", "correct", "seed") if k not in s]
            if missing:
                raise ResultsError(f"{row.where}: {manifest.store / name}: a sample lacks {', '.join(missing)}")
        if row.seeds is not None:
            # eval ruler numbers a sample seed * 100,000 + i; a passkey sweep is one file per --seed
            keep = set(row.seeds)
            rows = ([s for s in rows if s["seed"] // 100_000 in keep] if "samples" in data
                    else rows if data.get("seed") in keep else [])
        pooled += [s for s in rows if (task is None or s["task"] == task)
                   and (row.haystack is None or s.get("haystack") == row.haystack)]
    if not pooled:
        raise ResultsError(f"{row.where}: its files hold no {task or ''} samples"
                           + (f" of haystack {row.haystack}" if row.haystack else "")
                           + (f" of seeds {list(row.seeds)}" if row.seeds is not None else ""))
    return pooled


def cell(rows: list[dict]) -> str:
    return f"{sum(bool(s['correct']) for s in rows)}/{len(rows)}" if rows else "–"


def accuracy(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    columns = column_labels(list(table.lengths)) + (["all"] if table.total else [])
    lines, curves = [], {}
    for row in rows:
        by_length = defaultdict(list)
        for s in row_samples(manifest, row, row.task or table.task):
            by_length[s["length"]].append(s)
        cells = [cell(by_length[n]) for n in table.lengths]
        if table.total:
            cells.append(cell([s for n in table.lengths for s in by_length[n]]))
        lines.append((row, cells))
        if row.seeds is None:  # a one-seed row is a subset of its method's row: tabled, not plotted
            curves[row.label] = {n: sum(s["correct"] for s in by_length[n]) / len(by_length[n])
                                 for n in table.lengths if by_length[n]}
    return columns, lines, curves


def kv_memory(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    per_row: list[dict[int, float]] = []
    for row in rows:
        points: dict[int, float] = {}
        per_row.append(points)
        for name in row.files:
            data = manifest.load(row, name)
            kv = data.get("kv_memory")
            if not isinstance(kv, dict) or not all(isinstance(v, dict) and "bytes" in v for v in kv.values()):
                raise ResultsError(f"{row.where}: {manifest.store / name} has no `kv_memory` block with `bytes`")
            longest = max(s["length"] for s in samples(data))  # the engine sizes its cache for the longest prompt
            points[longest] = sum(v["bytes"] for v in kv.values()) / MIB
    lengths = sorted({n for points in per_row for n in points})
    lines = [(row, [f"{points[n]:,.0f}" if n in points else "–" for n in lengths])
             for row, points in zip(rows, per_row)]
    return column_labels(lengths), lines, {row.label: points for row, points in zip(rows, per_row)}

"""The genre table pivoted to the generalization issue's acceptance: one line per (genre, method default), a column
per prompt length, each cell the default's largest run of that genre and length in the source table's rows, against
the acceptance's target (auto, the default method, and infinitehip and tokenselect >= 90% at 32K-128K and >= 85% at
512K-1M, infinipot >= 80% at 128K; dense is the calibration)."""

from __future__ import annotations

import re
from collections import defaultdict

from bench.report.accuracy import Curves, Lines, column_labels, row_samples
from bench.report.manifest import Manifest, Row, Table
from infinitehip.eval.ruler.haystacks import HAYSTACKS

# A row that runs a method's default (or dense's calibration); oracle rows force the needle in: not the default.
DEFAULT_ROW = re.compile(r"^(?P<method>\w+) \((default|calibration)\)")
METHODS = ("auto", "infinitehip", "tokenselect", "infinipot", "dense")  # auto: what a user who names none runs


def target(method: str, length: int) -> float | None:
    """The acceptance's share of prompts the default must read (None: no target, or the calibration)."""
    if method in ("auto", "infinitehip", "tokenselect"):
        return 0.9 if length <= 131072 else 0.85
    if method == "infinipot" and length == 131072:
        return 0.8
    return None


def largest_runs(table: Table, rows: list[Row], manifest: Manifest) -> dict[tuple[str, str, int], tuple]:
    """(genre, method, length) -> (prompts, date, correct, row, samples): of the rows running a method's default
    (oracle rows left out), the one with the most prompts of that genre and length, the latest among equals."""
    best: dict[tuple[str, str, int], tuple] = {}
    for row in rows:
        m = DEFAULT_ROW.match(row.label)
        if m is None or "oracle" in row.label or m["method"] not in METHODS:
            continue
        cells: dict[tuple[str, int], list[dict]] = defaultdict(list)
        for s in row_samples(manifest, row, row.task or table.task):
            cells[s["haystack"], s["length"]].append(s)
        for (genre, length), got in cells.items():
            key = (genre, m["method"], length)
            run = (len(got), row.date_range()[1], sum(bool(s["correct"]) for s in got), row, got)
            if length in table.lengths and (key not in best or run[:2] > best[key][:2]):
                best[key] = run
    return best


def genre_matrix(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    best = largest_runs(table, rows, manifest)
    lines = []
    genres = sorted({g for g, _, _ in best}, key=lambda g: (HAYSTACKS[g].split != "tuning", g) if g in HAYSTACKS else (2, g))
    for genre in genres:
        split = HAYSTACKS[genre].split if genre in HAYSTACKS else "unknown"
        for method in METHODS:
            runs = [best.get((genre, method, n)) for n in table.lengths]
            if not any(runs):
                continue
            cells, short = [], []
            for n, run in zip(table.lengths, runs):
                if run is None:
                    cells.append("–")
                    continue
                prompts, _, correct, _, _ = run
                cells.append(f"{correct}/{prompts}")
                goal = target(method, n)
                if goal is not None and correct < goal * prompts:
                    short.append(column_labels([n])[0])
            used = [r for r in runs if r is not None]
            dates = sorted(d for r in used for d in r[3].date_range())
            files = tuple(sorted({f for r in used for f in r[3].files}))
            summary = Row(table.id, f"{genre} ({split}), {method}", files,
                          f"python -m bench.report (from the rows of table '{table.rows_from}')",
                          " / ".join(dict.fromkeys(r[3].device for r in used)),  # each cell's device, once
                          dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}",
                          "calibration" if method == "dense" else
                          ("below target at " + ", ".join(short)) if short else "meets its target where run")
            lines.append((summary, cells))
    return column_labels(list(table.lengths)), lines, {}

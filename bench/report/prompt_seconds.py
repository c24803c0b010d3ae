"""Time per prompt through the public API, from the accuracy rows of another table: `eval ruler` times each prompt's
`LLM.chat` call (tokenized prompt in, the answer's text out: prefill and the answer's decode), so the genre cells
double as a measurement of what a user of the defaults waits. One line per (method default, prompt length, device):
the prompts, their median, 90th percentile and longest time; the longest is a file's first prompt where that one
compiled the kernels (said in the note). Where the runs recorded the engine's RequestMetrics, the medians of the two
parts before the answer: tokenizing the templated prompt, and its prefill to the first token ('-' where no sample
of the line has them)."""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict

from bench.report.accuracy import Curves, Lines, length_label, row_samples
from bench.report.genre_matrix import DEFAULT_ROW
from bench.report.manifest import Manifest, Row, Table
from bench.report.store import ResultsError

COLUMNS = ["prompts", "prompt tokens (median)", "median s", "p90 s", "longest s", "median tokenizing s",
           "median to first token s"]


def _median_of(samples: list[dict], key: str) -> str:
    values = [s[key] for s in samples if key in s]
    return f"{statistics.median(values):.2f}" if values else "-"


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]


def prompt_seconds(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    cells: dict[tuple[str, int, str], list[tuple[Row, dict, bool]]] = defaultdict(list)
    seen = set()  # a sample two rows read (a file split by haystack, filed twice) counts once
    for row in rows:
        m = DEFAULT_ROW.match(row.label)
        if m is None or "oracle" in row.label:
            continue
        for name in row.files:
            run = [s for s in row_samples(manifest, dataclasses.replace(row, files=(name,)), row.task or table.task)
                   if s["length"] in table.lengths]
            for i, s in enumerate(run):
                if "seconds" not in s:
                    raise ResultsError(f"{row.where}: {manifest.store / name}: a sample lacks `seconds`")
                key = (name, s["task"], s.get("haystack"), s["length"], s.get("depth"), s["seed"])
                if key not in seen:
                    seen.add(key)
                    cells[m["method"], s["length"], row.device].append((row, s, i == 0))
    lines = []
    for (method, length, device), got in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
        seconds = [s["seconds"] for _, s, _ in got]
        longest = max(got, key=lambda g: g[1]["seconds"])
        used = list({id(r): r for r, _, _ in got}.values())
        dates = sorted(d for r in used for d in r.date_range())
        runs = f"{len(used)} row" + ("s" if len(used) > 1 else "") + f" of '{table.rows_from}'"
        tokens = statistics.median_low([s.get("prompt_tokens", s["length"]) for _, s, _ in got])
        summary = Row(table.id, f"{method} (default), {length_label(length)}",
                      tuple(sorted({f for r in used for f in r.files})),
                      f"python -m bench.report (from the rows of table '{table.rows_from}')", device,
                      dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}",
                      runs + "; the longest is a file's first prompt (kernel compilation)" if longest[2] else runs)
        samples = [s for _, s, _ in got]
        lines.append((summary, [str(len(seconds)), f"{tokens:,}", f"{statistics.median(seconds):.2f}",
                                f"{_p90(seconds):.2f}", f"{max(seconds):.2f}", _median_of(samples, "encode_seconds"),
                                _median_of(samples, "first_token_seconds")]))
    return COLUMNS, lines, {}

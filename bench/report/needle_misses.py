"""Misses by needle, from the accuracy rows of another table: a needle is one seed's code-word sentence (its key,
value and depth are the seed's, the same in every genre), so pooling a needle's prompts over genres and lengths
tells a needle the model reads badly from a prompt a method loses. One line per needle that some sparse default
missed, most missed first: each method's default (dense: its calibration within the trained length) as read /
prompts over the cells the genre matrix shows (each default's largest run of a genre and length), and where the
sparse defaults missed it; then one line pooling every other needle. A needle dense also misses within the trained
length is the model's reading limit, not a lost selection; one that only the sparse defaults miss is for the needle
trace and oracle to place in a stage."""

from __future__ import annotations

from collections import defaultdict

from bench.report.accuracy import Curves, Lines, length_label
from bench.report.genre_matrix import METHODS, largest_runs
from bench.report.manifest import Manifest, Row, Table

SHOWN = ("dense", "auto", "infinitehip", "tokenselect", "infinipot")
assert set(SHOWN) == set(METHODS)
WHERE_SHOWN = 6  # the note lists this many (genre, length) misses of a needle, then a count of the rest


def _needle(s: dict) -> tuple[str, str, str]:
    expected = s.get("expected")
    value = expected[0] if isinstance(expected, list) and expected else str(expected)
    return str(s["seed"]), str(value), str(s.get("depth", ""))


def _cell(got: list[bool]) -> str:
    return f"{sum(got)}/{len(got)}" if got else "–"


def needle_misses(table: Table, rows: list[Row], manifest: Manifest) -> tuple[list[str], Lines, Curves]:
    read: dict[tuple, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))  # needle -> method -> correct
    missed_at: dict[tuple, list[str]] = defaultdict(list)  # needle -> "genre length (method)" of sparse misses
    used: dict[tuple, dict[int, Row]] = defaultdict(dict)  # needle -> the rows read for it
    # the cells the genre matrix shows (each default's largest run of a genre and length): runs of defaults since
    # replaced stay out
    for (genre, method, length), (*_, row, samples) in sorted(largest_runs(table, rows, manifest).items()):
        for s in samples:
            needle = _needle(s)
            read[needle][method].append(bool(s["correct"]))
            used[needle][id(row)] = row
            if not s["correct"] and method != "dense":
                missed_at[needle].append(f"{genre} {length_label(length)} ({method})")
    order = sorted(missed_at, key=lambda n: (-len(missed_at[n]), n))
    lines = []
    for needle in order:
        seed, value, depth = needle
        depth_label = f", depth {float(depth):.0%}" if depth else ""
        where = missed_at[needle]
        note = "sparse defaults missed it at: " + "; ".join(where[:WHERE_SHOWN])
        if len(where) > WHERE_SHOWN:
            note += f"; and {len(where) - WHERE_SHOWN} more"
        lines.append((_summary(table, f"{value} (seed {seed}{depth_label})", list(used[needle].values()), note),
                      [_cell(read[needle][m]) for m in SHOWN]))
    rest = [n for n in read if n not in missed_at]
    if rest:
        pooled = {m: [c for n in rest for c in read[n][m]] for m in SHOWN}
        rows_used = list({id(r): r for n in rest for r in used[n].values()}.values())
        lines.append((_summary(table, f"every other needle ({len(rest)})", rows_used, "no sparse default missed any"),
                      [_cell(pooled[m]) for m in SHOWN]))
    return list(SHOWN), lines, {}


def _summary(table: Table, label: str, used: list[Row], note: str) -> Row:
    dates = sorted(d for r in used for d in r.date_range())
    return Row(table.id, label, tuple(sorted({f for r in used for f in r.files})),
               f"python -m bench.report (from the rows of table '{table.rows_from}')",
               " / ".join(sorted({r.device for r in used})),
               dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}", note)

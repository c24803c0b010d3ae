"""bench/results/manifest.toml as typed, validated records: the results page's tables and the rows each shows, every
row naming its JSON files, command, device and date."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from bench.report.store import MANIFEST, STORE, ResultsError, read_json

KINDS = ("accuracy", "kv-memory", "layer-decode", "decode", "hip-attn", "ttft", "prefix-ttft", "tensor-parallel", "batch-decode",
         "paged-decode", "method-latency", "server-latency", "resident-decode",
         "bounded-memory", "genre-matrix", "prompt-seconds", "needle-misses")
PIVOTS = ("genre-matrix", "prompt-seconds", "needle-misses")  # kinds that show the rows of another table (rows_from), none of their own
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class Plot:
    file: str  # under docs/figures/
    title: str
    ylabel: str
    logy: bool = False


@dataclass(frozen=True)
class Table:
    id: str
    kind: str
    title: str
    text: str
    lengths: tuple[int, ...] = ()  # accuracy: the columns
    task: str | None = None  # accuracy: the rows' task unless a row names its own
    total: bool = False  # accuracy: a column summing the row's cells
    plot: Plot | None = None
    rows_from: str | None = None  # PIVOTS: the table whose rows it shows (it has none of its own)


@dataclass(frozen=True)
class Row:
    table: str
    label: str
    files: tuple[str, ...]  # relative to bench/results/
    command: str
    device: str
    date: str  # "YYYY-MM-DD" or "YYYY-MM-DD to YYYY-MM-DD"
    note: str = ""
    task: str | None = None
    haystack: str | None = None  # accuracy: only the samples of this haystack (a file may hold several genres)
    seeds: tuple[int, ...] | None = None  # accuracy: only the samples of these --seeds values
    select: dict = field(default_factory=dict)  # speed kinds: which entries of the JSON the row shows
    source: str | None = None  # speed kinds: the JSON list the row reads (e.g. dense_layerwise)

    @property
    def where(self) -> str:
        return f"manifest row {self.label!r} of table {self.table!r}"

    def date_range(self) -> tuple[str, str]:
        dates = DATE.findall(self.date)
        return min(dates), max(dates)


@dataclass(frozen=True)
class Manifest:
    intro: str
    tables: tuple[Table, ...]
    rows: tuple[Row, ...]
    store: Path

    def rows_of(self, table: Table) -> list[Row]:
        source = table.rows_from or table.id
        return [r for r in self.rows if r.table == source]

    def load(self, row: Row, name: str) -> dict:
        return read_json(self.store / name, row.where)


def _fields(entry: dict, cls, where: str) -> dict:
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ResultsError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return entry


def _table(entry: dict, path: Path) -> Table:
    where = f"{path}: table {entry.get('id', '?')!r}"
    entry = dict(_fields(entry, Table, where))
    for key in ("id", "kind", "title", "text"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise ResultsError(f"{where}: `{key}` must be a non-empty string")
    if entry["kind"] not in KINDS:
        raise ResultsError(f"{where}: kind {entry['kind']!r} is none of {', '.join(KINDS)}")
    if entry["kind"] in ("accuracy", *PIVOTS) and not entry.get("lengths"):
        raise ResultsError(f"{where}: an accuracy table needs `lengths`, its columns")
    if (entry["kind"] in PIVOTS) != bool(entry.get("rows_from")):
        raise ResultsError(f"{where}: `rows_from` names the table whose rows a {' or '.join(PIVOTS)} shows, and "
                           "only those kinds take it")
    if "plot" in entry:
        entry["plot"] = Plot(**_fields(entry["plot"], Plot, where + " plot"))
    entry["lengths"] = tuple(entry.get("lengths", ()))
    return Table(**entry)


def _row(entry: dict, path: Path, tables: dict[str, Table]) -> Row:
    where = f"{path}: row {entry.get('label', '?')!r}"
    entry = dict(_fields(entry, Row, where))
    for key in ("table", "label", "command", "device", "date"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise ResultsError(f"{where}: `{key}` must be a non-empty string")
    if entry["table"] not in tables:
        raise ResultsError(f"{where}: table {entry['table']!r} is not defined (tables: {', '.join(tables)})")
    files = entry.get("files")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise ResultsError(f"{where}: `files` must be a non-empty list of paths under {STORE.name}/")
    if not DATE.search(entry["date"]):
        raise ResultsError(f"{where}: date {entry['date']!r} holds no YYYY-MM-DD")
    entry["files"] = tuple(files)
    if "seeds" in entry:
        entry["seeds"] = tuple(entry["seeds"])
    return Row(**entry)


def load_manifest(path: Path = MANIFEST) -> Manifest:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ResultsError(f"cannot read the manifest {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ResultsError(f"{path} is not valid TOML: {exc}") from exc
    tables = {}
    for entry in data.get("table", []):
        table = _table(entry, path)
        if table.id in tables:
            raise ResultsError(f"{path}: table id {table.id!r} is defined twice")
        tables[table.id] = table
    rows = tuple(_row(entry, path, tables) for entry in data.get("row", []))
    intro = (data.get("page") or {}).get("intro", "")
    return Manifest(intro, tuple(tables.values()), rows, path.parent)

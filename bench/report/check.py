"""What `python -m bench.report check` and the tests hold the store to: each row's date and device agree with what
its files record, every file in the store is one a row reads, and docs/results.md is the manifest's rendering."""

from __future__ import annotations

from bench.report.manifest import Manifest
from bench.report.page import PAGE, render
from bench.report.store import ResultsError, recorded_runs


def check_records(manifest: Manifest) -> None:
    """A row's date range holds every date its files record; its device names every device they record."""
    for row in manifest.rows:
        first, last = row.date_range()
        for name in row.files:
            for run in recorded_runs(manifest.load(row, name)):
                date, device = str(run.get("date") or "")[:10], str(run.get("device") or "")
                if date and not first <= date <= last:
                    raise ResultsError(f"{row.where}: {name} records date {date}, outside the row's {row.date}")
                if device and device.lower() not in row.device.lower():
                    raise ResultsError(f"{row.where}: {name} records device {device!r}, not named in the row's "
                                       f"{row.device!r}")


def check_store(manifest: Manifest) -> None:
    """Every JSON under the store is read by some row (superseded runs are deleted, not kept beside)."""
    used = {name for row in manifest.rows for name in row.files}
    stray = sorted(str(p.relative_to(manifest.store)) for p in manifest.store.rglob("*.json")
                   if str(p.relative_to(manifest.store)) not in used)
    if stray:
        raise ResultsError(f"{len(stray)} file(s) under {manifest.store} that no manifest row reads: "
                           + ", ".join(stray[:10]))


def check_page(manifest: Manifest) -> None:
    if not PAGE.exists() or PAGE.read_text() != render(manifest):
        raise ResultsError(f"{PAGE} is not the manifest's rendering: run `python -m bench.report`")


def check(manifest: Manifest) -> None:
    check_records(manifest)
    check_store(manifest)
    check_page(manifest)

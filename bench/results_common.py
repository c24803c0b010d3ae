"""What the results page's modules share: where the JSON lives and how cells and lengths are written."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
D25 = "2026-11-25/realtext/gemma3/"
D26 = "2026-11-26/"
D27 = "2026-11-27/"


def cell(rows: list[dict]) -> str:
    if not rows:
        return "–"
    hits = sum(bool(s["correct"]) for s in rows)
    return f"{hits}/{len(rows)}"


def length_label(n: int) -> str:
    if n >= 1048576:
        return f"{round(n / 1048576)}M"
    return f"{n // 1024}K" if n % 1024 == 0 else f"{round(n / 1000)}K"  # 32000 tokens: "32K"


def passkey_rows(folder: str, stem: str) -> list[dict]:
    """The passkey samples of seeds 0-1 (files stem_s0.json, stem_s1.json under folder; missing ones skipped)."""
    rows = []
    for seed in (0, 1):
        path = RESULTS / folder / f"{stem}_s{seed}.json"
        rows += json.loads(path.read_text())["results"] if path.exists() else []
    return rows

"""`python -m bench.report add RUN.json --table ID --label TEXT`: a new run into the store under its canonical name,
and its [[row]] appended to the manifest (command, device and date read from the file unless given)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from bench.report.manifest import load_manifest
from bench.report.store import MANIFEST, ResultsError, canonical_name, model_tag, read_json, recorded_runs, suite_name

DROP = {"--output", "--model-cache-dir", "--plots"}  # flags that say where files went, not what ran
# The genres' texts as the docs have a user pack them (`python -m bench.device_corpora pack .corpora`): a run's own
# folder is a path on the machine that ran it.
HAYSTACK_DIR = ".corpora"


def _without_paths(argv: list[str], model: str | None) -> list[str]:
    """A run's argv without the flags that name this machine's files; --model by `model` or its file's name, and
    --haystack-dir by the documented pack folder."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in DROP:
            skip = True
            continue
        flag = argv[i - 1] if i else ""
        out.append((model or Path(arg).name) if flag == "--model" else HAYSTACK_DIR if flag == "--haystack-dir" else arg)
    return out


def ruler_command(data: dict, model: str) -> str:
    """`infinitehip eval ruler` as it ran: the file's own argv when it has one, else rebuilt from its ruler_config
    (method flags beyond --method are then the caller's to give with --command)."""
    argv = (data.get("meta") or {}).get("argv")
    if argv:
        return "infinitehip eval ruler " + shlex.join(_without_paths(argv, model))
    cfg, engine = data["ruler_config"], data.get("engine") or {}
    method = data["method"]["name"] if isinstance(data.get("method"), dict) else data.get("method")
    parts = ["infinitehip eval ruler", "--model", model, "--haystacks", *cfg["haystacks"], "--tasks", *cfg["tasks"],
             "--method", str(method), "--lengths", *map(str, cfg["lengths"]), "--seeds", *map(str, cfg["seeds"])]
    if engine.get("prefill_chunk_size"):
        parts += ["--prefill-chunk-size", str(engine["prefill_chunk_size"])]
    if cfg.get("vary_haystack") is False:
        parts += ["--vary-haystack", "false"]
    if cfg.get("samples_per_depth", 2) != 2:
        parts += ["--samples-per-depth", str(cfg["samples_per_depth"])]
    return " ".join(parts)


def _toml(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value)


def add(run: Path, table: str, label: str, setting: str = "default", note: str = "", command: str | None = None,
        device_tag: str | None = None, model: str | None = None, name: str | None = None,
        per_haystack: bool = False, manifest_path: Path = MANIFEST) -> Path:
    """Store `run`, append its row (per_haystack: one row per haystack of a ruler file, labelled "LABEL, GENRE")."""
    manifest = load_manifest(manifest_path)
    if table not in {t.id for t in manifest.tables}:
        raise ResultsError(f"table {table!r} is not in {manifest_path}: add its [[table]] first "
                           f"(tables: {', '.join(t.id for t in manifest.tables)})")
    data = read_json(run, "add")
    if model is None and "ruler_config" in data:
        model = model_tag((data.get("model") or {}).get("source", ""))
    if name is None:
        ruler_or_passkey = "ruler_config" in data or (data.get("meta") or {}).get("suite") == "accuracy"
        name = (canonical_name if ruler_or_passkey else suite_name)(data, setting, device=device_tag, model=model)
    rel = name
    target = manifest.store / rel
    if target.exists() and target.read_bytes() != run.read_bytes():
        raise ResultsError(f"{target} exists and differs from {run}: a second run of the same setting needs its own "
                           "name (--name) or replaces the first by hand")
    runs = recorded_runs(data)
    dates = sorted({str(r["date"])[:10] for r in runs if r.get("date")})
    devices = sorted({str(r["device"]) for r in runs if r.get("device")})
    if not dates or not devices:
        raise ResultsError(f"{run} records no date or device: the page needs both")
    if command is None and "ruler_config" in data:
        command = ruler_command(data, model or "MODEL")
    elif command is None:
        argv = (data.get("meta") or {}).get("argv")
        if not argv:
            raise ResultsError(f"{run} records no command (no meta.argv): pass --command")
        command = f"python -m bench {data['meta']['suite']} " + shlex.join(_without_paths(argv, model))
    dtype = next((str(r["dtype"]).replace("torch.", "") for r in runs if r.get("dtype")), "")
    row = {"table": table, "label": label, "files": [rel], "command": command,
           "device": ", ".join(devices) + (f", {dtype}" if dtype else ""),
           "date": dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}", "note": note}
    rows = [row]
    if per_haystack:
        haystacks = sorted({s["haystack"] for s in data.get("samples") or [] if "haystack" in s})
        if not haystacks:
            raise ResultsError(f"{run} holds no ruler samples with a haystack: --per-haystack needs a ruler run")
        rows = [{**row, "label": f"{label}, {h}", "haystack": h} for h in haystacks]
    before = manifest_path.read_text()
    text = before.rstrip("\n")
    for entry in rows:
        text += "\n\n[[row]]\n" + "".join(f"{key} = {_toml(value)}\n" for key, value in entry.items() if value != "")
    existed = target.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(run.read_bytes())
    manifest_path.write_text(text)
    try:
        load_manifest(manifest_path)  # the appended rows parse; if not, leave the store as it was
    except ResultsError:
        manifest_path.write_text(before)
        if not existed:
            target.unlink()
        raise
    return target

"""The results store's layout: one JSON per run under bench/results/SUITE/DEVICE/MODEL/, named by what it measures
(haystack, task, method and setting, lengths, seeds), never by the day or the batch it ran in."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "bench" / "results"
MANIFEST = STORE / "manifest.toml"
# checkpoint file stems the GPU plans load by path, and the names the package registers
MODEL_ALIASES = {"gemma": "gemma3-270m", "smol": "smollm2-135m", "embedded": "smollm2-135m",
                 "random8b": "llama3-8b-random"}


class ResultsError(ValueError):
    """A manifest entry or a result file that the results page cannot use; the message names the file."""


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise ResultsError(f"{what}: result file {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{what}: result file {path} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ResultsError(f"{what}: result file {path} holds a {type(data).__name__}, not a JSON object")
    return data


def length_tag(n: int) -> str:
    """Exact and short: 1048576 -> 1m, 65536 -> 64k, 32000 -> 32000 (so 32000 and 32768 never share a name)."""
    if n % 1048576 == 0:
        return f"{n // 1048576}m"
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def seeds_tag(seeds: list[int]) -> str:
    seeds = sorted(set(seeds))
    if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"s{seeds[0]}-{seeds[-1]}"
    return "s" + "_".join(map(str, seeds))


def device_tag(device: str, gpus: int = 1) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; two of them -> 'h100x2'; 'cpu' -> 'cpu'."""
    if device.lower().startswith("cpu"):
        return "cpu"
    match = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", device)
    if not match:
        raise ResultsError(f"no device name in {device!r}: pass --device-tag")
    return match.group(1).lower() + (f"x{gpus}" if gpus > 1 else "")


def model_tag(source: str) -> str:
    """A run's model as the store names it: a built-in name, or a checkpoint path's stem mapped to that name."""
    built_in = re.match(r"built-in (\S+)", source)
    if built_in:
        return built_in.group(1)
    stem = Path(source).name.split(".")[0]
    return MODEL_ALIASES.get(stem, stem)


def recorded_runs(data: dict) -> list[dict]:
    """The (date, device) records a result file carries: eval's `runs`, the bench suites' `meta`, `header`."""
    runs = [r for r in data.get("runs") or [] if isinstance(r, dict)]
    for key in ("meta", "header"):
        block = data.get(key)
        if isinstance(block, dict) and (block.get("date") or block.get("device")):
            runs.append(block)
    return runs


def samples(data: dict) -> list[dict]:
    """The per-prompt records of a ruler run (`samples`) or a passkey sweep (`results`)."""
    rows = data.get("samples") if "samples" in data else data.get("results")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ResultsError("no per-prompt samples (a ruler run's `samples` or a passkey sweep's `results`)")
    return rows


def canonical_name(data: dict, setting: str, device: str | None = None, model: str | None = None) -> str:
    """The store path (relative to bench/results/) of a ruler run or a passkey sweep."""
    rows = samples(data)
    runs = recorded_runs(data)
    if device is None:
        if not runs or not runs[0].get("device"):
            raise ResultsError("the file records no device: pass --device-tag")
        device = device_tag(runs[0]["device"], int(runs[0].get("gpus") or 1))
    method = data["method"]["name"] if isinstance(data.get("method"), dict) else data.get("method")
    lengths = "-".join(length_tag(n) for n in sorted({r["length"] for r in rows}))
    tasks = "+".join(sorted({r["task"] for r in rows}))
    if "ruler_config" in data:
        if model is None:
            model = model_tag((data.get("model") or {}).get("source", ""))
        config = data["ruler_config"]
        haystack = "+".join(sorted({r["haystack"] for r in rows}))
        if config.get("vary_haystack") is False or "vary_haystack" not in config:
            haystack += "-fixed"  # every seed's needle at one position of the same text
        seeds = seeds_tag([r["seed"] // 100_000 for r in rows])  # eval ruler: sample seed = seed * 100,000 + i
        return f"ruler/{device}/{model}/{haystack}.{tasks}.{method}-{setting}.{lengths}.{seeds}.json"
    if model is None:
        model = model_tag(str((data.get("meta") or {}).get("args", {}).get("model", "")))
    return f"accuracy/{device}/{model}/{tasks}.{method}-{setting}.{lengths}.{seeds_tag([data.get('seed', 0)])}.json"


def suite_name(data: dict, setting: str, device: str | None = None, model: str | None = None) -> str:
    """The store path of any `python -m bench` suite's JSON: suite, device, model, setting and contexts from meta."""
    meta = data.get("meta")
    if not isinstance(meta, dict) or not meta.get("suite"):
        raise ResultsError("the file has no `meta` block naming its suite: pass --name")
    args = meta.get("args") or {}
    if device is None:
        if not meta.get("device"):
            raise ResultsError("the file records no device: pass --device-tag")
        device = device_tag(str(meta["device"]), int(meta.get("gpus") or 1))
    if model is None:  # the one-layer suites time random K/V of Llama-3-8B shapes, no model
        model = model_tag(str(args["model"])) if args.get("model") else "llama3-8b-layer"
    contexts = args.get("contexts") or args.get("lengths") or ([args["context"]] if args.get("context") else [])
    method = args.get("method") or "infinitehip"
    tag = "-".join(length_tag(int(n)) for n in contexts) or "all"
    return f"{meta['suite']}/{device}/{model}/{method}-{setting}.{tag}.json"

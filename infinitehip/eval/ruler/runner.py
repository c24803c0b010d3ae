"""The RULER sweep: tasks x haystacks x lengths x depths x seeds with one engine, greedy.

Results go to one JSON file, rewritten atomically after every sample, so a crashed sweep resumes:
samples already in the file (same task, haystack, length, depth, seed, oracle, varied haystack or
not, haystack span) are skipped when its model and method match this run's; a file from another model or method is
an error, never overwritten.  Each invocation appends its environment (date, device, dtype, versions,
git commit, index of its first sample) to the file's "runs", so a sweep cut short still says where its
samples ran.  Sample count per (task, haystack, length) cell = depths x seeds x samples_per_depth; the
defaults give 5 x 3 x 2 = 30, each in its own text (``vary_haystack``).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import os
import subprocess
import time
from dataclasses import dataclass
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console
from rich.table import Table

from infinitehip.config.sampling import SamplingParams

from .haystacks import HAYSTACKS, get_haystack
from .positions import needle_token_positions
from .tasks import TASKS, haystack_start, make_ruler_sample

__all__ = ["RulerConfig", "context_tokens_needed", "run_metadata", "run_ruler", "sample_seed", "task_table"]


@dataclass(frozen=True)
class RulerConfig:
    tasks: tuple[str, ...] = tuple(TASKS)  # RULER-style tasks to run
    haystacks: tuple[str, ...] = tuple(HAYSTACKS)  # haystack genres (eval/ruler/haystacks.py: tuning and held-out)
    lengths: tuple[int, ...] = (4096,)  # templated prompt lengths in tokens of the model's tokenizer
    depths: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)  # target needle depth, 0..1
    seeds: tuple[int, ...] = (0, 1, 2)  # needle/value seeds per depth
    samples_per_depth: int = 2  # per seed and depth, each with its own derived seed
    vary_haystack: bool = True  # each sample's haystack begins at its own seed-drawn point of the corpus (false: at
    # its first token, so one length and depth puts every seed's needle in the same text; the suite's first results)
    haystack_span: int = 0  # diagnostic: repeat only this many corpus tokens (0: the whole corpus; the essays hold
    # ~154K Gemma 3 tokens, so a 1M prompt already repeats them ~7 times: this asks whether repetition or length hurts)
    oracle: bool = False  # force the target needle tokens into every layer's selection (upper bound)
    trace: bool = False  # record how much of the needle each selection keeps
    # A folder of exported haystack texts (NAME.txt.gz + manifest.json, bench/device_corpora.py) read instead of the
    # installed packages, for a machine without them; None: the packages
    haystack_dir: str | None = None
    output: str = "ruler/ruler.json"  # results; heatmaps are written beside it
    plots: bool = True  # one accuracy heatmap (length x depth) per task

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"tasks": tuple(TASKS), "haystacks": tuple(HAYSTACKS)}  # the CLI's

    def __post_init__(self) -> None:
        for name in ("tasks", "haystacks"):
            object.__setattr__(self, name, tuple(str(x) for x in getattr(self, name)))
        object.__setattr__(self, "lengths", tuple(int(x) for x in self.lengths))
        object.__setattr__(self, "depths", tuple(float(x) for x in self.depths))
        object.__setattr__(self, "seeds", tuple(int(x) for x in self.seeds))
        unknown = [t for t in self.tasks if t not in TASKS]
        if not self.tasks or unknown:
            raise ValueError(f"tasks must be among {list(TASKS)}, got {self.tasks}")
        if not self.haystacks or any(h not in HAYSTACKS for h in self.haystacks):
            raise ValueError(f"haystacks must be among {list(HAYSTACKS)}, got {self.haystacks}")
        if not self.lengths or min(self.lengths) <= 0:
            raise ValueError(f"lengths must be positive token counts, got {self.lengths}")
        if not self.depths or not all(0.0 <= d <= 1.0 for d in self.depths):
            raise ValueError(f"depths must lie in [0, 1], got {self.depths}")
        if not self.seeds or min(self.seeds) < 0:
            raise ValueError(f"seeds must be non-negative ints, got {self.seeds}")
        if not 1 <= self.samples_per_depth <= 99:
            raise ValueError(f"samples_per_depth must be in 1..99, got {self.samples_per_depth}")
        if self.haystack_span < 0:
            raise ValueError(f"haystack_span must be >= 0 tokens (0: the whole corpus), got {self.haystack_span}")
        if not self.output:
            raise ValueError("output: give a JSON path")


def sample_seed(seed: int, rep: int, depth: float) -> int:
    """Distinct per (seed, rep, depth); the same across lengths, so length effects compare like with like."""
    return seed * 100_000 + rep * 1_000 + int(round(depth * 1000))


def context_tokens_needed(config: RulerConfig) -> int:
    """Engine context limit for the longest prompt (sized within max(16, 1%)) plus the longest answer."""
    return int(max(config.lengths) * 1.01) + 16 + max(TASKS[t].answer_tokens for t in config.tasks)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def run_metadata(llm: Any) -> dict:
    """Model, method (name + full config), engine config; what a resumed file must match (model, method)."""
    engine = getattr(llm, "engine", None)
    loaded = getattr(engine, "loaded", None)
    model_config = getattr(engine, "model_config", None)
    summary = {}
    if dataclasses.is_dataclass(model_config):
        summary = {k: v for k, v in dataclasses.asdict(model_config).items() if isinstance(v, (int, float, str, bool))}
    method = getattr(engine, "method", None)
    method_config = getattr(method, "config", None)
    return _jsonable({
        "model": {"source": getattr(loaded, "source", None) or llm.config.model, "config": summary},
        "method": {"name": llm.config.method,
                   "config": dataclasses.asdict(method_config) if dataclasses.is_dataclass(method_config) else None},
        # the method's config is under "method"; the offload config stays with the engine's fields
        "engine": {k: v for k, v in dataclasses.asdict(llm.config).items() if k != "method_config"},
        "kv_memory": engine.kv_memory() if hasattr(engine, "kv_memory") else None,  # per layer type
        # every effective value of the engine (context, KV tokens and pages, banks: config/resolved.py)
        "resolved_config": engine.resolved.as_dict() if hasattr(engine, "resolved") else None,
        "git_commit": _git_commit(),
    })


def run_environment(llm: Any) -> dict:
    """Where and with what this invocation ran: one entry of the file's "runs" (a resumed sweep adds one per run)."""
    import platform

    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    engine = getattr(llm, "engine", None)
    device = torch.device(getattr(engine, "device", None) or "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": name, "dtype": str(getattr(engine, "dtype", None)),
            "torch": torch.__version__, "triton": triton_version, "python": platform.python_version()}


def _key(task: str, haystack: str, length: int, depth: float, seed: int, oracle: bool, varied: bool,
         span: int) -> tuple:
    """What makes a sample distinct in a results file (a resumed sweep skips the keys already there)."""
    return task, haystack, int(length), round(float(depth), 6), int(seed), bool(oracle), bool(varied), int(span)


def _result_key(r: dict) -> tuple:
    return _key(r["task"], r["haystack"], r["length"], r["depth"], r["seed"], r.get("oracle", False),
                r.get("haystack_start", 0.0) > 0, r.get("haystack_span", 0))


def _load_previous(path: Path, meta: dict) -> tuple[list[dict], list[dict]]:
    """-> (samples, runs) of an earlier invocation's file; ([], []) when there is none."""
    if not path.exists():
        return [], []
    data = json.loads(path.read_text())
    for field in ("model", "method"):
        if data.get(field) != meta[field]:
            raise ValueError(f"{path} holds results of another {field} ({data.get(field)!r}); "
                             "choose another --output or remove the file")
    return list(data.get("samples", [])), list(data.get("runs", []))


def _write(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)  # readers never see a half-written file


def _chat(llm: Any, messages: list[dict], params: SamplingParams, positions: list[int] | None, oracle: bool):
    if positions is None:
        return llm.chat(messages, params)
    if "needle_tokens" not in inspect.signature(llm.chat).parameters:
        raise RuntimeError("this engine has no needle probe (LLM.chat(needle_tokens=..., oracle=...)); "
                           "run without --oracle / --trace")
    return llm.chat(messages, params, needle_tokens=positions, oracle=oracle)


def trace_summary(trace: dict | None) -> str:
    """The trace's top-level numbers, for the per-sample line (the full dict goes to the JSON)."""
    if not trace:
        return ""
    nums = {k: v for k, v in trace.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in nums.items())


def run_ruler(llm: Any, config: RulerConfig, console: Console | None = None) -> list[dict]:
    """Every sample of the sweep not already in ``config.output``; returns all results of the file."""
    console = console or Console()
    for h in config.haystacks:
        get_haystack(h, config.haystack_dir)
    meta = run_metadata(llm)
    path = Path(config.output)
    results, runs = _load_previous(path, meta)
    done = {_result_key(r) for r in results}
    # one entry per invocation, so a resumed file still says which samples ran where (first_sample: index)
    runs.append({**run_environment(llm), "git_commit": meta["git_commit"], "first_sample": len(results)})
    payload = {**meta, "ruler_config": _jsonable(dataclasses.asdict(config)),
               "haystacks": {h: HAYSTACKS[h].source for h in config.haystacks},
               "haystack_splits": {h: HAYSTACKS[h].split for h in config.haystacks}, "runs": runs, "samples": results}
    skipped, pending = 0, []
    for task in config.tasks:
        for haystack in config.haystacks:
            for length in config.lengths:
                for depth in config.depths:
                    for seed in config.seeds:
                        for rep in range(config.samples_per_depth):
                            s = sample_seed(seed, rep, depth)
                            varied = config.vary_haystack and haystack_start(s) > 0
                            if _key(task, haystack, length, depth, s, config.oracle, varied,
                                    config.haystack_span) in done:
                                skipped += 1
                            else:
                                pending.append((task, haystack, length, depth, s))
    # The next sample is built (tokenized to length: seconds at 1M) on a thread while the engine runs this one, with
    # its own copy of the tokenizer (a fast tokenizer is not safe to call from two threads at once); a tokenizer that
    # cannot be copied builds each sample in turn.
    builder = _tokenizer_copy(llm.tokenizer) if len(pending) > 1 else None
    with ThreadPoolExecutor(max_workers=1) as pool:
        build = lambda job: None if builder is None else pool.submit(_build_one, builder, config, *job)
        upcoming = build(pending[0]) if pending else None
        for i, job in enumerate(pending):
            built = upcoming.result() if upcoming is not None else _build_one(llm.tokenizer, config, *job)
            upcoming = build(pending[i + 1]) if i + 1 < len(pending) else None
            result = _run_one(llm, config, job, built)
            results.append(result)
            done.add(_result_key(result))
            _write(path, payload)
            console.print(_line(result))
    if skipped:
        console.print(f"resumed: {skipped} samples already in {path}")
    _write(path, payload)
    current = [r for r in results if bool(r.get("oracle")) == config.oracle and r["task"] in config.tasks
               and (r.get("haystack_start", 0.0) > 0) == config.vary_haystack
               and int(r.get("haystack_span", 0)) == config.haystack_span]
    label = meta["method"]["name"] + (" (oracle)" if config.oracle else "")
    for task in config.tasks:
        console.print(task_table([r for r in current if r["task"] == task], f"{task}, method {label}"))
    if config.plots:
        from .plots import write_heatmaps

        for p in write_heatmaps(current, path, label):
            console.print(f"wrote {p}")
    console.print(f"wrote {path}")
    return results


def _tokenizer_copy(tokenizer: Any) -> Any | None:
    try:
        return copy.deepcopy(tokenizer)
    except Exception:  # noqa: BLE001 - any tokenizer object may come; building in turn is always correct
        return None


def _build_one(tokenizer: Any, config: RulerConfig, task: str, haystack: str, length: int, depth: float,
               seed: int) -> tuple[Any, list | None]:
    """One sample's prompt, and its needles' token positions when the run traces or probes them."""
    sample = make_ruler_sample(tokenizer, task, haystack, length, depth, seed, config.vary_haystack,
                               config.haystack_span, config.haystack_dir)
    positions = None
    if config.oracle or config.trace:
        positions = needle_token_positions(tokenizer, sample.messages, sample.needle_texts)
    return sample, positions


def _run_one(llm: Any, config: RulerConfig, job: tuple, built: tuple[Any, list | None]) -> dict:
    task, haystack, length, depth, seed = job
    sample, positions = built
    params = SamplingParams(temperature=0.0, max_tokens=TASKS[task].answer_tokens)
    start, wall_start = time.perf_counter(), time.time()
    (out,) = _chat(llm, sample.messages, params, positions, config.oracle)
    seconds = time.perf_counter() - start
    score = sample.score(out.text)
    # where the prompt's seconds went (an engine's RequestMetrics): templating and tokenizing before the engine took
    # it, then its prefill up to the first token
    metrics = getattr(out, "metrics", None)
    parts = {} if metrics is None or metrics.first_token_time is None else {
        "encode_seconds": round(metrics.arrival_time - wall_start, 3),
        "first_token_seconds": round(metrics.first_token_time - metrics.arrival_time, 3)}
    return {
        "task": task, "haystack": haystack, "split": HAYSTACKS[haystack].split, "length": length, "prompt_tokens": len(out.prompt_token_ids),
        "depth": depth, "seed": seed, "expected": list(sample.expected), "output": out.text,
        "correct": score == 1.0, "score": score, "seconds": round(seconds, 3), **parts,
        "dropped_tokens": getattr(out, "dropped_prompt_tokens", 0),
        "oracle": config.oracle, "needle_trace": _jsonable(getattr(out, "needle_trace", None)),
        "haystack_start": sample.haystack_start, "haystack_span": sample.haystack_span,
    }


def _line(r: dict) -> str:
    mark = "[green]ok[/]" if r["correct"] else ("[yellow]part[/]" if r["score"] > 0 else "[red]miss[/]")
    trace = trace_summary(r.get("needle_trace"))
    return (f"{r['task']} {r['haystack']} len={r['length']} depth={r['depth']:.2f} seed={r['seed']}"
            f"{' oracle' if r['oracle'] else ''}: {mark} expected {r['expected']} got {r['output'].strip()[:60]!r} "
            f"({r['seconds']:.1f}s{', ' + trace if trace else ''})")


def task_table(results: list[dict], title: str) -> Table:
    """Rows: length; columns: depth; cells: hits/n over haystacks and seeds; plus a total column."""
    table = Table(title=title)
    depths = sorted({r["depth"] for r in results})
    table.add_column("length")
    for d in depths:
        table.add_column(f"depth {d:.0%}")
    table.add_column("total")
    for length in sorted({r["length"] for r in results}):
        row = [r for r in results if r["length"] == length]
        cells = []
        for d in depths:
            hits = [r["correct"] for r in row if r["depth"] == d]
            cells.append(f"{sum(hits)}/{len(hits)}")
        table.add_row(str(length), *cells, f"{sum(r['correct'] for r in row)}/{len(row)}")
    return table

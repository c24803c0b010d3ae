"""Methods x tasks x lengths x depths on one model: accuracy, prefill time, decode speed, peak KV memory and
dropped prompt tokens per sample (`infinitehip eval compare`). Reports are written by `compare_report`.

Context rule: each method runs with its own default context limit (dense: the model's trained length,
infinitehip: 128K, streaming: unbounded, truncate: the trained length, reading head + tail of longer
prompts), raised up to `max_context` when that is given, so dense can be run past its trained length to
show it fail. A prompt that still does not fit is recorded as "exceeds_context", never cut (only a method
whose purpose is dropping input, `truncate`, reads fewer tokens, and the record says how many).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from rich.console import Console

from infinitehip.config.engine import EngineConfig
from infinitehip.config.methods import method_spec
from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.llm_engine import ContextLengthError, LLMEngine, load_engine_model
from infinitehip.engine.resolve import resolve_config
from infinitehip.eval.runner import ANSWER_TOKENS, TASKS, context_tokens_needed
from infinitehip.model.loading import LoadedModel


@dataclass(frozen=True)
class CompareConfig:
    # registered names, or name:preset
    methods: tuple[str, ...] = ("dense", "infinitehip", "tokenselect", "infinipot", "streaming", "truncate", "cascade", "hip")
    tasks: tuple[str, ...] = ("passkey", "niah")  # passkey (repeated filler) and/or niah (real essays)
    lengths: tuple[int, ...] = (2048, 8192, 32768)  # prompt lengths in tokens of the model's tokenizer
    depths: tuple[float, ...] = (0.1, 0.5, 0.9)  # needle depths, 0..1
    samples: int = 1  # samples per (task, method, length, depth), each with its own seed
    seed: int = 0  # first sample seed (sample i uses seed + i)
    # Raise each method's default context limit up to this many tokens (dense past its trained length, to
    # see it fail); None: default limits only. Prompts beyond the limit are recorded as exceeding it.
    max_context: int | None = None
    output_dir: str = "compare"  # compare.md, compare.json and compare.png go here

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"tasks": tuple(TASKS)}  # the CLI's allowed values

    def __post_init__(self) -> None:
        for name in ("methods", "tasks"):
            object.__setattr__(self, name, tuple(str(x) for x in getattr(self, name)))
        object.__setattr__(self, "lengths", tuple(int(x) for x in self.lengths))
        object.__setattr__(self, "depths", tuple(float(x) for x in self.depths))
        if not self.methods:
            raise ValueError("methods: name at least one attention method")
        for entry in self.methods:
            parse_method(entry)  # unknown method or preset -> ValueError naming it
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods lists a method twice: {self.methods}")
        if not self.tasks or any(t not in TASKS for t in self.tasks):
            raise ValueError(f"tasks must be among {sorted(TASKS)}, got {self.tasks}")
        if not self.lengths or min(self.lengths) <= 0:
            raise ValueError(f"lengths must be positive token counts, got {self.lengths}")
        if not self.depths or not all(0.0 <= d <= 1.0 for d in self.depths):
            raise ValueError(f"depths must lie in [0, 1], got {self.depths}")
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        if self.max_context is not None and self.max_context <= 0:
            raise ValueError(f"max_context must be positive, got {self.max_context}")


@dataclass(frozen=True)
class MethodRun:
    label: str  # how reports name it ("infinitehip:3k-fast")
    method: str  # registered name
    config: Any  # the method's config object (None for methods without settings)


def parse_method(entry: str) -> MethodRun:
    """`name` (default config) or `name:preset`."""
    name, _, preset = entry.partition(":")
    spec = method_spec(name)
    return MethodRun(entry, name, spec.config(preset or None) if spec.config_cls else spec.config(None))


@dataclass
class SampleRecord:
    task: str
    method: str
    length: int
    depth: float
    seed: int
    status: str  # "ok" | "miss" | "exceeds_context"
    answer: str
    output: str
    prompt_tokens: int  # the templated prompt as built
    read_tokens: int  # prompt tokens the model read (prompt_tokens - dropped_tokens; 0 when not run)
    dropped_tokens: int  # dropped by the method's prompt selection (truncate)
    context_limit: int  # the engine's context limit for this method
    prefill_seconds: float | None = None  # request start to its first token
    decode_tokens: int = 0  # tokens after the first
    decode_seconds: float | None = None
    peak_kv_pages: int = 0  # most KV pages the request held at once
    peak_kv_bytes: int = 0  # those pages' k + v over all layers
    error: str = ""

    @property
    def ran(self) -> bool:
        return self.status != "exceeds_context"

    @property
    def decode_tokens_per_s(self) -> float | None:
        if not self.decode_seconds or self.decode_tokens == 0:
            return None
        return self.decode_tokens / self.decode_seconds


def method_context_limit(default: int, needed: int, max_context: int | None) -> int:
    """The method's default limit, raised to at most max_context, and never above what the longest prompt needs."""
    return min(needed, max(default, max_context or 0))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_sample(engine: LLMEngine, label: str, task: str, length: int, depth: float, seed: int) -> SampleRecord:
    sample = TASKS[task](engine.tokenizer, length, depth, seed)
    ids = engine.encode_chat(sample.messages)
    record = SampleRecord(task, label, length, depth, seed, "exceeds_context", sample.answer, "", len(ids), 0, 0,
                          engine.max_context_tokens)
    params = SamplingParams(temperature=0.0, max_tokens=ANSWER_TOKENS[task])
    allocator = engine.scheduler.allocator
    allocator.reset_peak()
    _sync(engine.device)
    start = time.perf_counter()
    try:
        seq = engine.add_request(ids, params)
    except ContextLengthError as exc:
        record.error = str(exc)
        return record
    first_token_at = None
    while engine.has_work:
        engine.step()  # sampling reads the token on the host: the step's kernels have finished
        if first_token_at is None and seq.output_ids:
            first_token_at = time.perf_counter()
    end = time.perf_counter()
    record.status = "ok" if sample.is_correct(seq.output_text) else "miss"
    record.output = seq.output_text
    record.read_tokens = seq.num_prompt_tokens
    record.dropped_tokens = seq.dropped_prompt_tokens
    record.prefill_seconds = first_token_at - start
    record.decode_tokens = len(seq.output_ids) - 1
    record.decode_seconds = end - first_token_at
    record.peak_kv_pages = allocator.peak_in_use
    record.peak_kv_bytes = allocator.peak_in_use * allocator.page_size * engine.cache.bytes_per_token
    return record


def _warm_up(engine: LLMEngine) -> None:
    """One short request so one-time costs (kernel compilation, allocator growth) stay out of the timings."""
    ids = engine.encode_chat([{"role": "user", "content": "Say hello. " * 64}])
    engine.add_request(ids[: engine.max_context_tokens // 2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    while engine.has_work:
        engine.step()


def run_compare(
    config: CompareConfig, engine_config: EngineConfig, runs: list[MethodRun] | None = None,
    loaded: LoadedModel | None = None, console: Console | None = None, resolved: dict | None = None,
) -> list[SampleRecord]:
    """Every sample of every method, the model loaded once (or `loaded`). `runs` replaces config.methods (custom
    method configs); engine_config.max_context_tokens, when set, replaces every method's default context limit.
    resolved: a dict that receives each run's engine settings (label -> `ResolvedConfig.as_dict()`)."""
    console = console or Console()
    runs = runs if runs is not None else [parse_method(m) for m in config.methods]
    loaded = loaded or load_engine_model(engine_config)
    needed = max(context_tokens_needed(task, config.lengths) for task in config.tasks)
    records = []
    for run in runs:
        method_engine = dataclasses.replace(engine_config, method=run.method, method_config=run.config)
        default = resolve_config(method_engine, loaded.config, loaded.tokenizer).max_context_tokens
        context = method_context_limit(default, needed, config.max_context)
        engine = LLMEngine(dataclasses.replace(method_engine, max_context_tokens=context), loaded)
        if resolved is not None:
            resolved[run.label] = engine.resolved.as_dict()
        _warm_up(engine)
        for task in config.tasks:
            for length in config.lengths:
                for depth in config.depths:
                    for trial in range(config.samples):
                        seed = config.seed + 1000 * trial + int(round(depth * 100)) + length
                        record = run_sample(engine, run.label, task, length, depth, seed)
                        records.append(record)
                        console.print(_line(record))
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the next method's KV cache
    return records


def _line(r: SampleRecord) -> str:
    head = f"{r.task} {r.method} len={r.length} depth={r.depth:.2f} seed={r.seed}:"
    if not r.ran:
        return f"{head} [yellow]exceeds context[/] ({r.prompt_tokens} tokens > limit {r.context_limit})"
    mark = "[green]ok[/]" if r.status == "ok" else "[red]miss[/]"
    dropped = f", truncated {r.dropped_tokens} tokens" if r.dropped_tokens else ""
    return (f"{head} {mark} expected {r.answer!r} got {r.output.strip()[:50]!r} (prefill {r.prefill_seconds:.2f}s, "
            f"peak KV {r.peak_kv_bytes / 2**20:.1f} MiB{dropped})")

"""Runs a task over lengths x depths x trials with one engine; prints an accuracy table, writes JSON."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.llm import LLM
from infinitehip.eval.niah import make_niah_sample
from infinitehip.eval.passkey import make_passkey_sample

TASKS = {"passkey": make_passkey_sample, "niah": make_niah_sample}
ANSWER_TOKENS = {"passkey": 12, "niah": 48}


def context_tokens_needed(task: str, lengths: tuple[int, ...]) -> int:
    """Context limit that fits the longest prompt (builders land within max(16, 1%)) plus the answer."""
    return int(max(lengths) * 1.01) + 16 + ANSWER_TOKENS[task]


@dataclass(frozen=True)
class EvalConfig:
    lengths: tuple[int, ...] = (2048, 4096)  # prompt lengths in tokens of the model's tokenizer
    depths: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)  # needle depth sweep, 0..1
    trials: int = 1  # samples per (length, depth), each with its own seed
    seed: int = 0  # first sample seed (sample i uses seed + i)
    output: str | None = None  # JSON results path: {"meta": {"resolved_config": ...}, "results": [sample, ...]}

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(int(x) for x in self.lengths))
        object.__setattr__(self, "depths", tuple(float(x) for x in self.depths))
        if not self.lengths or min(self.lengths) <= 0:
            raise ValueError(f"lengths must be positive token counts, got {self.lengths}")
        if not self.depths or not all(0.0 <= d <= 1.0 for d in self.depths):
            raise ValueError(f"depths must lie in [0, 1], got {self.depths}")
        if self.trials < 1:
            raise ValueError(f"trials must be >= 1, got {self.trials}")


@dataclass
class EvalResult:
    task: str
    method: str
    length: int
    prompt_tokens: int
    depth: float
    seed: int
    answer: str
    output: str
    correct: bool
    seconds: float
    dropped_tokens: int = 0  # prompt tokens the method did not read (truncate)


def run_eval(llm: LLM, task: str, config: EvalConfig, console: Console | None = None) -> list[EvalResult]:
    if task not in TASKS:
        raise ValueError(f"unknown eval task {task!r}; available: {', '.join(TASKS)}")
    console = console or Console()
    params = SamplingParams(temperature=0.0, max_tokens=ANSWER_TOKENS[task])
    results = []
    for length in config.lengths:
        for depth in config.depths:
            for trial in range(config.trials):
                seed = config.seed + 1000 * trial + int(round(depth * 100)) + length
                sample = TASKS[task](llm.tokenizer, length, depth, seed)
                start = time.perf_counter()
                (out,) = llm.chat(sample.messages, params)
                seconds = time.perf_counter() - start
                result = EvalResult(task, llm.config.method, length, len(out.prompt_token_ids), depth, seed,
                                    sample.answer, out.text, sample.is_correct(out.text), seconds, out.dropped_prompt_tokens)
                results.append(result)
                mark = "[green]ok[/]" if result.correct else "[red]miss[/]"
                dropped = f", truncated {result.dropped_tokens} tokens" if result.dropped_tokens else ""
                console.print(f"{task} len={length} depth={depth:.2f} seed={seed}: {mark} "
                              f"expected {sample.answer!r} got {out.text.strip()[:60]!r} ({seconds:.1f}s{dropped})",
                              soft_wrap=True)  # one line at any width: rich would break it at the terminal's
    console.print(accuracy_table(results))
    if config.output:
        Path(config.output).parent.mkdir(parents=True, exist_ok=True)
        # the engine's resolved settings beside the samples (config/resolved.py)
        payload = {"meta": {"resolved_config": llm.engine.resolved.as_dict()}, "results": [asdict(r) for r in results]}
        Path(config.output).write_text(json.dumps(payload, indent=2, default=str))
    return results


def accuracy_table(results: list[EvalResult]) -> Table:
    depths = sorted({r.depth for r in results})
    first = results[0] if results else None
    table = Table(title=f"{first.task} accuracy, method {first.method}" if first else "no results")
    table.add_column("length")
    for d in depths:
        table.add_column(f"depth {d:.0%}")
    table.add_column("total")
    for length in sorted({r.length for r in results}):
        row = [r for r in results if r.length == length]
        cells = []
        for d in depths:
            hits = [r.correct for r in row if r.depth == d]
            cells.append(f"{sum(hits)}/{len(hits)}")
        table.add_row(str(length), *cells, f"{sum(r.correct for r in row)}/{len(row)}")
    return table

"""Sampling parameters of one request, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


MAX_LOGPROBS = 20  # alternatives per position (OpenAI's top_logprobs limit)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = None  # most tokens to generate; None: up to the engine's context limit
    temperature: float = 1.0  # sampling temperature: lower is more deterministic; 0: greedy (the most likely token)
    top_p: float = 1.0  # nucleus sampling: the smallest set of tokens holding this much probability
    top_k: int | None = None  # sample among the k most likely tokens; None: no top-k filter
    seed: int | None = None  # seed of this request's sampling (reproducible output); None: the engine's generator
    stop: tuple[str, ...] = ()  # strings that end generation (cut from the output)
    stop_token_ids: tuple[int, ...] = ()  # generation ends at any of these tokens (kept in the output, as vLLM)
    ignore_eos: bool = False  # keep generating past the end-of-sequence token
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one (0: off)
    # > 1 makes tokens already in the prompt or output less likely (logit / p if positive, x p if not; HF and vLLM's
    # rule); 1: off
    repetition_penalty: float = 1.0
    # Log-probabilities (engine/logprobs.py): None = off; k >= 0 = each sampled token's, with the k most likely
    # alternatives (logprobs), and each prompt token's after the first, with k alternatives (prompt_logprobs).
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # the prompt tokens' log-probabilities, with this many alternatives
    # Structured output (engine/structured.py): the output must match this JSON schema (JSON text;
    # '{"type": "object"}' is any JSON object). None: free text.
    json_schema: str | None = None

    HELP_FIELDS: ClassVar[tuple[str, ...]] = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")  # in --help

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 (or None to disable), got {self.top_k}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be non-negative token ids")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0.0 < self.repetition_penalty <= 100.0:
            raise ValueError(f"repetition_penalty must be in (0, 100], got {self.repetition_penalty}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}] (or None), got {value}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

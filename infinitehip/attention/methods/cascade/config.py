"""Cascading KV Cache configuration (Willette et al., arXiv 2406.17808; the group's blog post, papers/004).

A sequence's cache: `sink_tokens` first tokens, then `num_subcaches` circular sub-caches of
(cache_tokens - sink_tokens) // num_subcaches tokens each, then a stride of `stride_tokens` new tokens that every
prefill chunk (and decode, token by token) fills before the stride is pushed through the sub-caches. KV memory per
sequence: sink + sub-caches + stride slots, whatever the input's length.

Sizes: `cache_tokens` 0 means "from the model": half its trained length, at most 16,384 (the paper's smallest cache),
so every position (at most cache + stride - 1) stays inside the trained range.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from infinitehip.config.impl import IMPLS, check_impl

HEAD_REDUCTIONS = ("max", "mean")  # how a KV head's score combines the attention of its group's query heads
AUTO_CACHE_TOKENS = 16384  # the largest cache `cache_tokens=0` picks


@dataclass(frozen=True)
class CascadeConfig:
    sink_tokens: int = 64  # first tokens of the sequence, always kept and attended
    # Sinks + sub-caches: the tokens kept between strides. 0: half the model's trained length, at most 16384
    cache_tokens: int = 0
    num_subcaches: int = 4  # sub-cache i accepts every 2^i-th token of the stream (sub-cache 0: every token)
    # Tokens per prefill stride: one attention call over sinks + sub-caches + the stride, then the stride is pushed.
    # Decode stages its tokens in the same slots and pushes them when the stride is full.
    stride_tokens: int = 1024
    # Weight of a key's past score per query that attends it: score <- decay * score + (1 - decay) * attention.
    score_decay: float = 0.999
    head_reduction: str = "max"  # over the query heads of a KV group: "max" (the paper's default) or "mean"
    # The attention with scores and the cache update: "auto" (Triton on CUDA, the CPU formulations elsewhere),
    # "reference" (the eager oracles), "triton"
    impl: str = "auto"

    STUDY_FIELDS: ClassVar[tuple[str, ...]] = ("score_decay", "head_reduction", "impl")
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"head_reduction": HEAD_REDUCTIONS, "impl": IMPLS}

    def __post_init__(self) -> None:
        if self.sink_tokens < 0:
            raise ValueError(f"sink_tokens must be >= 0, got {self.sink_tokens}")
        if self.num_subcaches < 1 or self.num_subcaches > 30:
            raise ValueError(f"num_subcaches must be in [1, 30], got {self.num_subcaches}")
        if self.cache_tokens != 0 and self.cache_tokens < self.sink_tokens + self.num_subcaches:
            raise ValueError(f"cache_tokens must be 0 (from the model) or at least sink_tokens + num_subcaches = "
                             f"{self.sink_tokens + self.num_subcaches} (one token per sub-cache), got {self.cache_tokens}")
        if self.stride_tokens < 1:
            raise ValueError(f"stride_tokens must be >= 1, got {self.stride_tokens}")
        if not 0.0 < self.score_decay < 1.0:
            raise ValueError(f"score_decay must be in (0, 1), got {self.score_decay}")
        if self.head_reduction not in HEAD_REDUCTIONS:
            raise ValueError(f"head_reduction must be one of {HEAD_REDUCTIONS}, got {self.head_reduction!r}")
        check_impl("impl", self.impl)

    def for_model(self, trained_length: int) -> "CascadeConfig":
        """cache_tokens filled in for a model trained to `trained_length` (0: half of it, at most 16384)."""
        if self.cache_tokens:
            return self
        return dataclasses.replace(self, cache_tokens=min(AUTO_CACHE_TOKENS, trained_length // 2))

    @property
    def subcache_tokens(self) -> int:
        """W: tokens of each circular sub-cache (of a sized config)."""
        if not self.cache_tokens:
            raise ValueError("subcache_tokens of a CascadeConfig whose cache_tokens come from the model: call for_model()")
        return (self.cache_tokens - self.sink_tokens) // self.num_subcaches

    @property
    def kept_tokens(self) -> int:
        """Slots kept between strides: sinks + every sub-cache."""
        return self.sink_tokens + self.num_subcaches * self.subcache_tokens

    @property
    def limit_tokens(self) -> int:
        """Most slots a sequence ever holds: kept + one stride."""
        return self.kept_tokens + self.stride_tokens


# The paper's settings as reported (issue text and blog post): 64 sinks, max reduction over a KV group's heads, the
# power-of-two schedule, stride 1024, 4 sub-caches for a 16K cache; its passkey figure: a 65K cache of 8 sub-caches
# with stride 4096. The EMA's decay is not given in what we read: 0.999 (a key's score averages its last ~1000
# queries). `default`: the paper's structure with a cache sized from the model; to be chosen on the real-text suite.
_PAPER = dict(sink_tokens=64, cache_tokens=16384, num_subcaches=4, stride_tokens=1024, head_reduction="max")
PRESETS: dict[str, CascadeConfig] = {
    "default": CascadeConfig(),
    "paper": CascadeConfig(**_PAPER),
    "paper-65k": CascadeConfig(**{**_PAPER, "cache_tokens": 65536, "num_subcaches": 8, "stride_tokens": 4096}),
}

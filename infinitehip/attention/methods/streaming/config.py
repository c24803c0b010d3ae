"""StreamingLLM configuration: attention sinks + a sliding window, positions rolling inside the cache.

Defaults: 4 sink tokens as in the StreamingLLM paper (4 initial tokens suffice to restore perplexity);
sink + window = 4096 attended keys per query, the same KV budget as the ~4K settings of InfiniPot and
TokenSelect and InfiniteHiP's 3k preset (256 sink + 1024 stream + 2048 selected). The cache holds at most
sink + window + eviction_batch tokens: the extra slots let a prefill chunk be processed at once and let
decode evict once per batch instead of copying the whole window every step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StreamingConfig:
    sink_tokens: int = 4  # first tokens of the sequence, always kept and attended
    window_tokens: int = 4092  # most recent tokens each query attends (the query itself included)
    # Cache slots filled past sink + window before the oldest window tokens are evicted: the largest prefill
    # chunk, and decode compacts once per this many tokens. KV memory per sequence: sink + window + this.
    eviction_batch_tokens: int = 1024

    def __post_init__(self) -> None:
        if self.sink_tokens < 0:
            raise ValueError(f"sink_tokens must be >= 0, got {self.sink_tokens}")
        for name in ("window_tokens", "eviction_batch_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def kept_tokens(self) -> int:
        """Slots left after an eviction: sinks + window."""
        return self.sink_tokens + self.window_tokens

    @property
    def cache_tokens(self) -> int:
        """Most slots a sequence ever holds."""
        return self.kept_tokens + self.eviction_batch_tokens

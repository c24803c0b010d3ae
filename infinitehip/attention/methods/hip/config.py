"""HiP attention (v1) configuration (Lee et al., arXiv 2406.09827; the group's blog post, papers/004).

Each query block of `query_block_size` queries attends its sinks, `top_k_tokens` selected keys (top_k_tokens //
key_block_size key blocks, found by the hierarchical top-k estimation, `hierarchy.py`) and the sliding window of
its first query; the first `dense_layers` layers and every query block whose candidates span fewer than
2 * top_k_tokens keys attend every key (dense). Decode keeps each layer's selection and recomputes it every
`refresh_interval` steps; keys that arrive in between are read through the sliding window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from infinitehip.config.impl import IMPLS, check_impl


@dataclass(frozen=True)
class HiPConfig:
    top_k_tokens: int = 512  # k: selected keys per query block (a multiple of key_block_size)
    key_block_size: int = 2  # keys per selected block: the hierarchy stops at segments of this size
    query_block_size: int = 32  # prefill queries sharing one selection (decode selects per query)
    sink_tokens: int = 16  # first tokens of the sequence, always attended
    window_tokens: int = 256  # most recent tokens each query attends, never candidates of the selection
    refresh_interval: int = 8  # decode steps between recomputations of a layer's selection
    dense_layers: int = 3  # the first layers attend every key
    impl: str = "auto"  # "auto" (Triton sparse attention on CUDA, CPU formulation elsewhere), "reference", "triton"

    STUDY_FIELDS: ClassVar[tuple[str, ...]] = ("impl",)
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"impl": IMPLS}

    def __post_init__(self) -> None:
        for name in ("top_k_tokens", "key_block_size", "query_block_size", "window_tokens", "refresh_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("sink_tokens", "dense_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.top_k_tokens % self.key_block_size:
            raise ValueError(f"top_k_tokens ({self.top_k_tokens}) must be a multiple of key_block_size "
                             f"({self.key_block_size})")
        check_impl("impl", self.impl)

    @property
    def top_k_blocks(self) -> int:
        """K: key blocks each query block selects."""
        return self.top_k_tokens // self.key_block_size

    def selects(self, first_query: int) -> bool:
        """Whether a query block whose first query sits at `first_query` selects (its candidates, the keys after the
        sinks and before its window, span at least 2 * top_k_tokens); otherwise it attends every key."""
        return candidate_end(first_query, self) - self.sink_tokens >= 2 * self.top_k_tokens


def candidate_end(first_query: int, config: HiPConfig) -> int:
    """Exclusive end of the candidates of a query block whose first query is at `first_query`: its window starts
    there (every query of the block attends the window's keys up to itself)."""
    return max(config.sink_tokens, first_query - config.window_tokens + 1)


# The paper's settings as reported (issue text, blog post): k = 512, key blocks of 2, query blocks of 32, 256 window
# and 16 sink tokens, refresh every 8 decode steps, the first 3 layers dense. `default` is the same.
PRESETS: dict[str, HiPConfig] = {
    "default": HiPConfig(),
    "paper": HiPConfig(),
}

"""`truncate` configuration: the InfiniteHiP paper's "Truncated FA2" baseline keeps the beginning and the
end of an over-long prompt and drops its middle, then attends densely."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TruncateConfig:
    # Most prompt tokens kept. None: the model's trained length (max_position_embeddings) minus the request's
    # max_tokens, so the kept prompt plus the completion fit what the model was trained on; a request without
    # max_tokens then cannot be truncated (error: the room to leave is unknown).
    window_tokens: int | None = None
    head_share: float = 0.5  # share of the kept tokens taken from the prompt's beginning; the rest from its end

    def __post_init__(self) -> None:
        if self.window_tokens is not None and self.window_tokens < 2:
            raise ValueError(f"window_tokens must be >= 2 (a head and a tail), got {self.window_tokens}")
        if not 0.0 <= self.head_share <= 1.0:
            raise ValueError(f"head_share must lie in [0, 1], got {self.head_share}")

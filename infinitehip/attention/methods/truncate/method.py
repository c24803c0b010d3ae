"""`truncate`: the Truncated-FA2 baseline. An over-long prompt loses its middle (head + tail kept, the
engine reports how many tokens were dropped), then attention is dense with original positions.

A prompt that fits the window is read whole. Every other method reads the whole prompt or fails with a
context error; only this one drops input, because dropping is what it measures.
"""

from __future__ import annotations

from infinitehip.attention.methods.dense.method import DenseAttention
from infinitehip.attention.methods.truncate.config import TruncateConfig
from infinitehip.config.model import ModelConfig


def head_and_tail(prompt_ids: list[int], keep: int, head_share: float) -> list[int]:
    """The first round(keep * head_share) and the last (keep - that) tokens; the whole prompt when it fits."""
    if keep < 1:
        raise ValueError(f"cannot keep {keep} prompt tokens")
    if len(prompt_ids) <= keep:
        return prompt_ids
    head = round(keep * head_share)
    tail = keep - head
    return prompt_ids[:head] + (prompt_ids[-tail:] if tail else [])


class TruncateAttention(DenseAttention):
    name = "truncate"

    def __init__(self, model_config: ModelConfig, config: TruncateConfig | None = None):
        super().__init__(model_config)
        self.config = config or TruncateConfig()

    def window_for(self, max_tokens: int | None) -> int:
        """Prompt tokens kept for a request with this completion budget."""
        if self.config.window_tokens is not None:
            return self.config.window_tokens
        if max_tokens is None:
            raise ValueError("method 'truncate' with the default window (trained length minus max_tokens) needs the "
                             "request's max_tokens; set max_tokens or window-tokens")
        keep = self.model_config.max_position_embeddings - max_tokens
        if keep < 2:
            raise ValueError(f"max_tokens {max_tokens} leaves no room for a prompt in the model's trained length "
                             f"{self.model_config.max_position_embeddings}")
        return keep

    def select_prompt(self, prompt_ids: list[int], max_tokens: int | None) -> list[int]:
        if self.config.window_tokens is None and max_tokens is None and len(prompt_ids) < self.model_config.max_position_embeddings:
            return prompt_ids  # fits the trained length whatever the completion: nothing to decide
        return head_and_tail(prompt_ids, self.window_for(max_tokens), self.config.head_share)

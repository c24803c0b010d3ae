"""The decoder's attention callable: which layers the attention method governs, which run locally.

Models with hybrid layers (Gemma 3: five sliding-window layers per full-attention layer) give the method only
their full-attention layers, renumbered 0..n-1 (`ModelConfig.method_view`): its KV cache, offloading, presets,
per-layer state and statistics are those of the long-context layers alone. Sliding-window layers run the
model's exact local attention over ring buffers (`attention/common/sliding_window.py`). For a model whose every
layer is full, the router is the identity.
"""

from __future__ import annotations

import torch

from infinitehip.attention.base import AttentionMethod, ForwardBatch
from infinitehip.attention.common.sliding_window import SlidingWindowAttention
from infinitehip.config.model import ModelConfig


class LayerRouter:
    def __init__(self, method: AttentionMethod, model_config: ModelConfig, sliding: SlidingWindowAttention | None):
        if bool(model_config.sliding_layers) != (sliding is not None):
            raise ValueError("sliding-window attention is needed exactly when the model has sliding-window layers")
        self.method, self.sliding = method, sliding
        # model layer -> (governed by the method?, index among its kind)
        self.routes = [(True, i) for i in range(model_config.num_layers)]
        for kind, layers in ((True, model_config.full_layers), (False, model_config.sliding_layers)):
            for index, layer in enumerate(layers):
                self.routes[layer] = (kind, index)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        governed, index = self.routes[layer]
        if governed:
            return self.method(index, q, k, v, batch)
        return self.sliding(index, q, k, v, batch)

    def release(self, seq_id: int) -> None:
        if self.sliding is not None:
            self.sliding.release(seq_id)

"""`auto`: what a user who names no method gets. A prompt (and its answer) within half the model's trained length
is read exactly, as `dense` reads it; past that, InfiniteHiP's pruned attention reads it, within the trained length
too, where the suite measures it reading needles dense loses (`InfiniteHiPConfig.dense_within_trained` and
`dense_within_share`: prefill chunks and decode steps whose context fits the share attend every key; the method's
selection state is kept all along, so the pruned part of a long prompt selects as InfiniteHiP would and a cached
prefix is exact whoever computed it).

The decision is per prefill chunk and per decode step, by the context that step attends: deterministic in the
tokens, so a prefix cache and tensor parallelism see one function. Everything else (CUDA-graph decode past the
trained length, offloading, prefix reuse, the question's vote) is InfiniteHiP's.
"""

from __future__ import annotations

from typing import Any

from infinitehip.attention.methods.auto.presets import PRESETS
from infinitehip.attention.base import KVSizing
from infinitehip.attention.methods.infinitehip.method import InfiniteHiPAttention
from infinitehip.config.model import ModelConfig


class AutoAttention(InfiniteHiPAttention):
    name = "auto"

    def __init__(self, model_config: ModelConfig, config: Any = None) -> None:
        config = config if config is not None else PRESETS["default"]
        if not config.dense_within_trained:
            raise ValueError("method 'auto' attends short contexts exactly (dense_within_trained=True; "
                             "dense_within_share: the share of the trained length); for pruning from the first "
                             "chunk use method 'infinitehip'")
        super().__init__(model_config, config)

    @classmethod
    def kv_sizing(cls, model_config: ModelConfig, config: Any = None, tokenizer: Any = None) -> KVSizing:
        """InfiniteHiP's default context, or the trained length where the model's is longer."""
        base = super().kv_sizing(model_config, config, tokenizer)
        return KVSizing(max(base.default_max_context_tokens, model_config.max_position_embeddings))

"""What every rank of an engine holds (one rank single-process): the attention method, the KV storage, RoPE, the
sliding-window rings and the model runner, built from the engine config and the rank's model.

Under tensor parallelism the rank's decoder was built for its heads (`decoder.layer_config`), so the method,
the KV cache (resident, or host store + GPU banks) and the sliding-window rings are sized for them; the sizes
that the scheduler sees (context, pages) come from the config alone and agree on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infinitehip.attention.base import AttentionMethod
from infinitehip.attention.capabilities import TensorParallelHeads, TokenizerBinding, supports
from infinitehip.attention.common.hybrid import LayerRouter
from infinitehip.attention.registry import create_method
from infinitehip.attention.common.sliding_window import SlidingWindowAttention
from infinitehip.config.engine import EngineConfig
from infinitehip.config.resolved import ResolvedConfig
from infinitehip.engine.graph_decode import GraphDecoder
from infinitehip.engine.kv_setup import build_kv
from infinitehip.engine.resolve import resolve_config
from infinitehip.engine.runner import ModelRunner
from infinitehip.kv.offload.planner import CapacityPlan
from infinitehip.model.loading import LoadedModel
from infinitehip.model.rope import RotaryEmbedding


@dataclass
class RankParts:
    method: AttentionMethod
    cache: object  # PagedKVCache | OffloadedPagedCache
    kv_plan: CapacityPlan | None
    rope: RotaryEmbedding
    sliding: SlidingWindowAttention | None
    runner: ModelRunner
    resolved: ResolvedConfig  # context, pages and the method's slot limits, for the scheduler


def build_rank(config: EngineConfig, loaded: LoadedModel, device: torch.device, dtype: torch.dtype,
               parallel=None, show: bool = True) -> RankParts:
    """parallel: this rank's `distributed.state.ParallelState` (None single-process): the method combines its heads'
    selection scores with the other ranks' through it. The sizes are settled first (engine/resolve.py), from the
    whole model's config: the same on every rank."""
    resolved = resolve_config(config, loaded.config, loaded.tokenizer, loaded.source, device)
    # The method and its KV cache see only the layers it governs (all of them, unless the model has
    # sliding-window layers: those keep a ring buffer of their window, attention/common/sliding_window.py), and only this
    # rank's heads.
    layers = getattr(loaded.model, "layer_config", loaded.config)
    mc = layers.method_view()
    method = create_method(config.method, mc, config.method_config)
    if parallel is not None and supports(method, TensorParallelHeads):  # others' heads are independent per rank
        method.bind_parallel(parallel)
    if supports(method, TokenizerBinding):
        method.bind_tokenizer(loaded.tokenizer)
    max_context_tokens, num_pages = resolved.max_context_tokens, resolved.num_pages
    # Offloading: the method's checks and the capacity plan run before anything is allocated.
    cache, kv_plan = build_kv(config.offload, method, mc, dtype, device, config.page_size, num_pages,
                              max_context_tokens, config.max_num_seqs, show, parallel)
    rope = RotaryEmbedding(mc, resolved.rope_table_tokens, device)
    sliding = None
    if layers.sliding_layers:  # one ring row per running sequence, plus prompt_logits' own
        sliding = SlidingWindowAttention(layers, config.max_num_seqs + 1, device, dtype)
    # Hybrid models route layers; otherwise the method is the decoder's attention callable itself.
    router = LayerRouter(method, layers, sliding) if sliding is not None else None
    graphs = None
    if resolved.cuda_graphs:
        graphs = GraphDecoder(loaded.model, cache, rope, method, max_context_tokens, attention=router,
                              max_num_seqs=config.max_num_seqs)
    runner = ModelRunner(loaded.model, cache, rope, method, graphs, router)
    return RankParts(method, cache, kv_plan, rope, sliding, runner, resolved)

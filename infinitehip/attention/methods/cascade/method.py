"""`cascade` (Cascading KV Cache, arXiv 2406.17808): a fixed-size cache of sinks and cascading circular sub-caches.

A sequence holds at most sink + C * W + stride slots (`kv_token_limit`), whatever its length. Its tokens fill the
slots in order until the stride after the sub-caches is full; then every token after the sinks is pushed through
the sub-caches (schedule.py: the exponential acceptance schedule, eviction by score) and the sequence keeps
sink + C * W slots; from then on each stride of new tokens fills the slots after them and is pushed when full. The
scheduler caps a prefill chunk at the room left, so a chunk never crosses a push: strided prefill is the engine's
chunked prefill, one attention call per chunk over sinks + sub-caches + the stride so far. Decode stages its tokens
in the stride the same way, so a decode step attends what a prefill of the same tokens attends (and the update
runs once per stride).

Keys are cached without RoPE and rotated at their position in the cache (schedule.positions: their rank by age), the
queries at their slot; the largest position is kept + stride - 1, inside the trained range (checked). Every
attention call also updates the keys' scores (scores/); sub-caches decide per layer and KV head, so each holds its
own tokens (the cache is [pages, page_size, Hkv, d] and a slot's position is the same for every head). Until every
sub-cache is full (schedule.py: longer than the first push) a sub-cache's slots past its count hold no token of it
and are not attended. The keys' slots and positions are computed once per step for every layer; nothing in a step
reads a device value back. Decode steps run in static shapes over every slot, masked to the same keys (decode.py),
so they replay from CUDA graphs (graph_hooks.py); impl "reference" decodes each token as a one-token chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from infinitehip.attention.base import AttentionMethod, ChunkHooks, ForwardBatch, KVSizing, SequenceSlice
from infinitehip.attention.capabilities import CacheCompaction
from infinitehip.attention.methods.cascade.config import PRESETS, CascadeConfig
from infinitehip.attention.methods.cascade.decode import DecodeKeys, step_keys
from infinitehip.attention.methods.cascade.graph_hooks import CascadeGraphHooks
from infinitehip.attention.methods.cascade.schedule import CascadeSchedule
from infinitehip.attention.methods.cascade.scores.masked import masked_attention_with_scores
from infinitehip.attention.methods.cascade.scores.op import attention_with_scores
from infinitehip.attention.methods.cascade.update.op import cascade_update
from infinitehip.config.impl import resolve_impl
from infinitehip.config.model import ModelConfig
from infinitehip.host_values import host_to_device
from infinitehip.model.rotary.op import rotate_at
from infinitehip.profiling import phase


@dataclass
class CascadeState:
    """Per sequence: the schedule (shared by layers and heads), the keys' scores [L, Hkv, limit] fp32 by slot and
    the decode steps' device copy of the schedule (decode.py; both allocated on the first step), and the rotation
    of the step's keys (computed once per step)."""

    schedule: CascadeSchedule
    scores: torch.Tensor | None = None
    decode_keys: DecodeKeys | None = None
    # The step's keys: their sequence slots [K] int64 on the device (None: every slot [0, context_len)) and their
    # positions [K] int64 on the device
    key_slots: torch.Tensor | None = None
    key_positions: torch.Tensor | None = None
    keys_for: tuple[int, int] | None = None  # (pushed, context_len) they were computed for


def sized_config(model_config: ModelConfig, config: CascadeConfig | None) -> CascadeConfig:
    """The config with its cache sized from the model, checked against the model's trained positions."""
    trained = model_config.max_position_embeddings
    config = (config or PRESETS["default"]).for_model(trained)
    if config.limit_tokens > trained:
        raise ValueError(
            f"cache_tokens + stride_tokens = {config.kept_tokens} + {config.stride_tokens} exceeds the model's trained "
            f"length {trained}: the cache's positions would leave the trained range (lower cache_tokens or stride_tokens)")
    if config.subcache_tokens < 1:
        raise ValueError(f"cache_tokens = {config.cache_tokens} leaves no slot per sub-cache after {config.sink_tokens} "
                         f"sinks and {config.num_subcaches} sub-caches")
    return config


class CascadeAttention(AttentionMethod, CascadeGraphHooks, CacheCompaction):
    name = "cascade"
    prefix_reuse_note = "its cache is the cascade of the whole prompt so far, not a reusable prefix"

    def __init__(self, model_config: ModelConfig, config: CascadeConfig | None = None):
        super().__init__(model_config)
        self.config = sized_config(model_config, config)
        self.sm_scale = model_config.head_dim ** -0.5

    @classmethod
    def kv_sizing(cls, model_config: ModelConfig, config: CascadeConfig | None = None, tokenizer: Any = None) -> KVSizing:
        # No context limit of its own: memory is bounded and positions stay below the cache's size. 1M tokens.
        config = sized_config(model_config, config)
        return KVSizing(1 << 20, kv_token_limit=config.limit_tokens, method_config=config)

    def new_state(self) -> CascadeState:
        c = self.config
        return CascadeState(CascadeSchedule(c.sink_tokens, c.num_subcaches, c.subcache_tokens))

    def _keys(self, state: CascadeState, context_len: int, device: torch.device) -> None:
        """The step's keys (once per step, for every layer): the kept slots holding a token (schedule.held_slots:
        all of them once the cache is full) then the stride, and their positions (the kept slots' ranks, the
        stride at its slots). Host values, copied without a sync."""
        key = (state.schedule.pushed, context_len)
        if state.keys_for == key:
            return
        schedule = state.schedule
        kept = schedule.positions() if schedule.pushed else torch.zeros(0, dtype=torch.long)
        positions = torch.cat([kept[:context_len], torch.arange(kept.numel(), context_len, dtype=torch.long)])
        held = schedule.held_slots()
        state.key_slots = None
        if held is not None:  # filling: skip the slots of a sub-cache past its count
            slots = torch.cat([held, torch.arange(schedule.kept, context_len, dtype=torch.long)])
            positions, state.key_slots = positions[slots], host_to_device(slots, device)
        state.key_positions = host_to_device(positions, device)
        state.keys_for = key

    def prefill(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> torch.Tensor:
        state: CascadeState = seq.state
        c, end = self.config, seq.context_len
        if state.scores is None:
            shape = (self.model_config.num_layers, self.model_config.num_kv_heads, c.limit_tokens)
            state.scores = torch.zeros(shape, dtype=torch.float32, device=q.device)
            state.decode_keys = DecodeKeys.allocate(c.limit_tokens, q.device)
        self._keys(state, end, q.device)
        slots = seq.context_slots if state.key_slots is None else seq.context_slots[state.key_slots]
        k, v = seq.cache.read(layer, slots)
        batch.rope.ensure(end)
        k = rotate_at(k, state.key_positions, batch.rope.cos, batch.rope.sin)  # one kernel on CUDA
        q = batch.rope.apply_range(q, seq.start_pos)  # the stride's slots are its positions
        scores = state.scores[layer, :, :end]
        scores[:, seq.start_pos :] = 0.0  # the chunk's own keys start with no score
        attended = scores if state.key_slots is None else scores.index_select(1, state.key_slots)
        # Key order: query i (the i-th of the last n keys) sees the keys up to its own (kept keys rank below)
        out = attention_with_scores(q, k, v, attended, self.sm_scale, c.score_decay, c.head_reduction,
                                    impl=resolve_impl(c.impl, q.device))
        if state.key_slots is not None:
            scores.index_copy_(1, state.key_slots, attended)
        return out

    def decode(self, layer: int, q: torch.Tensor, seqs: list[SequenceSlice], batch: ForwardBatch) -> torch.Tensor:
        """q [B, H, d] -> [B, H, d]: each query over its sequence's every slot, masked (decode.py); impl
        "reference": each as a one-token chunk (the prefill path)."""
        if not self.static_decode():
            return super().decode(layer, q, seqs, batch)
        c = self.config
        keys = step_keys(batch, [s.state.decode_keys for s in seqs])
        batch.rope.ensure(c.limit_tokens)  # a no-op after the first step (decode_rope_positions reserves it)
        cos, sin = batch.rope.cos, batch.rope.sin
        q = rotate_at(q, batch.decode_positions, cos, sin)  # each query at its slot
        out = []
        for b, s in enumerate(seqs):
            k, v = s.cache.read(layer, keys.flat[b])  # [limit, Hkv, d]
            k = rotate_at(k, keys.positions[b], cos, sin)
            scores = s.state.scores[layer]  # [Hkv, limit]
            scores.index_fill_(1, batch.decode_positions[b : b + 1], 0.0)  # the query's own key starts with no score
            out.append(masked_attention_with_scores(q[b : b + 1], k, v, keys.visible[b], scores, self.sm_scale,
                                                    c.score_decay, c.head_reduction))
        return torch.cat(out)

    def after_forward(self, seq: SequenceSlice, hooks: ChunkHooks) -> int | None:
        if seq.context_len < self.config.limit_tokens:
            return None  # the stride is not full yet
        return self._push(seq)

    @phase("cascade update")
    def _push(self, seq: SequenceSlice) -> int:
        state: CascadeState = seq.state
        schedule = state.schedule
        first = schedule.sinks if schedule.pushed == 0 else schedule.kept  # the first push takes every non-sink
        end = seq.context_len
        ops, slots = schedule.plan_pushes(end - first)
        cache = seq.cache
        k = cache.k.view(cache.num_layers, -1, *cache.k.shape[-2:])
        v = cache.v.view(cache.num_layers, -1, *cache.v.shape[-2:])
        cascade_update(k, v, state.scores, seq.context_slots, ops, slots, first,
                       impl=resolve_impl(self.config.impl, cache.device))  # "cpu": the reference
        state.decode_keys.refresh(schedule)  # after the step: outside any graph
        return schedule.kept

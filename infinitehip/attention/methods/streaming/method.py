"""`streaming` (StreamingLLM): attention sinks + a sliding window over a bounded, compacted KV cache.

Cache layout of a sequence: slots [0, sink) hold its first tokens, the slots after them its most recent
tokens in order. Each query (prefill or decode) attends exactly the sinks and its own last `window_tokens`
tokens, with ROLLING positions: the positions of the keys it sees are their indices in a cache that holds
just those keys (sinks 0..sink-1, window sink..), and the query sits at the window's end, as if it were
decoded by StreamingLLM. After every step the method evicts: it moves the window's k/v right after the
sinks and tells the engine how many slots it kept (prefill: after every chunk that went past
sink + window; decode: when the cache is full, so the copy happens once per `eviction_batch_tokens`).

RoPE scores depend only on the distance between query and key, and a window key's distance to the query
is the same in cache-slot indices as in rolling positions, so window keys are rotated by their slot
index and the query by its own slot. Sink keys sit at a rolling distance that differs per query; they
are scored with a second rotation of the query, at its rolling position. Both scores come from one SDPA
call by concatenating along the head dim: q' = [q_slot, q_rolling], window k' = [k, 0], sink k' = [0, k].
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from infinitehip.attention.base import AttentionMethod, ChunkHooks, ForwardBatch, KVSizing, SequenceSlice
from infinitehip.attention.capabilities import CacheCompaction
from infinitehip.attention.methods.streaming.config import StreamingConfig
from infinitehip.config.model import ModelConfig
from infinitehip.kv.paged_cache import token_slots
from infinitehip.model.rope import RotaryEmbedding, apply_rotary

# Queries per SDPA call: scores take heads x rows x (sink + window + rows) floats.
ROWS_PER_PASS = 1024


def rolling_query_positions(query_slots: torch.Tensor, sink: int, window: int) -> torch.Tensor:
    """Position of each query in its own sink + window view: its slot until the window is full, then sink + window - 1."""
    return query_slots.clamp(max=sink + window - 1)


def window_starts(query_slots: torch.Tensor, sink: int, window: int) -> torch.Tensor:
    """First non-sink slot each query attends: its last `window` tokens, never inside the sinks."""
    return (query_slots - window + 1).clamp(min=sink)


def _rotate(x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding) -> torch.Tensor:
    """x [T, heads, d] rotated at positions [T]."""
    return apply_rotary(x, rope.cos[positions].unsqueeze(1), rope.sin[positions].unsqueeze(1))


def sink_window_attention(
    q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, page_table: torch.Tensor, page_size: int,
    start: int, sink: int, window: int, rope: RotaryEmbedding, sm_scale: float,
) -> torch.Tensor:
    """q [n, H, d] (pre-RoPE) of the tokens in cache slots start..start+n-1; k/v already cached -> [n, H, d]."""
    n = q.shape[0]
    device = q.device
    rope.ensure(start + n)
    out = torch.empty_like(q)
    for a in range(0, n, ROWS_PER_PASS):
        b = min(a + ROWS_PER_PASS, n)
        query_slots = torch.arange(start + a, start + b, device=device)
        first = max(sink, start + a - window + 1)  # oldest window slot any query of this pass sees
        sink_tok = torch.arange(min(sink, start + b), device=device)
        win_tok = torch.arange(min(first, start + b), start + b, device=device)  # empty while every key is a sink
        key_tok = torch.cat([sink_tok, win_tok])
        slots = token_slots(page_table, key_tok, page_size)
        k, v = k_flat.index_select(0, slots), v_flat.index_select(0, slots)  # [K, Hkv, d]
        k = _rotate(k, key_tok, rope)
        ns = sink_tok.numel()
        qb = q[a:b]
        q_cat = torch.cat([_rotate(qb, query_slots, rope), _rotate(qb, rolling_query_positions(query_slots, sink, window), rope)], -1)
        zeros = torch.zeros_like(k)
        k_cat = torch.cat([torch.cat([zeros[:ns], k[:ns]], -1), torch.cat([k[ns:], zeros[ns:]], -1)])
        qs = query_slots[:, None]
        visible = torch.cat([sink_tok[None, :] <= qs, (win_tok[None, :] >= window_starts(qs, sink, window)) & (win_tok[None, :] <= qs)], 1)
        o = F.scaled_dot_product_attention(
            q_cat.transpose(0, 1)[None], k_cat.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=visible, scale=sm_scale, enable_gqa=q.shape[1] != k.shape[1],
        )
        out[a:b] = o[0].transpose(0, 1).to(q.dtype)
    return out


class StreamingAttention(AttentionMethod, CacheCompaction):
    name = "streaming"
    prefix_reuse_note = "its cache is compacted (sinks + window), not the prompt's prefix"

    def __init__(self, model_config: ModelConfig, config: StreamingConfig | None = None):
        super().__init__(model_config)
        self.config = config or StreamingConfig()
        self.sm_scale = model_config.head_dim ** -0.5

    @classmethod
    def kv_sizing(cls, model_config: ModelConfig, config: StreamingConfig | None = None,
                  tokenizer: Any = None) -> KVSizing:
        # No context limit of its own: memory is bounded and positions never exceed the cache size. 1M tokens.
        return KVSizing(1 << 20, kv_token_limit=(config or StreamingConfig()).cache_tokens)

    def prefill(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> torch.Tensor:
        c = self.config
        return sink_window_attention(q, seq.cache.flat_k(layer), seq.cache.flat_v(layer), seq.page_table, seq.cache.page_size,
                                     seq.start_pos, c.sink_tokens, c.window_tokens, batch.rope, self.sm_scale)

    def after_forward(self, seq: SequenceSlice, hooks: ChunkHooks) -> int | None:
        c = self.config
        used = seq.context_len
        if used <= c.kept_tokens or (not seq.is_prefill and used < c.cache_tokens):
            return None  # nothing to evict yet; decode waits until the cache is full
        src = seq.cache.slots(seq.page_table, used - c.window_tokens, used)
        dst = seq.cache.slots(seq.page_table, c.sink_tokens, c.kept_tokens)
        seq.cache.copy_slots(src, dst)
        return c.kept_tokens

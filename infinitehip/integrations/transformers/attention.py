"""The attention function registered in transformers' `AttentionInterface`, and the identity RoPE.

transformers' attention layers rotate q/k with the cos/sin their model computed once per forward, then call
`ALL_ATTENTION_FUNCTIONS[config._attn_implementation](module, q, k, v, mask, scaling=..., **kwargs)`.
Under `patch` the rotary modules return cos = 1, sin = 0, so q/k arrive pre-RoPE (exactly: x * 1 + r * 0),
and this function hands them to our method, which applies RoPE at the positions it chooses (InfiniteHiP's
chunk-indexed / streaming positions past the training window).
"""

from __future__ import annotations

import math

import torch
from transformers import AttentionInterface

ATTN_IMPLEMENTATION = "infinitehip"  # the name the patched model's config selects


def method_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask, scaling: float | None = None, dropout: float = 0.0, **kwargs):
    """query [B, H, T, d], key/value [B, Hkv, T, d] (this step's tokens only, pre-RoPE) -> ([B, T, H, d], None).

    The causal / sliding masks are the method's own (no mask is built: the name has no mask function)."""
    session = getattr(module, "_infinitehip_session", None)
    if session is None or session.active_cache is None:
        raise RuntimeError("attention implementation 'infinitehip' runs only inside `infinitehip.patch(model, ...)`")
    cache = session.active_cache
    B, H, T, d = query.shape
    batch = cache.forward_batch(B, T, query)
    # Methods scale scores by d ** -0.5; the model may want another scale (Gemma's query_pre_attn_scalar) and
    # YaRN / longrope's attention factor (transformers folds it into cos and sin: a factor squared on scores).
    factor = (scaling if scaling is not None else d ** -0.5) * math.sqrt(d) * session.rope_factor(module.layer_idx)
    q = query.transpose(1, 2).reshape(B * T, H, d)
    if factor != 1.0:
        q = q * factor
    k = key.transpose(1, 2).reshape(B * T, -1, d)
    v = value.transpose(1, 2).reshape(B * T, -1, d)
    out = cache.attention(module.layer_idx, q, k, v, batch)  # [B * T, H, d]
    return out.view(B, T, H, d), None


def identity_rotary(x: torch.Tensor, position_ids: torch.Tensor, *args, head_dim: int, **kwargs):
    """cos = 1, sin = 0 [B, T, head_dim] in x's dtype: transformers' apply_rotary_pos_emb leaves q/k as they are."""
    shape = (*position_ids.shape, head_dim)
    return torch.ones(shape, dtype=x.dtype, device=x.device), torch.zeros(shape, dtype=x.dtype, device=x.device)


AttentionInterface.register(ATTN_IMPLEMENTATION, method_attention)

"""Eager PyTorch oracle of sparse attention over an explicit key list (paged cache, RoPE on the fly).

Each query block (prefill) or sequence (decode) has a list of key token positions shared by all heads.
The keys are gathered from the flat paged cache (`slot = page_table[t // page_size] * page_size +
t % page_size`), rotated with their own RoPE positions (`key_rope_pos`: StreamingLLM-style consecutive
ids, original positions, ...), queries are rotated with `query_rope_pos`, and a key is visible to a
query iff its token position is <= the query's original position. Softmax runs in fp32; a query that
sees no key gets zeros. Readable and slow (a Python loop over query blocks / sequences): the oracle the
Triton kernels are tested against. Works on CPU and GPU.
"""

from __future__ import annotations

import torch

from infinitehip.kv.paged_cache import token_slots
from infinitehip.model.rope import apply_rotary


def _rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d] (any dtype) -> fp32, rotated at `positions` [T]."""
    positions = positions.long()
    return apply_rotary(x.float(), cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """q [m, H, d], k/v [c, Hkv, d] (fp32, roped), visible [m, c] bool -> [m, H, d] fp32.

    GQA: query head h reads kv head h // (H // Hkv). Rows with no visible key are zero.
    """
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,chd->hmc", q, k) * sm_scale
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # NaN on fully masked rows
    probs = probs.masked_fill(~visible.any(dim=-1, keepdim=True), 0.0)
    return torch.einsum("hmc,chd->mhd", probs, v)


def sparse_attention_prefill(
    q: torch.Tensor,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    key_tokens: torch.Tensor,
    key_counts: torch.Tensor,
    key_rope_pos: torch.Tensor,
    query_pos: torch.Tensor,
    query_rope_pos: torch.Tensor,
    query_block_size: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """q [n, H, d] (pre-RoPE) of one sequence's chunk -> [n, H, d] in q's dtype.

    Query i belongs to block i // query_block_size, which attends to key_tokens[b, :key_counts[b]].
    """
    n = q.shape[0]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    q_roped = _rope(q, query_rope_pos, cos, sin)
    counts = key_counts.tolist()
    for b, start in enumerate(range(0, n, query_block_size)):
        rows = slice(start, min(start + query_block_size, n))
        tokens = key_tokens[b, : counts[b]].long()
        slots = token_slots(page_table, tokens, page_size)
        k = _rope(k_flat[slots], key_rope_pos[b, : counts[b]], cos, sin)
        v = v_flat[slots].float()
        visible = tokens[None, :] <= query_pos[rows].long()[:, None]
        out[rows] = _attend(q_roped[rows], k, v, visible, sm_scale)
    return out.to(q.dtype)


def sparse_attention_decode(
    q: torch.Tensor,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    page_tables: torch.Tensor,
    page_size: int,
    key_tokens: torch.Tensor,
    key_counts: torch.Tensor,
    key_rope_pos: torch.Tensor,
    query_rope_pos: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    sm_scale: float,
    num_splits: int | None = None,  # accepted for signature parity; the oracle does not split
) -> torch.Tensor:
    """q [B, H, d] (pre-RoPE), one query per sequence; every listed key is visible -> [B, H, d]."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    q_roped = _rope(q, query_rope_pos, cos, sin)
    counts = key_counts.tolist()
    for b in range(q.shape[0]):
        tokens = key_tokens[b, : counts[b]].long()
        slots = token_slots(page_tables[b], tokens, page_size)
        k = _rope(k_flat[slots], key_rope_pos[b, : counts[b]], cos, sin)
        v = v_flat[slots].float()
        visible = torch.ones(1, counts[b], dtype=torch.bool, device=q.device)
        out[b : b + 1] = _attend(q_roped[b : b + 1], k, v, visible, sm_scale)
    return out.to(q.dtype)

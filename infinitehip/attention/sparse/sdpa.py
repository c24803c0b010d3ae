"""Sparse attention through torch SDPA: all blocks' key lists gathered at once, one batched GQA call.

Same signatures and semantics as `reference.py` (tested against it). Used on CPU, where the eager
per-block loop of the reference is too slow for long prompts and Triton needs a GPU; memory is
[blocks, max keys, Hkv, d] per K and V.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infinitehip.attention.sparse.reference import _rope
from infinitehip.kv.paged_cache import token_slots


def _gathered(k_flat, v_flat, page_table, page_size, key_tokens, key_counts, key_rope_pos, cos, sin, dtype):
    """-> k, v [M, Hkv, K, d] (k rotated), valid [M, K]."""
    M, K = key_tokens.shape
    valid = torch.arange(K, device=key_tokens.device)[None, :] < key_counts[:, None].long()
    slots = token_slots(page_table, torch.where(valid, key_tokens, 0), page_size)  # [M, K]; padding reads token 0
    rope_pos = torch.where(valid, key_rope_pos, 0)
    k = _rope(k_flat[slots.flatten()], rope_pos.flatten(), cos, sin).view(M, K, *k_flat.shape[1:])
    v = v_flat[slots].to(torch.float32)
    # Padding entries may name any token: zero them so nothing unlisted (even NaN) reaches the softmax.
    k = k.masked_fill(~valid[:, :, None, None], 0.0)
    v = v.masked_fill(~valid[:, :, None, None], 0.0)
    return k.to(dtype).transpose(1, 2), v.to(dtype).transpose(1, 2), valid


def sparse_attention_prefill(q, k_flat, v_flat, page_table, page_size, key_tokens, key_counts, key_rope_pos,
                             query_pos, query_rope_pos, query_block_size, cos, sin, sm_scale):
    n, H, d = q.shape
    M = key_tokens.shape[0]
    compute = torch.float32
    k, v, valid = _gathered(k_flat, v_flat, page_table, page_size, key_tokens, key_counts, key_rope_pos, cos, sin, compute)
    pad = M * query_block_size - n
    q_rot = _rope(q, query_rope_pos, cos, sin).to(compute)
    q_rot = F.pad(q_rot, (0, 0, 0, 0, 0, pad)).view(M, query_block_size, H, d).transpose(1, 2)  # [M, H, b, d]
    qpos = F.pad(query_pos.long(), (0, pad), value=-1).view(M, query_block_size)
    visible = valid[:, None, :] & (key_tokens.long()[:, None, :] <= qpos[:, :, None])  # [M, b, K]
    seen = visible.any(-1)
    # Rows that see nothing would be NaN in SDPA: let them see everything, then zero them.
    visible = visible | ~seen[:, :, None]
    out = F.scaled_dot_product_attention(q_rot, k, v, attn_mask=visible[:, None], scale=sm_scale, enable_gqa=True)
    out = out.masked_fill(~seen[:, None, :, None], 0.0)
    return out.transpose(1, 2).reshape(M * query_block_size, H, d)[:n].to(q.dtype)


def sparse_attention_decode(q, k_flat, v_flat, page_tables, page_size, key_tokens, key_counts, key_rope_pos,
                            query_rope_pos, cos, sin, sm_scale, num_splits=None):
    B, H, d = q.shape
    compute = torch.float32
    ks, vs = [], []
    for b in range(B):  # each sequence has its own page table
        k, v, _ = _gathered(k_flat, v_flat, page_tables[b], page_size, key_tokens[b : b + 1], key_counts[b : b + 1],
                            key_rope_pos[b : b + 1], cos, sin, compute)
        ks.append(k)
        vs.append(v)
    K = key_tokens.shape[1]
    valid = torch.arange(K, device=q.device)[None, :] < key_counts[:, None].long()
    seen = valid.any(-1)
    mask = (valid | ~seen[:, None])[:, None, None, :]
    q_rot = _rope(q, query_rope_pos, cos, sin).to(compute)[:, :, None, :]  # [B, H, 1, d]
    out = F.scaled_dot_product_attention(q_rot, torch.cat(ks), torch.cat(vs), attn_mask=mask, scale=sm_scale, enable_gqa=True)
    out = out.masked_fill(~seen[:, None, None, None], 0.0)
    return out[:, :, 0].to(q.dtype)

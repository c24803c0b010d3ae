"""Landmark chunk scores on CPU: `representative_scores_reference`'s results (up to fp32 rounding) as batched GEMMs.

The reference builds one [m, N, H, b] einsum, masks the invalid queries and reduces it. Here, per group of
query blocks (about `group_elements` gathered key values, a few MB, so the passes stay in cache):
  keys   one row per (block, head, chunk): the representative's key, gathered by flat (slot, kv head) row
         [m, H, N, d]; rotated when the style gives keys positions (relative / infllm rotate the queries back
         by the offset instead, as the reference does)
  logits one batched matmul [m, H, N, d] @ [m, H, d, b] -> [m, H, N, b], max over queries, then over heads.
Invalid query rows are replaced by a valid row of their block beforehand (a duplicate cannot change a max), so
the logits need no mask; a block without a valid query scores finfo.min, like the reference.
"""

from __future__ import annotations

import torch

from infinitehip.kv.paged_cache import token_slots
from infinitehip.model.rope import apply_rotary, apply_rotary_fused


def representative_scores_cpu(
    q_rot: torch.Tensor,  # [M, b, H, d] rotated queries of each query block
    q_valid: torch.Tensor,  # [M, b] bool
    k_flat: torch.Tensor,  # [S, Hkv, d] keys without RoPE
    page_table: torch.Tensor,
    page_size: int,
    reps: torch.Tensor,  # [M, N, H] int64 representative token of each chunk per head
    chunk_lens: torch.Tensor,  # [M, N] int64, 0 = padding
    key_pos_base: torch.Tensor,  # [M, N] int64
    token_pos_group: int | None,
    rep_offset: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    group_elements: int = 1 << 21,
) -> torch.Tensor:
    """-> [M, N] fp32: max over heads and the block's valid queries of q . k_rep, -inf for padding chunks."""
    M, b, H, d = q_rot.shape
    N = reps.shape[1]
    if N == 0 or M == 0:
        return q_rot.new_full((M, N), float("-inf"), dtype=torch.float32)
    S, Hkv = k_flat.shape[:2]
    q = q_rot.float()
    keys_unrotated = token_pos_group is None and not bool(key_pos_base.any())
    if keys_unrotated:  # rotate the queries back by the offset instead of every key
        q = apply_rotary(q, cos[rep_offset], -sin[rep_offset])
    any_valid = q_valid.any(1)  # [M]
    source = torch.where(q_valid, torch.arange(b, device=q.device), q_valid.long().argmax(1, keepdim=True))  # [M, b]
    q = q.gather(1, source[:, :, None, None].expand(M, b, H, d)).permute(0, 2, 3, 1).contiguous()  # [M, H, d, b]

    kv_head = torch.arange(H, device=q.device) // (H // Hkv)
    rows = (token_slots(page_table, reps, page_size) * Hkv + kv_head).transpose(1, 2).contiguous()  # [M, H, N]
    if not keys_unrotated:  # positions [M, H, N], or [M, 1, N] when they depend on the chunk only
        pos = key_pos_base[:, None, :] + rep_offset
        if token_pos_group:
            pos = pos + (reps // token_pos_group).transpose(1, 2)
    k_rows = k_flat.view(S * Hkv, d)
    out = torch.empty(M, N, dtype=torch.float32, device=q.device)
    step = max(1, group_elements // (H * N * d))
    for m0 in range(0, M, step):
        m1 = min(M, m0 + step)
        k = k_rows.index_select(0, rows[m0:m1].flatten()).view(m1 - m0, H, N, d).float()
        if not keys_unrotated:
            k = apply_rotary_fused(k, cos[pos[m0:m1]], sin[pos[m0:m1]])
        logits = torch.matmul(k, q[m0:m1])  # [m, H, N, b]
        out[m0:m1] = logits.amax(-1).amax(1)
    out = out.masked_fill_(~any_valid[:, None], torch.finfo(torch.float32).min)
    return out.masked_fill_(chunk_lens == 0, float("-inf"))

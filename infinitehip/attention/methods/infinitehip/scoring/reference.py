"""Chunk scoring of one pruning stage, eager PyTorch (the oracle for the Triton kernel beside it).

For every query block m and candidate chunk j, per head h, SelectRep (paper Alg. 3) finds the chunk's
representative token by hierarchical top-1 bisection: split the current range in two, score the first
token of each half against the block's queries (max over the block's queries), keep the better half,
repeat ceil(log2(chunk_size)) times. The chunk's score (Alg. 2 line 11) is the max over heads and
queries of q . k_rep. Only 1 + log2(l_c) keys per chunk and head are read.

Key RoPE positions are generic so every RoPE style is a choice of arguments:
    pos(token t of chunk j, branch offset o) = key_pos_base[m, j] + (t // token_pos_group if set) + o
with o = left_offset / right_offset for the two halves and rep_offset for the final score.
Queries arrive already rotated (their position depends only on the style and the block).
"""

from __future__ import annotations

import math

import torch

from infinitehip.kv.paged_cache import token_slots
from infinitehip.model.rope import apply_rotary


def _rotated_keys(
    k_flat: torch.Tensor, page_table: torch.Tensor, page_size: int, tokens: torch.Tensor,
    positions: torch.Tensor, kv_head: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
) -> torch.Tensor:
    """Keys of `tokens` [..., H] (one token per query head) with RoPE at `positions` [..., H] -> [..., H, d] fp32."""
    k = k_flat[token_slots(page_table, tokens, page_size), kv_head].float()  # kv_head [H] broadcasts over the leading dims
    return apply_rotary(k, cos[positions], sin[positions])


def chunk_scores_reference(
    q_rot: torch.Tensor,  # [M, b, H, d] rotated queries of each query block
    q_valid: torch.Tensor,  # [M, b] bool: padded query rows are False
    k_flat: torch.Tensor,  # [S, Hkv, d] keys without RoPE (flat paged cache of one layer)
    page_table: torch.Tensor,  # [P] int
    page_size: int,
    chunk_starts: torch.Tensor,  # [M, N] int64 first token of each candidate chunk
    chunk_lens: torch.Tensor,  # [M, N] int64 tokens in the chunk; 0 marks padding
    key_pos_base: torch.Tensor,  # [M, N] int64
    token_pos_group: int | None,  # None: keys' own positions are not used
    left_offset: int,
    right_offset: int,
    rep_offset: int,
    cos: torch.Tensor,  # [P_rope, d/2] fp32
    sin: torch.Tensor,
    max_elements: int = 1 << 25,  # bound on the [m, N, H, b] score tensor per slice of query blocks
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (scores [M, N] fp32, -inf for padding chunks; representatives [M, N, H] int64 token positions)."""
    M, b, H, _ = q_rot.shape
    N = chunk_starts.shape[1]
    if N == 0 or M == 0:
        return q_rot.new_full((M, N), float("-inf"), dtype=torch.float32), chunk_starts.new_zeros(M, N, H)
    kv_head = torch.arange(H, device=q_rot.device) // (H // k_flat.shape[1])
    step = max(1, max_elements // max(1, N * H * b))
    scores, reps = [], []
    for m0 in range(0, M, step):
        sl = slice(m0, m0 + step)
        s, r = _score_blocks(
            q_rot[sl].float(), q_valid[sl], k_flat, page_table, page_size, chunk_starts[sl], chunk_lens[sl],
            key_pos_base[sl], token_pos_group, left_offset, right_offset, rep_offset, kv_head, cos, sin,
        )
        scores.append(s)
        reps.append(r)
    return torch.cat(scores), torch.cat(reps)


def _score_blocks(q, q_valid, k_flat, page_table, page_size, starts, lens, base, group, left_off, right_off,
                  rep_off, kv_head, cos, sin):
    H = q.shape[2]
    neg = torch.finfo(torch.float32).min
    query_mask = (~q_valid)[:, None, None, :]  # [m, 1, 1, b]

    # When every key position is just the branch offset (relative / infllm styles), rotate the queries
    # back by the offset instead of rotating each gathered key: <R(a)q, R(b)k> = <R(a - b)q, k>.
    keys_unrotated = group is None and not bool(base.any())
    shifted = {}

    def score(tokens: torch.Tensor, offset: int) -> torch.Tensor:
        """max over the block's queries of q . k(tokens) per head: tokens [m, N, H] -> [m, N, H]."""
        if keys_unrotated:
            if offset not in shifted:
                shifted[offset] = apply_rotary(q, cos[offset], -sin[offset])
            k, qq = k_flat[token_slots(page_table, tokens, page_size), kv_head].float(), shifted[offset]
        else:
            pos = base[..., None] + offset + (tokens // group if group is not None else 0)
            k, qq = _rotated_keys(k_flat, page_table, page_size, tokens, pos, kv_head, cos, sin), q
        s = torch.einsum("mbhd,mnhd->mnhb", qq, k).masked_fill(query_mask, neg)
        return s.amax(-1)

    lo = starts[..., None].expand(-1, -1, H).clone()  # [m, N, H]
    size = lens[..., None].expand(-1, -1, H).clone()
    safe = lambda t: torch.where(size > 0, t, starts[..., None])  # padding chunks read a harmless token
    max_len = int(lens.max()) if lens.numel() else 0
    for _ in range(math.ceil(math.log2(max_len)) if max_len > 1 else 0):
        half = (size + 1) // 2
        mid = lo + half
        splittable = size > 1
        left = score(safe(lo), left_off)
        right = score(torch.where(splittable, mid, lo), right_off)
        go_right = splittable & (right > left)
        lo = torch.where(go_right, mid, lo)
        size = torch.where(go_right, size - half, torch.where(splittable, half, size))
    chunk_score = score(safe(lo), rep_off).amax(-1)  # max over heads
    chunk_score = chunk_score.masked_fill(lens == 0, float("-inf"))
    return chunk_score, lo


def representative_scores_reference(
    q_rot: torch.Tensor,  # [M, b, H, d] rotated queries of each query block
    q_valid: torch.Tensor,  # [M, b] bool
    k_flat: torch.Tensor,  # [S, Hkv, d] keys without RoPE
    page_table: torch.Tensor,
    page_size: int,
    reps: torch.Tensor,  # [M, N, H] int64 representative token of each chunk per head (chosen elsewhere)
    chunk_lens: torch.Tensor,  # [M, N] int64, 0 = padding
    key_pos_base: torch.Tensor,  # [M, N] int64
    token_pos_group: int | None,
    rep_offset: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    max_elements: int = 1 << 25,
) -> torch.Tensor:
    """Chunk scores when the representatives are given (landmark mode): max over heads and the block's
    valid queries of q . k_rep, the key at the stage's RoPE position. -> [M, N] fp32, -inf for padding.
    The oracle of `representative.triton.representative_scores_triton`."""
    M, b, H, _ = q_rot.shape
    N = reps.shape[1]
    if N == 0 or M == 0:
        return q_rot.new_full((M, N), float("-inf"), dtype=torch.float32)
    kv_head = torch.arange(H, device=q_rot.device) // (H // k_flat.shape[1])
    keys_unrotated = token_pos_group is None and not bool(key_pos_base.any())
    step = max(1, max_elements // max(1, N * H * b))
    out = []
    for m0 in range(0, M, step):
        sl = slice(m0, m0 + step)
        q, tokens = q_rot[sl].float(), reps[sl]
        if keys_unrotated:  # rotate the queries back by the offset instead of every key
            q = apply_rotary(q, cos[rep_offset], -sin[rep_offset])
            k = k_flat[token_slots(page_table, tokens, page_size), kv_head].float()
        else:
            pos = key_pos_base[sl][..., None] + rep_offset + (tokens // token_pos_group if token_pos_group else 0)
            k = _rotated_keys(k_flat, page_table, page_size, tokens, pos, kv_head, cos, sin)
        s = torch.einsum("mbhd,mnhd->mnhb", q, k).masked_fill((~q_valid[sl])[:, None, None, :], torch.finfo(torch.float32).min)
        out.append(s.amax(-1).amax(-1))
    return torch.cat(out).masked_fill(chunk_lens == 0, float("-inf"))

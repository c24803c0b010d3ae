"""Triton summed soft vote (same signature and output as `reference.py`).

Both passes run one program per tile of BLOCK_N candidates and loop over the kv heads, so each vote is one
program's sum (no atomics: the same votes, bit for bit, on every run). A program loads a kv head's key tile once
and scores it against the ROWS = n x group query heads reading that kv head, ROW_BLOCK rows per tensor-core dot.
Pass 1 writes each row's tile max and sum of exp (the softmax normaliser in streaming form, [Hkv, ROWS, tiles]);
torch merges them into one log-sum-exp per row; pass 2 recomputes the logits (a second read of the keys is
cheaper than writing and reading [n, H, count] fp32 logits) and sums exp(logit - lse) over the rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

_OP_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
BLOCK_N = 64  # candidates per program
ROW_BLOCK = 64  # (query, head) rows per dot

fix_interpreter_if_active()


@triton.jit
def _key_tile(K, PageTable, start, count, page_size, g, t, stride_ks, stride_kh,
              BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """-> (keys [BLOCK_N, BLOCK_D] of kv head g, candidate mask [BLOCK_N]) of tile t (count: the candidates that
    vote, `_valid_count`)."""
    offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < count
    tok = start + offs_n.to(tl.int64)
    page = tl.load(PageTable + tok // page_size, mask=n_ok, other=0).to(tl.int64)
    slot = page * page_size + tok % page_size
    offs_d = tl.arange(0, BLOCK_D)
    k = tl.load(K + slot[:, None] * stride_ks + g * stride_kh + offs_d[None, :],
                mask=n_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    return k, n_ok


@triton.jit
def _valid_count(count, Valid, HAS_VALID: tl.constexpr):
    """The candidates that vote: count, or the device count Valid[0] (<= count) when given."""
    if HAS_VALID:
        return tl.minimum(count, tl.load(Valid).to(tl.int32))
    return count


@triton.jit
def _row_logits(Q, k, n_ok, g, rb, kv_group, rows, sm_scale, stride_qn, stride_qh,
                D: tl.constexpr, BLOCK_D: tl.constexpr, ROW_BLOCK: tl.constexpr, OP_DTYPE: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """-> (logits [ROW_BLOCK, BLOCK_N] fp32, -inf outside, row ids [ROW_BLOCK], row mask) of rows rb.. of kv head g
    against the key tile k."""
    offs_d = tl.arange(0, BLOCK_D)
    row = rb + tl.arange(0, ROW_BLOCK)  # row = query * kv_group + head within the group
    r_ok = row < rows
    h = g * kv_group + row % kv_group
    q = tl.load(Q + (row // kv_group)[:, None] * stride_qn + h[:, None] * stride_qh + offs_d[None, :],
                mask=r_ok[:, None] & (offs_d < D)[None, :], other=0.0)  # [ROW_BLOCK, BLOCK_D]
    s = tl.dot(q.to(OP_DTYPE), tl.trans(k.to(OP_DTYPE)), input_precision=DOT_PRECISION) * sm_scale
    return tl.where(r_ok[:, None] & n_ok[None, :], s, float("-inf")), row, r_ok


@triton.jit
def _tile_stats_kernel(Q, K, PageTable, TileMax, TileSum, Valid, start, count, page_size, kv_group, rows,
                       num_kv_heads, num_tiles, sm_scale, stride_qn, stride_qh, stride_ks, stride_kh,
                       D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, ROW_BLOCK: tl.constexpr,
                       OP_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_VALID: tl.constexpr):
    t = tl.program_id(0)
    count = _valid_count(count, Valid, HAS_VALID)
    for g in range(num_kv_heads):
        k, n_ok = _key_tile(K, PageTable, start, count, page_size, g, t, stride_ks, stride_kh, BLOCK_D, BLOCK_N, D)
        for rb in range(0, rows, ROW_BLOCK):
            s, row, r_ok = _row_logits(Q, k, n_ok, g, rb, kv_group, rows, sm_scale, stride_qn, stride_qh, D, BLOCK_D,
                                       ROW_BLOCK, OP_DTYPE, DOT_PRECISION)
            m = tl.max(s, axis=1)  # -inf for padded rows, and in a tile past the valid candidates
            m_safe = tl.where(r_ok & (m > float("-inf")), m, 0.0)
            l = tl.sum(tl.exp(s - m_safe[:, None]), axis=1)
            stat = (g * rows + row).to(tl.int64) * num_tiles + t
            tl.store(TileMax + stat, m, mask=r_ok)
            tl.store(TileSum + stat, l, mask=r_ok)


@triton.jit
def _votes_kernel(Q, K, PageTable, Lse, Votes, Valid, start, count, page_size, kv_group, rows, num_kv_heads, sm_scale,
                  stride_qn, stride_qh, stride_ks, stride_kh,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, ROW_BLOCK: tl.constexpr,
                  OP_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_VALID: tl.constexpr):
    t = tl.program_id(0)
    acc = tl.zeros((BLOCK_N,), tl.float32)
    voting = _valid_count(count, Valid, HAS_VALID)  # the rest of the count are stored as 0
    for g in range(num_kv_heads):
        k, n_ok = _key_tile(K, PageTable, start, voting, page_size, g, t, stride_ks, stride_kh, BLOCK_D, BLOCK_N, D)
        for rb in range(0, rows, ROW_BLOCK):
            s, row, r_ok = _row_logits(Q, k, n_ok, g, rb, kv_group, rows, sm_scale, stride_qn, stride_qh, D, BLOCK_D,
                                       ROW_BLOCK, OP_DTYPE, DOT_PRECISION)
            lse = tl.load(Lse + g * rows + row, mask=r_ok, other=0.0)
            acc += tl.sum(tl.exp(s - lse[:, None]), axis=0)  # padded rows and candidates: exp(-inf) = 0
    offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(Votes + offs_n, acc, mask=offs_n < count)


def summed_soft_vote_triton(q_rot: torch.Tensor, k_flat: torch.Tensor, page_table: torch.Tensor, page_size: int,
                            start: int, count: int, sm_scale: float, valid: torch.Tensor | None = None) -> torch.Tensor:
    n, H, d = q_rot.shape
    Hkv = k_flat.shape[1]
    if H % Hkv or k_flat.shape[2] != d:
        raise ValueError(f"shape mismatch: q {tuple(q_rot.shape)}, k {tuple(k_flat.shape)}")
    if k_flat.stride(2) != 1:
        raise ValueError("k_flat needs a contiguous head dimension")
    device = q_rot.device
    if count <= 0:
        return torch.empty(0, dtype=torch.float32, device=device)
    q = q_rot.float().contiguous()
    group, rows, tiles = H // Hkv, n * (H // Hkv), triton.cdiv(count, BLOCK_N)
    op_dtype = _OP_DTYPES.get(k_flat.dtype, tl.float32)
    meta = dict(D=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=BLOCK_N, ROW_BLOCK=ROW_BLOCK,
                OP_DTYPE=op_dtype, DOT_PRECISION="ieee" if op_dtype == tl.float32 else "tf32", HAS_VALID=valid is not None)
    valid_ptr = valid if valid is not None else page_table  # unread without HAS_VALID
    strides = (q.stride(0), q.stride(1), k_flat.stride(0), k_flat.stride(1))
    table = page_table.contiguous()
    tile_max = torch.empty((Hkv, rows, tiles), dtype=torch.float32, device=device)
    tile_sum = torch.empty_like(tile_max)
    _tile_stats_kernel[(tiles,)](q, k_flat, table, tile_max, tile_sum, valid_ptr, start, count, page_size, group, rows,
                                 Hkv, tiles, sm_scale, *strides, **meta)
    m = tile_max.amax(-1, keepdim=True)
    lse = (m + (tile_sum * torch.exp(tile_max - m)).sum(-1, keepdim=True).log()).squeeze(-1).contiguous()  # [Hkv, rows]
    votes = torch.empty(count, dtype=torch.float32, device=device)
    _votes_kernel[(tiles,)](q, k_flat, table, lse, votes, valid_ptr, start, count, page_size, group, rows, Hkv, sm_scale,
                            *strides, **meta)
    return votes

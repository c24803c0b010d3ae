"""Triton kernels: sparse attention over an explicit key list, reading the paged cache, RoPE on the fly.

Same signatures and semantics as `reference.py` (the oracle).

Prefill (`_sparse_prefill_kernel`), FlashAttention-style. Grid: (query tiles, kv heads). A query block
(`query_block_size` queries sharing one key list) is cut into tiles of BLOCK_Q queries; one program
takes one tile and one kv head and packs the GROUP = H / Hkv query heads of that kv head with the tile's
queries into the M dimension of the dots: row r is query r // GROUP_PAD, head r % GROUP_PAD (GROUP padded
to a power of two, padded rows masked). So each gathered key/value tile is loaded and rotated once per
GQA group instead of once per head, and M = BLOCK_Q * GROUP_PAD >= 16 even for small groups. The program
walks the key list in tiles of BLOCK_N listed keys: token -> page -> flat slot, k is loaded in two halves
(transposed, [d/2, BLOCK_N]) so that rotate-half RoPE is elementwise with the cos/sin rows of each key's
RoPE position (no shuffle), then S = q1 @ k1' + q2 @ k2' (two dots, fp32 accumulation), causal mask
`key_token <= query_pos`, online softmax in the exp2 domain, acc += P @ V. Queries are rotated once per
program. Rows that see no key end with l == 0 and are written as zeros.

Decode (`_sparse_decode_kernel`), flash-decoding. Grid: (B, Hkv, num_splits). Each program takes the
GROUP heads of one kv head (padded to BLOCK_H >= 16 rows for tl.dot) and a contiguous share of the
sequence's listed keys (shares are balanced per sequence from its own key count, rounded to BLOCK_N).
With one split it writes the output directly; otherwise it writes a normalized partial output and its
log2-sum-exp, and `split_k.merge_splits` merges the splits (or, a fused merge, the last split does).

fp32 inputs use IEEE fp32 dots (no TF32) so they match the fp32 oracle; bf16/fp16 inputs use tensor-core
dots of the input dtype with fp32 accumulation (q/k are rotated in fp32 and rounded once). Slots are
computed in int64 (caches beyond 2^31 elements). Head dims need not be powers of two (masked padding).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from infinitehip.attention.ops.sparse.launch import (
    DecodeLaunch, default_num_splits, prefill_config, sparse_decode_launch,
)
from infinitehip.attention.ops.sparse.split_k import (
    dot_precision, merge_if_last_split, rope_table_dtype, split_launch,
)
from infinitehip.triton_interpreter import fix_interpreter_if_active

_LOG2E = 1.4426950408889634


fix_interpreter_if_active()


@triton.jit
def _attend_key_range(
    acc, m_i, l_i,  # running state: [M, D_PAD] fp32, [M] fp32, [M] fp32
    q1, q2,  # rotated query halves [M, HALF_PAD], dtype of the dots
    qpos,  # [M] int32 original query positions (used when CAUSAL)
    K, V, PageTable, KeyTokens, KeyRopePos, Cos, Sin,
    k_head_off, v_head_off, stride_ks, stride_vs, stride_cos, page_size,
    key_lo, key_hi,  # listed keys [key_lo, key_hi) of this program
    qk_scale,  # sm_scale * log2(e)
    CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    offs_h = tl.arange(0, HALF_PAD)  # half-dim index (rows of the transposed k halves)
    offs_dv = tl.arange(0, 2 * HALF_PAD)  # full dim index of v
    for start in range(key_lo, key_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < key_hi
        tok = tl.load(KeyTokens + offs_n, mask=n_ok, other=0)
        rpos = tl.load(KeyRopePos + offs_n, mask=n_ok, other=0)
        page = tl.load(PageTable + tok // page_size, mask=n_ok, other=0)
        slot = page.to(tl.int64) * page_size + tok % page_size
        if HALF == HALF_PAD:
            k_mask = n_ok[None, :]
            v_mask = n_ok[:, None]
        else:
            k_mask = n_ok[None, :] & (offs_h[:, None] < HALF)
            v_mask = n_ok[:, None] & (offs_dv[None, :] < 2 * HALF)
        # k halves, transposed [HALF_PAD, BLOCK_N], rotated in fp32 (rotate-half: pair (i, i + d/2)).
        k_ptrs = K + k_head_off + slot[None, :] * stride_ks + offs_h[:, None]
        k1 = tl.load(k_ptrs, mask=k_mask, other=0.0).to(tl.float32)
        k2 = tl.load(k_ptrs + HALF, mask=k_mask, other=0.0).to(tl.float32)
        cs_off = rpos[None, :].to(tl.int64) * stride_cos + offs_h[:, None]
        cos = tl.load(Cos + cs_off, mask=k_mask, other=0.0)
        sin = tl.load(Sin + cs_off, mask=k_mask, other=0.0)
        k1r = (k1 * cos - k2 * sin).to(q1.dtype)
        k2r = (k2 * cos + k1 * sin).to(q1.dtype)

        s = tl.dot(q1, k1r, input_precision=DOT_PRECISION)
        s = tl.dot(q2, k2r, s, input_precision=DOT_PRECISION)
        s = s * qk_scale
        if CAUSAL:
            visible = n_ok[None, :] & (tok[None, :] <= qpos[:, None])
        else:
            visible = n_ok[None, :]
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)

        v = tl.load(V + v_head_off + slot[:, None] * stride_vs + offs_dv[None, :], mask=v_mask, other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _sparse_prefill_kernel(
    Q, K, V, Out, PageTable, KeyTokens, KeyCounts, KeyRopePos, QueryPos, QueryRopePos, Cos, Sin,
    qk_scale, n_q, query_block_size, tiles_per_qblock, page_size, max_keys,
    stride_qn, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_on, stride_oh,
    stride_kt, stride_kr, stride_cos,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    pid = tl.program_id(0)
    hkv = tl.program_id(1)
    qblock = pid // tiles_per_qblock
    tile = pid % tiles_per_qblock

    # Row r of the tile: query (tile start + r // GROUP_PAD), head (hkv * GROUP + r % GROUP_PAD).
    offs_m = tl.arange(0, BLOCK_M)
    in_block = tile * BLOCK_Q + offs_m // GROUP_PAD
    q_row = qblock * query_block_size + in_block
    g = offs_m % GROUP_PAD
    row_ok = (in_block < query_block_size) & (q_row < n_q) & (g < GROUP)
    head = hkv * GROUP + g

    offs_h = tl.arange(0, HALF_PAD)
    offs_dv = tl.arange(0, 2 * HALF_PAD)
    if HALF == HALF_PAD:
        q_mask = row_ok[:, None]
        o_mask = row_ok[:, None]
    else:
        q_mask = row_ok[:, None] & (offs_h[None, :] < HALF)
        o_mask = row_ok[:, None] & (offs_dv[None, :] < 2 * HALF)

    # Rotate the queries once, in fp32.
    q_ptrs = Q + q_row[:, None].to(tl.int64) * stride_qn + head[:, None] * stride_qh + offs_h[None, :]
    q1 = tl.load(q_ptrs, mask=q_mask, other=0.0).to(tl.float32)
    q2 = tl.load(q_ptrs + HALF, mask=q_mask, other=0.0).to(tl.float32)
    qrp = tl.load(QueryRopePos + q_row, mask=row_ok, other=0)
    cs_off = qrp[:, None].to(tl.int64) * stride_cos + offs_h[None, :]
    cos = tl.load(Cos + cs_off, mask=q_mask, other=0.0)
    sin = tl.load(Sin + cs_off, mask=q_mask, other=0.0)
    dot_dtype = Q.dtype.element_ty
    q1r = (q1 * cos - q2 * sin).to(dot_dtype)
    q2r = (q2 * cos + q1 * sin).to(dot_dtype)
    qpos = tl.load(QueryPos + q_row, mask=row_ok, other=-1)

    count = tl.minimum(tl.load(KeyCounts + qblock), max_keys)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, 2 * HALF_PAD], tl.float32)
    acc, m_i, l_i = _attend_key_range(
        acc, m_i, l_i, q1r, q2r, qpos,
        K, V, PageTable, KeyTokens + qblock.to(tl.int64) * stride_kt, KeyRopePos + qblock.to(tl.int64) * stride_kr,
        Cos, Sin, hkv * stride_kh, hkv * stride_vh, stride_ks, stride_vs, stride_cos, page_size,
        0, count, qk_scale,
        CAUSAL=True, BLOCK_N=BLOCK_N, HALF=HALF, HALF_PAD=HALF_PAD, DOT_PRECISION=DOT_PRECISION,
    )
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]  # rows without a visible key: acc == 0 -> zeros
    o_ptrs = Out + q_row[:, None].to(tl.int64) * stride_on + head[:, None] * stride_oh + offs_dv[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=o_mask)


@triton.jit
def _sparse_decode_kernel(
    Q, K, V, Out, PartOut, PartLse, Counters, PageTables, KeyTokens, KeyCounts, KeyRopePos, QueryRopePos, Cos, Sin,
    qk_scale, num_heads, num_splits, page_size, max_keys,
    stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ob, stride_oh,
    stride_pt, stride_kt, stride_kr, stride_cos,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr,
    FUSED_MERGE: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    b = tl.program_id(0)
    hkv = tl.program_id(1)
    split = tl.program_id(2)

    offs_m = tl.arange(0, BLOCK_H)
    row_ok = offs_m < GROUP
    head = hkv * GROUP + offs_m
    offs_h = tl.arange(0, HALF_PAD)
    offs_dv = tl.arange(0, 2 * HALF_PAD)
    if HALF == HALF_PAD:
        q_mask = row_ok[:, None]
        o_mask = row_ok[:, None]
    else:
        q_mask = row_ok[:, None] & (offs_h[None, :] < HALF)
        o_mask = row_ok[:, None] & (offs_dv[None, :] < 2 * HALF)

    q_ptrs = Q + b.to(tl.int64) * stride_qb + head[:, None] * stride_qh + offs_h[None, :]
    q1 = tl.load(q_ptrs, mask=q_mask, other=0.0).to(tl.float32)
    q2 = tl.load(q_ptrs + HALF, mask=q_mask, other=0.0).to(tl.float32)
    qrp = tl.load(QueryRopePos + b).to(tl.int64)
    cos = tl.load(Cos + qrp * stride_cos + offs_h, mask=offs_h < HALF, other=0.0)[None, :]
    sin = tl.load(Sin + qrp * stride_cos + offs_h, mask=offs_h < HALF, other=0.0)[None, :]
    dot_dtype = Q.dtype.element_ty
    q1r = (q1 * cos - q2 * sin).to(dot_dtype)
    q2r = (q2 * cos + q1 * sin).to(dot_dtype)

    # This split's share of the sequence's listed keys, balanced by its own count, BLOCK_N-aligned.
    count = tl.minimum(tl.load(KeyCounts + b), max_keys)
    per_split = tl.cdiv(tl.cdiv(count, num_splits), BLOCK_N) * BLOCK_N
    key_lo = split * per_split
    key_hi = tl.minimum(key_lo + per_split, count)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, 2 * HALF_PAD], tl.float32)
    acc, m_i, l_i = _attend_key_range(
        acc, m_i, l_i, q1r, q2r, m_i,  # qpos unused (CAUSAL=False)
        K, V, PageTables + b.to(tl.int64) * stride_pt, KeyTokens + b.to(tl.int64) * stride_kt,
        KeyRopePos + b.to(tl.int64) * stride_kr,
        Cos, Sin, hkv * stride_kh, hkv * stride_vh, stride_ks, stride_vs, stride_cos, page_size,
        key_lo, key_hi, qk_scale,
        CAUSAL=False, BLOCK_N=BLOCK_N, HALF=HALF, HALF_PAD=HALF_PAD, DOT_PRECISION=DOT_PRECISION,
    )
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    if SPLIT:
        # Partial [B, H, num_splits, d] (normalized) and its log2-sum-exp [B, H, num_splits] (-inf if empty).
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        part_row = (b * num_heads + head).to(tl.int64) * num_splits + split
        tl.store(PartLse + part_row, lse, mask=row_ok)
        tl.store(PartOut + part_row[:, None] * (2 * HALF) + offs_dv[None, :], out, mask=o_mask)
        if FUSED_MERGE:
            merge_if_last_split(PartOut, PartLse, Out, Counters, b, hkv, num_heads, num_splits, stride_ob, stride_oh,
                                GROUP=GROUP, D=2 * HALF, D_PAD=2 * HALF_PAD, SPLITS_PAD=SPLITS_PAD)
    else:
        o_ptrs = Out + b.to(tl.int64) * stride_ob + head[:, None] * stride_oh + offs_dv[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=o_mask)


def _prep(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Unit stride on the last dim (the kernels assume it); optionally cast."""
    if dtype is not None and x.dtype != dtype:
        x = x.to(dtype)
    return x if x.stride(-1) == 1 else x.contiguous()


def _check_common(q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, cos: torch.Tensor) -> tuple[int, int]:
    H, d = q.shape[1], q.shape[2]
    Hkv = k_flat.shape[1]
    assert d % 2 == 0 and k_flat.shape[2] == d and v_flat.shape == k_flat.shape, "head dims differ"
    assert H % Hkv == 0, "num heads must be a multiple of num kv heads"
    assert cos.shape[-1] == d // 2, "cos/sin tables must be [P, head_dim / 2]"
    assert k_flat.dtype == v_flat.dtype == q.dtype, "q and the cache must share a dtype"
    return H // Hkv, d // 2


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
    """See `reference.sparse_attention_prefill`. q [n, H, d] pre-RoPE -> [n, H, d] in q's dtype."""
    n, H, d = q.shape
    group, half = _check_common(q, k_flat, v_flat, cos)
    out = torch.empty_like(q)
    n_qblocks = triton.cdiv(n, query_block_size)
    if n == 0:
        return out
    if key_tokens.shape[-1] == 0:
        return out.zero_()
    assert key_tokens.shape[0] >= n_qblocks and key_counts.shape[0] >= n_qblocks

    q, k_flat, v_flat = _prep(q), _prep(k_flat), _prep(v_flat)
    i32 = torch.int32
    page_table, key_counts = _prep(page_table, i32), _prep(key_counts, i32)
    key_tokens, key_rope_pos = _prep(key_tokens, i32), _prep(key_rope_pos, i32)
    query_pos, query_rope_pos = _prep(query_pos, i32), _prep(query_rope_pos, i32)
    cos, sin = _prep(cos, torch.float32), _prep(sin, torch.float32)
    assert cos.stride(0) == sin.stride(0)

    half_pad = max(16, triton.next_power_of_2(half))
    group_pad = triton.next_power_of_2(group)
    cfg = prefill_config(half_pad, group_pad, query_block_size, q.element_size())
    block_q = cfg["BLOCK_Q"]
    tiles_per_qblock = triton.cdiv(min(query_block_size, n), block_q)
    grid = (n_qblocks * tiles_per_qblock, k_flat.shape[1])

    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        _sparse_prefill_kernel[grid](
            q, k_flat, v_flat, out, page_table, key_tokens, key_counts, key_rope_pos, query_pos, query_rope_pos,
            cos, sin,
            sm_scale * _LOG2E, n, query_block_size, tiles_per_qblock, page_size, key_tokens.shape[1],
            q.stride(0), q.stride(1), k_flat.stride(0), k_flat.stride(1), v_flat.stride(0), v_flat.stride(1),
            out.stride(0), out.stride(1), key_tokens.stride(0), key_rope_pos.stride(0), cos.stride(0),
            GROUP=group, GROUP_PAD=group_pad, HALF=half, HALF_PAD=half_pad, DOT_PRECISION=dot_precision(q.dtype),
            **cfg,
        )
    return out


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
    num_splits: int | None = None,
    launch: DecodeLaunch | None = None,
) -> torch.Tensor:
    """See `reference.sparse_attention_decode`. q [B, H, d] pre-RoPE -> [B, H, d] in q's dtype. cos/sin: fp32
    tables, or fp16 (half the bytes each listed key reads beside it; the rotations still in fp32); launch None:
    `launch.sparse_decode_launch`."""
    B, H, d = q.shape
    group, half = _check_common(q, k_flat, v_flat, cos)
    Hkv = k_flat.shape[1]
    out = torch.empty_like(q)
    if B == 0:
        return out
    max_keys = key_tokens.shape[-1]
    if max_keys == 0:
        return out.zero_()

    q, k_flat, v_flat = _prep(q), _prep(k_flat), _prep(v_flat)
    i32 = torch.int32
    page_tables, key_counts = _prep(page_tables, i32), _prep(key_counts, i32)
    key_tokens, key_rope_pos = _prep(key_tokens, i32), _prep(key_rope_pos, i32)
    query_rope_pos = _prep(query_rope_pos, i32)
    cos, sin = _prep(cos, rope_table_dtype(cos)), _prep(sin, rope_table_dtype(cos))
    assert cos.stride(0) == sin.stride(0)

    half_pad = max(16, triton.next_power_of_2(half))
    block_h = max(16, triton.next_power_of_2(group))
    launch = (launch or DecodeLaunch()).over(sparse_decode_launch(B, Hkv, half_pad))
    block_n = launch.block_n
    if num_splits is None:
        num_splits = default_num_splits(B, Hkv, max_keys, q.device)
    num_splits = max(1, min(int(num_splits), triton.cdiv(max_keys, block_n)))
    splits = split_launch(out, Hkv, num_splits, launch.fused_merge)

    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        _sparse_decode_kernel[(B, Hkv, num_splits)](
            q, k_flat, v_flat, out, splits.part_out, splits.part_lse, splits.counters, page_tables, key_tokens,
            key_counts, key_rope_pos, query_rope_pos, cos, sin,
            sm_scale * _LOG2E, H, num_splits, page_size, max_keys,
            q.stride(0), q.stride(1), k_flat.stride(0), k_flat.stride(1), v_flat.stride(0), v_flat.stride(1),
            out.stride(0), out.stride(1), page_tables.stride(0), key_tokens.stride(0), key_rope_pos.stride(0),
            cos.stride(0),
            GROUP=group, BLOCK_H=block_h, HALF=half, HALF_PAD=half_pad, DOT_PRECISION=dot_precision(q.dtype),
            SPLIT=splits.split, FUSED_MERGE=splits.fused, SPLITS_PAD=splits.splits_pad, BLOCK_N=block_n,
            num_warps=launch.num_warps, num_stages=launch.num_stages,
        )
        splits.finish(out)
    return out

"""The paged dense decode as Triton kernels, flash-decoding style (same signature and semantics as `reference.py`).

`_paged_decode_kernel`, grid (B, Hkv, num_splits): one program takes the GROUP = H / Hkv query heads of one kv head
of one sequence (padded to BLOCK_H >= 16 rows for tl.dot) and a contiguous share of that sequence's visible keys
(its own length, or its last `window` keys; shares balanced per sequence and BLOCK_N-aligned), so each key/value
page is read from memory once per step and one long sequence still spreads over the whole GPU. It walks its share
in tiles of BLOCK_N tokens: token -> page table -> flat slot, the key tile loaded in two halves (transposed,
[d/2, BLOCK_N]) so rotate-half RoPE at the token's position is elementwise, S = q1 @ k1' + q2 @ k2' (fp32
accumulation), optional soft-capping, online softmax in the exp2 domain, acc += P @ V. With one split the program
writes the output; otherwise a normalized partial and its log2-sum-exp, merged by
the sparse op's `merge_splits` (ops/sparse/split_k.py).

Every shape depends on host ints only (B, the page-table width, num_splits); lengths and page tables are read
from device tensors, so a launch is sync-free. fp32 inputs use IEEE fp32 dots (they match the fp32 oracle);
bf16/fp16 use tensor-core dots of the input dtype (keys rotated in fp32, rounded once).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from infinitehip.attention.ops.sparse.launch import DecodeLaunch
from infinitehip.attention.ops.sparse.split_k import (
    dot_precision, merge_if_last_split, rope_table_dtype, split_launch,
)
from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()

_LOG2E = 1.4426950408889634


@triton.jit
def _paged_decode_kernel(
    Q, K, V, Out, PartOut, PartLse, Counters, PageTables, Lengths, Cos, Sin,
    scale, softcap, window, num_heads, num_splits, page_size,
    stride_qb, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_ob, stride_oh, stride_pt, stride_cos,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SPLIT: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    FUSED_MERGE: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    b = tl.program_id(0)
    hkv = tl.program_id(1)
    split = tl.program_id(2)

    offs_m = tl.arange(0, BLOCK_H)
    row_ok = offs_m < GROUP
    head = hkv * GROUP + offs_m
    offs_h = tl.arange(0, HALF_PAD)  # half-dim index
    offs_dv = tl.arange(0, 2 * HALF_PAD)  # full-dim index of v and the output
    q_mask = row_ok[:, None] & (offs_h[None, :] < HALF)
    o_mask = row_ok[:, None] & (offs_dv[None, :] < 2 * HALF)
    q_ptrs = Q + b.to(tl.int64) * stride_qb + head[:, None] * stride_qh + offs_h[None, :]
    dot_dtype = Q.dtype.element_ty
    q1 = tl.load(q_ptrs, mask=q_mask, other=0.0).to(dot_dtype)  # [BLOCK_H, HALF_PAD], already rotated
    q2 = tl.load(q_ptrs + HALF, mask=q_mask, other=0.0).to(dot_dtype)

    # This split's share of the sequence's visible keys [first, length), balanced by its own span.
    length = tl.load(Lengths + b)
    if WINDOW:
        first = tl.maximum(length - window, 0)
    else:
        first = length * 0
    per_split = tl.cdiv(tl.cdiv(length - first, num_splits), BLOCK_N) * BLOCK_N
    key_lo = first + split * per_split
    key_hi = tl.minimum(key_lo + per_split, length)

    page_table = PageTables + b.to(tl.int64) * stride_pt
    k_base = K + hkv.to(tl.int64) * stride_kh
    v_base = V + hkv.to(tl.int64) * stride_vh
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, 2 * HALF_PAD], tl.float32)
    for start in range(key_lo, key_hi, BLOCK_N):
        tok = start + tl.arange(0, BLOCK_N)
        n_ok = tok < key_hi
        page = tl.load(page_table + tok // page_size, mask=n_ok, other=0)
        slot = page.to(tl.int64) * page_size + tok % page_size
        k_mask = n_ok[None, :] & (offs_h[:, None] < HALF)
        # key halves, transposed [HALF_PAD, BLOCK_N], rotated in fp32 at their positions (= cache index)
        k_ptrs = k_base + slot[None, :] * stride_ks + offs_h[:, None]
        k1 = tl.load(k_ptrs, mask=k_mask, other=0.0).to(tl.float32)
        k2 = tl.load(k_ptrs + HALF, mask=k_mask, other=0.0).to(tl.float32)
        cs_off = tok[None, :].to(tl.int64) * stride_cos + offs_h[:, None]
        cos = tl.load(Cos + cs_off, mask=k_mask, other=0.0).to(tl.float32)
        sin = tl.load(Sin + cs_off, mask=k_mask, other=0.0).to(tl.float32)
        k1r = (k1 * cos - k2 * sin).to(dot_dtype)
        k2r = (k2 * cos + k1 * sin).to(dot_dtype)
        s = tl.dot(q1, k1r, input_precision=DOT_PRECISION)
        s = tl.dot(q2, k2r, s, input_precision=DOT_PRECISION) * scale  # [BLOCK_H, BLOCK_N]
        if SOFTCAP:  # cap * tanh(s / cap), tanh(x) = 2 sigmoid(2x) - 1
            s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)
        s = tl.where(n_ok[None, :], s * 1.4426950408889634, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + slot[:, None] * stride_vs + offs_dv[None, :],
                    mask=n_ok[:, None] & (offs_dv[None, :] < 2 * HALF), other=0.0)
        acc = tl.dot(p.to(dot_dtype), v.to(dot_dtype), acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    if SPLIT:  # partial [B, H, num_splits, d] (normalized) and its log2-sum-exp [B, H, num_splits] (-inf: empty)
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


def default_launch(batch: int, num_kv_heads: int, half_pad: int) -> DecodeLaunch:
    """Measured on an H200 (bench/suites/paged_decode.py, Llama-3-8B's layer): where a few (sequence, kv head) pairs
    are split 64 ways, small programs (32 keys, 2 warps, 3 stages) read fastest; with more pairs, 64-key tiles over 4
    warps. Head dims above 128 keep 32-key tiles over 4 warps (the register budget of the wider tiles)."""
    if half_pad > 64:
        return DecodeLaunch(block_n=32, num_warps=4, num_stages=2)
    if batch * num_kv_heads <= 8:
        return DecodeLaunch(block_n=32, num_warps=2, num_stages=3)
    return DecodeLaunch(block_n=64, num_warps=4, num_stages=3)


def default_num_splits(batch: int, num_kv_heads: int, max_tokens: int, device: torch.device) -> int:
    """Key splits per (sequence, kv head) from host ints only (a graph's shapes follow its capacity): ~8 programs
    per SM, at least 256 keys a split (each split costs a partial write and its share of the merge), at most 64."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    want = triton.cdiv(8 * sms, max(1, batch * num_kv_heads))
    return max(1, min(want, triton.cdiv(max_tokens, 256), 64))


def paged_decode_triton(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, page_tables: torch.Tensor,
                        lengths: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scale: float | None = None,
                        window: int | None = None, softcap: float | None = None,
                        num_splits: int | None = None, launch: DecodeLaunch | None = None) -> torch.Tensor:
    """See `reference.paged_decode_reference`; num_splits None: `default_num_splits` of the page-table width.
    cos/sin: fp32 tables, or fp16 (half the bytes a key reads beside it; the rotation still in fp32); launch None:
    `default_launch`."""
    B, H, d = q.shape
    num_pages, page_size, Hkv, dk = k_pages.shape
    if d % 2 or dk != d or v_pages.shape != k_pages.shape or H % Hkv or cos.shape[-1] != d // 2:
        raise ValueError(f"q [B, H, d], k/v pages [N, page_size, Hkv, d] with H % Hkv == 0 and tables [*, d/2] "
                         f"expected, got q {tuple(q.shape)}, pages {tuple(k_pages.shape)}, tables {tuple(cos.shape)}")
    out = torch.empty_like(q)
    if B == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    k_flat, v_flat = k_pages.view(num_pages * page_size, Hkv, d), v_pages.view(num_pages * page_size, Hkv, d)
    page_tables = page_tables.to(torch.int32).contiguous()
    lengths = lengths.to(torch.int32).contiguous()
    cos, sin = cos.to(rope_table_dtype(cos)).contiguous(), sin.to(rope_table_dtype(cos)).contiguous()

    group, half = H // Hkv, d // 2
    half_pad = max(16, triton.next_power_of_2(half))
    block_h = max(16, triton.next_power_of_2(group))
    launch = (launch or DecodeLaunch()).over(default_launch(B, Hkv, half_pad))
    block_n, num_warps, num_stages = launch.block_n, launch.num_warps, launch.num_stages
    max_tokens = page_tables.shape[1] * page_size
    if num_splits is None:
        num_splits = default_num_splits(B, Hkv, max_tokens, q.device)
    num_splits = max(1, min(int(num_splits), triton.cdiv(max_tokens, block_n)))
    splits = split_launch(out, Hkv, num_splits, launch.fused_merge)
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        _paged_decode_kernel[(B, Hkv, num_splits)](
            q, k_flat, v_flat, out, splits.part_out, splits.part_lse, splits.counters, page_tables, lengths, cos,
            sin,
            d ** -0.5 if scale is None else scale, 1.0 if softcap is None else softcap,
            0 if window is None else window, H, num_splits, page_size,
            q.stride(0), q.stride(1), k_flat.stride(0), k_flat.stride(1), v_flat.stride(0), v_flat.stride(1),
            out.stride(0), out.stride(1), page_tables.stride(0), cos.stride(0),
            GROUP=group, BLOCK_H=block_h, BLOCK_N=block_n, HALF=half, HALF_PAD=half_pad,
            DOT_PRECISION=dot_precision(q.dtype), SPLIT=splits.split,
            WINDOW=window is not None, SOFTCAP=softcap is not None, FUSED_MERGE=splits.fused,
            SPLITS_PAD=splits.splits_pad, num_warps=num_warps, num_stages=num_stages,
        )
        splits.finish(out)
    return out

"""The prefill's landmark saliency sums as one Triton kernel (impl "triton"); same arguments and sums as reference.py.

cpu.py's form (window sums as differences of a float64 prefix sum of the queries, [n + 1, H * d]) moves ~15 GB per
32K-query chunk of an 8B-shaped layer through memory (the fp64 buffer written, scanned, gathered twice). Here the
window sums are built from blocks of BLOCK rows instead, with window a multiple of BLOCK. In the query index space of
the keys (row j holds query first_key + j, zero outside the chunk: Qv, [rows, H, d] fp32), key i's window is rows
[i, i + window). For the keys i = i0 + r of block B (i0 = B * BLOCK, r < BLOCK) it is

    rows [i0 + r, i0 + BLOCK)          the suffix of block B          Tot_B - C_B[r] + X_B[r]
  + blocks B + 1 .. B + m - 1           m = window / BLOCK             BP[B + m] - BP[B + 1]
  + rows [i0 + window, i0 + window + r) the prefix of block B + m      C_E[r] - X_E[r]

with X the block's rows, C their inclusive cumulative sum (fp32, BLOCK terms) and BP the float64 prefix sum of the
blocks' totals ([blocks + 1, H, d]: BLOCK times smaller than cpu.py's). One program per (key block, KV head) loads
the two blocks of each of its GROUP query heads once (in slices of the head dim, to keep its tiles in registers) and
writes the BLOCK keys' sums [BLOCK, H]; the traffic is about four passes over the fp32 queries.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


def block_rows(window: int) -> int:
    """The kernel's BLOCK for a window: the largest power of two <= 64 dividing it (0: none >= 16, use cpu.py)."""
    block = min(64, window & -window)
    return block if block >= 16 else 0


@triton.jit
def _window_logits_kernel(
    Qv, K, BP, Out, L, stride_qr, stride_qh, stride_kl, stride_kh, stride_br, stride_bh, stride_ol,
    M: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    DC: tl.constexpr,
):
    kb = tl.program_id(0)
    g = tl.program_id(1)
    offs_r = tl.arange(0, BLOCK)
    i0 = kb * BLOCK
    key_ok = (i0 + offs_r) < L
    rows_b = (i0 + offs_r).to(tl.int64)  # block B of Qv: the keys' own rows
    rows_e = rows_b + M * BLOCK  # block B + m: a window later
    for j in tl.static_range(GROUP):
        h = g * GROUP + j
        logit = tl.zeros([BLOCK], tl.float32)
        # the head dim in slices of DC: the window sums are per column, and [BLOCK, DC] tiles keep registers low
        for c in tl.static_range(0, D_PAD, DC):
            offs_d = c + tl.arange(0, DC)
            d_ok = offs_d < D
            x_b = tl.load(Qv + rows_b[:, None] * stride_qr + h * stride_qh + offs_d[None, :], mask=d_ok[None, :],
                          other=0.0)
            x_e = tl.load(Qv + rows_e[:, None] * stride_qr + h * stride_qh + offs_d[None, :], mask=d_ok[None, :],
                          other=0.0)
            mid_hi = tl.load(BP + (kb + M).to(tl.int64) * stride_br + h * stride_bh + offs_d, mask=d_ok, other=0.0)
            mid_lo = tl.load(BP + (kb + 1).to(tl.int64) * stride_br + h * stride_bh + offs_d, mask=d_ok, other=0.0)
            mid = (mid_hi - mid_lo).to(tl.float32)
            # [BLOCK, DC]: each key's window sum (suffix of block B + whole blocks + prefix of block B + m)
            s = (tl.sum(x_b, 0)[None, :] - tl.cumsum(x_b, 0) + x_b) + mid[None, :] + (tl.cumsum(x_e, 0) - x_e)
            k = tl.load(K + rows_b[:, None] * stride_kl + g * stride_kh + offs_d[None, :],
                        mask=key_ok[:, None] & d_ok[None, :], other=0.0)
            logit += tl.sum(s * k, 1)
        tl.store(Out + rows_b * stride_ol + h, logit, mask=key_ok)


def window_logit_sums_triton(q_rot: torch.Tensor, k: torch.Tensor, first_key: int, window: int) -> torch.Tensor:
    n, H, d = q_rot.shape
    L, Hkv, _ = k.shape
    block = block_rows(window)
    if block == 0:  # a window with no power-of-two factor >= 16
        from infinitehip.attention.methods.infinitehip.window_saliency.cpu import window_logit_sums_cpu

        return window_logit_sums_cpu(q_rot, k, first_key, window)
    out = torch.empty(L, H, dtype=torch.float32, device=q_rot.device)
    if L == 0:
        return out
    m = window // block
    key_blocks = triton.cdiv(L, block)
    rows = (key_blocks + m) * block  # every row a program reads (the last key block's block B + m)
    # Qv: row j is query first_key + j (first_key <= 0), zero outside the chunk
    qv = torch.zeros(rows, H, d, dtype=torch.float32, device=q_rot.device)
    qv[-first_key : -first_key + n] = q_rot
    totals = qv.view(rows // block, block, H, d).sum(1, dtype=torch.float64)  # [blocks, H, d]
    bp = torch.zeros(rows // block + 1, H, d, dtype=torch.float64, device=q_rot.device)
    torch.cumsum(totals, 0, out=bp[1:])
    k = k.float().contiguous()
    d_pad = triton.next_power_of_2(d)
    with torch.cuda.device(q_rot.device) if q_rot.is_cuda else contextlib.nullcontext():
        _window_logits_kernel[(key_blocks, Hkv)](
            qv, k, bp, out, L, qv.stride(0), qv.stride(1), k.stride(0), k.stride(1), bp.stride(0), bp.stride(1),
            out.stride(0), M=m, GROUP=H // Hkv, BLOCK=block, D=d, D_PAD=d_pad, DC=min(64, d_pad), num_warps=4,
        )
    return out

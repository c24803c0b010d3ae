"""Joining two chunk lists as one Triton kernel (same outputs as `reference.py`).

Why a kernel: the reference's sort is a handful of launches (argsort of a few hundred entries included) that cost
~0.1 ms on an H100 inside a decode graph, as much as a pruning stage. One program per row instead ranks each
listed chunk by counting the listed chunks of both lists that start before it ([C, C], [C, E], [E, C], [E, E]
comparisons in registers: the lists hold at most a few hundred chunks) and scatters it to its rank; empties
follow in input order, as (0, 0). The comparisons run on int32 copies (positions stay far below 2^31): int64
[128, 128] tiles held twice the registers per thread, and 8 warps spread the tiles over 256 threads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.attention.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def _merge_chunks_kernel(Starts, Lens, XStarts, XLens, OutStarts, OutLens, C, E,
                         stride_s, stride_l, stride_xs, stride_xl, stride_os, stride_ol,
                         BLOCK_C: tl.constexpr, BLOCK_E: tl.constexpr):
    m = tl.program_id(0)
    ic = tl.arange(0, BLOCK_C)
    ie = tl.arange(0, BLOCK_E)
    a_s = tl.load(Starts + m * stride_s + ic, mask=ic < C, other=0).to(tl.int32)
    a_l = tl.load(Lens + m * stride_l + ic, mask=ic < C, other=0).to(tl.int32)
    b_s = tl.load(XStarts + m * stride_xs + ie, mask=ie < E, other=0).to(tl.int32)
    b_l = tl.load(XLens + m * stride_xl + ie, mask=ie < E, other=0).to(tl.int32)
    a_ok = a_l > 0
    # An extra chunk already listed is dropped.
    dup = tl.sum(((a_s[:, None] == b_s[None, :]) & a_ok[:, None]).to(tl.int32), axis=0)  # [BLOCK_E]
    b_ok = (b_l > 0) & (dup == 0)
    # Rank of a listed chunk: the listed chunks of both lists that start before it.
    rank_a = (tl.sum(((a_s[None, :] < a_s[:, None]) & a_ok[None, :]).to(tl.int32), axis=1)
              + tl.sum(((b_s[None, :] < a_s[:, None]) & b_ok[None, :]).to(tl.int32), axis=1))
    rank_b = (tl.sum(((a_s[None, :] < b_s[:, None]) & a_ok[None, :]).to(tl.int32), axis=1)
              + tl.sum(((b_s[None, :] < b_s[:, None]) & b_ok[None, :]).to(tl.int32), axis=1))
    n_listed = tl.sum(a_ok.to(tl.int32), axis=0) + tl.sum(b_ok.to(tl.int32), axis=0)
    empty_a = ((a_l <= 0) & (ic < C)).to(tl.int32)
    empty_b = ((b_ok == 0) & (ie < E)).to(tl.int32)
    rank_a = tl.where(a_ok, rank_a, n_listed + tl.cumsum(empty_a, axis=0) - 1)
    rank_b = tl.where(b_ok, rank_b, n_listed + tl.sum(empty_a, axis=0) + tl.cumsum(empty_b, axis=0) - 1)
    # tl.store casts the int32 values to the outputs' element type.
    tl.store(OutStarts + m * stride_os + rank_a, tl.where(a_ok, a_s, 0), mask=ic < C)
    tl.store(OutLens + m * stride_ol + rank_a, tl.where(a_ok, a_l, 0), mask=ic < C)
    tl.store(OutStarts + m * stride_os + rank_b, tl.where(b_ok, b_s, 0), mask=ie < E)
    tl.store(OutLens + m * stride_ol + rank_b, tl.where(b_ok, b_l, 0), mask=ie < E)


def merge_chunks_triton(starts: torch.Tensor, lens: torch.Tensor, extra_starts: torch.Tensor,
                        extra_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """See `reference.merge_chunks_reference`."""
    M, C = starts.shape
    extra_starts = extra_starts.expand(M, -1) if extra_starts.dim() == 1 else extra_starts
    extra_lens = extra_lens.expand(M, -1) if extra_lens.dim() == 1 else extra_lens
    E = extra_starts.shape[1]
    out_starts = torch.empty(M, C + E, dtype=starts.dtype, device=starts.device)
    out_lens = torch.empty(M, C + E, dtype=lens.dtype, device=lens.device)
    if M == 0:
        return out_starts, out_lens
    tensors = (starts, lens, extra_starts, extra_lens)
    if any(t.stride(1) != 1 for t in tensors if t.shape[1] > 1):
        raise ValueError("chunk lists must be contiguous along their last dimension")
    block_c, block_e = triton.next_power_of_2(max(C, 1)), triton.next_power_of_2(max(E, 1))
    _merge_chunks_kernel[(M,)](
        starts, lens, extra_starts, extra_lens, out_starts, out_lens, C, E,
        starts.stride(0), lens.stride(0), extra_starts.stride(0), extra_lens.stride(0),
        out_starts.stride(0), out_lens.stride(0),
        BLOCK_C=block_c, BLOCK_E=block_e, num_warps=8 if block_c * block_e >= 8192 else 4,
    )
    return out_starts, out_lens

"""Joining two chunk lists in two Triton kernels (same outputs as `reference.py`).

Why kernels: the reference's sort is a handful of launches (argsort of a few hundred entries included) that cost
~0.1 ms on an H100 inside a decode graph, as much as a pruning stage. Instead, each listed chunk's output index is
its rank: the number of listed chunks of both lists that start before it. Ranks are computed for a tile of TILE
chunks per program against both whole lists ([TILE, C] and [TILE, E] comparisons): one program holding every
comparison of two 256-chunk lists ([256, 256] tiles) spilled its registers and took >100 us. A first kernel
marks which extra chunks are kept (not already listed), since the ranks of both lists depend on it. Empties
follow the listed chunks, as (0, 0), at distinct indices (so every output slot is written). Comparisons run on
int32 copies (positions stay far below 2^31).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()

TILE = 32


@triton.jit
def _extra_kept_kernel(Starts, Lens, XStarts, XLens, Kept, C, E, stride_s, stride_l, stride_xs, stride_xl, stride_k,
                       BLOCK_C: tl.constexpr, TILE: tl.constexpr):
    """Kept[m, j] = extra chunk j is listed (length > 0) and its start is not among the listed chunks' starts."""
    m, t = tl.program_id(0), tl.program_id(1)
    ic = tl.arange(0, BLOCK_C)
    j = t * TILE + tl.arange(0, TILE)
    a_s = tl.load(Starts + m * stride_s + ic, mask=ic < C, other=0).to(tl.int32)
    a_ok = tl.load(Lens + m * stride_l + ic, mask=ic < C, other=0) > 0
    b_s = tl.load(XStarts + m * stride_xs + j, mask=j < E, other=0).to(tl.int32)
    b_ok = tl.load(XLens + m * stride_xl + j, mask=j < E, other=0) > 0
    dup = tl.sum(((a_s[:, None] == b_s[None, :]) & a_ok[:, None]).to(tl.int32), axis=0)  # [TILE]
    tl.store(Kept + m * stride_k + j, (b_ok & (dup == 0)).to(tl.int8), mask=j < E)


@triton.jit
def _rank_kernel(Starts, Lens, XStarts, XLens, Kept, OutStarts, OutLens, OutRows, Active, C, E, NA,
                 stride_s, stride_l, stride_xs, stride_xl, stride_k, stride_os, stride_ol, stride_active,
                 BLOCK_C: tl.constexpr, BLOCK_E: tl.constexpr, TILE: tl.constexpr, HAS_ROWS: tl.constexpr,
                 HAS_ACTIVE: tl.constexpr):
    """Program (m, t): tile t of list a (t < NA) or of the extra list, scattered to its output indices of output row
    rows[m] (else m), unless active[m] is False (that row's stores masked off)."""
    m, t = tl.program_id(0), tl.program_id(1)
    if HAS_ROWS:
        out_row = tl.load(OutRows + m).to(tl.int64)
    else:
        out_row = m.to(tl.int64)
    if HAS_ACTIVE:
        on = tl.load(Active + m * stride_active).to(tl.int32) != 0
    else:
        on = m >= 0
    ic = tl.arange(0, BLOCK_C)
    ie = tl.arange(0, BLOCK_E)
    a_s = tl.load(Starts + m * stride_s + ic, mask=ic < C, other=0).to(tl.int32)
    a_ok = tl.load(Lens + m * stride_l + ic, mask=ic < C, other=0) > 0
    b_s = tl.load(XStarts + m * stride_xs + ie, mask=ie < E, other=0).to(tl.int32)
    b_ok = tl.load(Kept + m * stride_k + ie, mask=ie < E, other=0) != 0
    n_a = tl.sum(a_ok.to(tl.int32), axis=0)
    n_listed = n_a + tl.sum(b_ok.to(tl.int32), axis=0)
    it = tl.arange(0, TILE)
    if t < NA:
        i = t * TILE + it
        valid = i < C
        s = tl.load(Starts + m * stride_s + i, mask=valid, other=0).to(tl.int32)
        n = tl.load(Lens + m * stride_l + i, mask=valid, other=0).to(tl.int32)
        ok = n > 0
        empty_a = (a_ok == 0) & (ic < C)  # (names differ per branch: compiled Triton types each name once)
        empties_before = tl.sum(((ic[None, :] < i[:, None]) & empty_a[None, :]).to(tl.int32), axis=1)
        first_empty = n_listed
    else:
        i = (t - NA) * TILE + it
        valid = i < E
        s = tl.load(XStarts + m * stride_xs + i, mask=valid, other=0).to(tl.int32)
        n = tl.load(XLens + m * stride_xl + i, mask=valid, other=0).to(tl.int32)
        ok = tl.load(Kept + m * stride_k + i, mask=valid, other=0) != 0
        empty_b = (b_ok == 0) & (ie < E)
        empties_before = tl.sum(((ie[None, :] < i[:, None]) & empty_b[None, :]).to(tl.int32), axis=1)
        first_empty = n_listed + C - n_a
    rank = (tl.sum(((a_s[None, :] < s[:, None]) & a_ok[None, :]).to(tl.int32), axis=1)
            + tl.sum(((b_s[None, :] < s[:, None]) & b_ok[None, :]).to(tl.int32), axis=1))
    rank = tl.where(ok, rank, first_empty + empties_before)
    # tl.store casts the int32 values to the outputs' element type.
    tl.store(OutStarts + out_row * stride_os + rank, tl.where(ok, s, 0), mask=valid & on)
    tl.store(OutLens + out_row * stride_ol + rank, tl.where(ok, n, 0), mask=valid & on)


def merge_chunks_triton(starts: torch.Tensor, lens: torch.Tensor, extra_starts: torch.Tensor,
                        extra_lens: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None,
                        rows: torch.Tensor | None = None,
                        active: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """See `reference.merge_chunks_reference`."""
    M, C = starts.shape
    extra_starts = extra_starts.expand(M, -1) if extra_starts.dim() == 1 else extra_starts
    extra_lens = extra_lens.expand(M, -1) if extra_lens.dim() == 1 else extra_lens
    E = extra_starts.shape[1]
    if out is None:
        out_starts = torch.empty(M, C + E, dtype=starts.dtype, device=starts.device)
        out_lens = torch.empty(M, C + E, dtype=lens.dtype, device=lens.device)
    else:
        out_starts, out_lens = out
        if out_starts.shape[1] != C + E or out_lens.shape != out_starts.shape or \
                (rows is None and out_starts.shape[0] < M) or any(t.stride(1) != 1 for t in out):
            raise ValueError(f"out must be rows of {C + E} contiguous chunks, got {tuple(out_starts.shape)}")
    if active is not None and (active.shape != (M,) or active.dtype != torch.bool):
        raise ValueError(f"active must be [M] bool, got {tuple(active.shape)} {active.dtype}")
    if M == 0:
        return out_starts, out_lens
    tensors = (starts, lens, extra_starts, extra_lens)
    if any(t.stride(1) != 1 for t in tensors if t.shape[1] > 1):
        raise ValueError("chunk lists must be contiguous along their last dimension")
    kept = torch.empty(M, max(E, 1), dtype=torch.int8, device=starts.device)  # [M, E]: extra chunk kept
    block_c, block_e = triton.next_power_of_2(max(C, 1)), triton.next_power_of_2(max(E, 1))
    warps = 8 if TILE * max(block_c, block_e) >= 8192 else 4
    if E > 0:
        _extra_kept_kernel[(M, triton.cdiv(E, TILE))](
            starts, lens, extra_starts, extra_lens, kept, C, E,
            starts.stride(0), lens.stride(0), extra_starts.stride(0), extra_lens.stride(0), kept.stride(0),
            BLOCK_C=block_c, TILE=TILE, num_warps=warps)
    num_a = triton.cdiv(C, TILE)
    _rank_kernel[(M, num_a + triton.cdiv(E, TILE))](
        starts, lens, extra_starts, extra_lens, kept, out_starts, out_lens, lens if rows is None else rows,
        lens if active is None else active, C, E, num_a,
        starts.stride(0), lens.stride(0), extra_starts.stride(0), extra_lens.stride(0), kept.stride(0),
        out_starts.stride(0), out_lens.stride(0), 0 if active is None else active.stride(0),
        BLOCK_C=block_c, BLOCK_E=block_e, TILE=TILE, HAS_ROWS=rows is not None, HAS_ACTIVE=active is not None,
        num_warps=warps)
    return out_starts, out_lens

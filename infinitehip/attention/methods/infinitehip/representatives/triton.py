"""Most salient token per chunk and head as one Triton kernel (same signature and outputs as `reference.py`).

Kernel design (`_salient_tokens_kernel`)
- Grid: (cdiv(U, BLOCK_U), cdiv(H, BLOCK_H)); a program = BLOCK_U chunks x BLOCK_H heads. Stage 1 (256-token
  chunks) runs one chunk per program, stage 3 (8-token chunks) 16-32 chunks per program, so every program
  reads a tile of ~4K saliency values per step.
- Token loop over the chunk in tiles of BLOCK_T tokens: token -> page_table[t // page_size] * page_size
  + t % page_size (int64) -> the [BLOCK_U, BLOCK_T, BLOCK_H] tile of sum[slot, h] (a slot's heads are
  contiguous: coalesced 128 B rows at H = 32) and count[slot]; mean = sum / max(count, 1) in fp32 (the
  reference's exact division), a running (max, first index) per (chunk, head): tl.max(..., return_indices)
  breaks ties to the left inside a tile and a strictly-greater update keeps the earlier tile, i.e.
  torch.argmax's first maximum. Bitwise the reference's result.
- Tokens past the chunk's length read nothing, and the token loop stops at the program's longest chunk; chunks of
  length 0 return their start (argmax of all -inf).
- Memory bound: each distinct chunk's saliency is read once (stage 1 at 1M tokens, H = 32: 128 MB,
  ~50 us of HBM time on an H100).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def _salient_tokens_kernel(
    Sum, Count, PageTable, Starts, Lens, Out,
    U, H, page_size, chunk_size, stride_ss, stride_sh,
    BLOCK_U: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):
    offs_u = tl.program_id(0) * BLOCK_U + tl.arange(0, BLOCK_U)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    u_ok = offs_u < U
    h_ok = offs_h < H
    start = tl.load(Starts + offs_u, mask=u_ok, other=0).to(tl.int64)  # [U]
    length = tl.minimum(tl.load(Lens + offs_u, mask=u_ok, other=0).to(tl.int64), chunk_size)

    best = tl.full((BLOCK_U, BLOCK_H), float("-inf"), tl.float32)
    arg = tl.zeros((BLOCK_U, BLOCK_H), tl.int64)
    # the block's longest chunk bounds the token loop: a block of empty chunks (rows a batched stage does not
    # refresh, decode_batch.py; padding) runs no iteration
    longest = tl.max(tl.where(u_ok, length, 0), axis=0)
    for t0 in range(0, longest, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        inside = offs_t[None, :] < length[:, None]  # [U, T]
        tok = start[:, None] + offs_t[None, :]
        page = tl.load(PageTable + tok // page_size, mask=inside, other=0).to(tl.int64)
        slot = page * page_size + tok % page_size  # [U, T]
        cnt = tl.load(Count + slot, mask=inside, other=1.0)
        mask3 = inside[:, :, None] & h_ok[None, None, :]
        ptrs = Sum + slot[:, :, None] * stride_ss + offs_h[None, None, :] * stride_sh
        s = tl.load(ptrs, mask=mask3, other=0.0)
        # IEEE division (div_rn), as torch: the default fp32 "/" is approximate on CUDA and could flip near-ties.
        sal = tl.where(mask3, tl.div_rn(s, tl.maximum(cnt, 1.0)[:, :, None]), float("-inf"))  # [U, T, H]
        tile_best, tile_arg = tl.max(sal, axis=1, return_indices=True, return_indices_tie_break_left=True)
        better = tile_best > best  # ties keep the earlier tile
        best = tl.where(better, tile_best, best)
        arg = tl.where(better, t0 + tile_arg.to(tl.int64), arg)

    out = Out + offs_u.to(tl.int64)[:, None] * H + offs_h[None, :]
    tl.store(out, start[:, None] + arg, mask=u_ok[:, None] & h_ok[None, :])


def _launch_config(chunk_size: int, H: int) -> dict:
    block_h = min(64, triton.next_power_of_2(H))
    block_t = min(64, triton.next_power_of_2(chunk_size))
    block_u = max(1, min(32, 4096 // (block_t * block_h)))
    return dict(BLOCK_U=block_u, BLOCK_T=block_t, BLOCK_H=block_h, num_warps=4)


def salient_tokens_triton(
    total: torch.Tensor,  # [S, H] fp32 saliency sums per flat cache slot
    count: torch.Tensor,  # [S] fp32
    page_table: torch.Tensor,  # [P] int
    page_size: int,
    starts: torch.Tensor,  # [U] int64
    lens: torch.Tensor,  # [U] int64
    chunk_size: int,
    max_elements: int = 1 << 24,  # the reference's memory bound; unused
) -> torch.Tensor:
    """-> [U, H] int64 most salient token per chunk and head (first on ties)."""
    del max_elements
    U, H = starts.shape[0], total.shape[1]
    out = torch.empty(U, H, dtype=torch.int64, device=total.device)
    if U == 0 or H == 0:
        return out
    if count.stride(0) != 1 or count.shape[0] != total.shape[0]:
        raise ValueError(f"count must be a contiguous [{total.shape[0]}] vector, got {tuple(count.shape)}")
    cfg = _launch_config(chunk_size, H)
    grid = (triton.cdiv(U, cfg["BLOCK_U"]), triton.cdiv(H, cfg["BLOCK_H"]))
    _salient_tokens_kernel[grid](
        total, count, page_table, starts.contiguous(), lens.contiguous(), out,
        U, H, page_size, chunk_size, total.stride(0), total.stride(1), **cfg,
    )
    return out

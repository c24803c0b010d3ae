"""keep_top_chunks as one Triton kernel (same semantics as `reference.py`).

Kernel design (`_keep_top_chunks_kernel`): a single program holds every candidate (N <= a few thousand per decode
stage: stage 1 at 1M tokens has 4,096). Each score becomes an order-preserving int32 (IEEE bits, magnitude bits
flipped for negatives); 32 bisection steps (each one count over the block) find the W-th largest key, the
chunks above it are kept, and of those equal to it the earliest ones (a running count in position order) fill
the rest; a `tl.cumsum` compacts the kept chunks in position order. No sort: a one-program bitonic sort of the
packed (score, index) int64 keys cost 126 us over the three stages of an all-refresh step at 1M tokens (H100).
Replaces torch's topk + mark + scatter chain (~15 launches) by one. `keep_top_chunks_rows_triton`: one program per
row of a batch (each sequence's candidates), writing into rows of a pooled output (decode_pool.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def _keep_top_chunks_kernel(Scores, Starts, Lens, OutStarts, OutLens, Rows, Active, Limit, OutLimits, N, W,
                            stride_scores, stride_starts, stride_lens, stride_out, stride_active, stride_limit,
                            stride_limits,
                            HAS_ROWS: tl.constexpr, HAS_ACTIVE: tl.constexpr, HAS_LIMIT: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr):
    g = tl.program_id(0).to(tl.int64)  # the input row; it writes output row rows[g] (else g)
    if HAS_ACTIVE:  # a sequence that does not refresh: every store masked off, its row stays
        on = tl.load(Active + g * stride_active).to(tl.int32) != 0
    else:
        on = g >= 0
    if HAS_ROWS:
        row = tl.load(Rows + g).to(tl.int64)
    else:
        row = g
    if HAS_LIMIT:
        tl.store(OutLimits + row * stride_limits, tl.load(Limit + g * stride_limit), mask=on)
    Scores += g * stride_scores
    Starts += g * stride_starts
    Lens += g * stride_lens
    OutStarts += row * stride_out
    OutLens += row * stride_out
    offs = tl.arange(0, BLOCK_N)
    inside = offs < N
    length = tl.load(Lens + offs, mask=inside, other=0).to(tl.int64)
    real = length > 0
    s = tl.load(Scores + offs, mask=inside, other=float("-inf")).to(tl.float32)
    s = tl.where(real, s, float("-inf"))
    bits = s.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)  # order-preserving
    take = tl.minimum(W, N)
    # Bisection for the take-th largest key: count(key >= lo) >= take > count(key >= hi).
    lo = tl.full([], -(2**31), tl.int64)
    hi = tl.full([], 2**31, tl.int64)
    for _ in range(32):
        mid = (lo + hi) >> 1
        enough = tl.sum((key >= mid).to(tl.int32), axis=0) >= take
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid)
    above = key > lo
    tie = key == lo
    # Ties at the threshold: the earlier chunks first (inclusive running count in position order).
    tie_rank = tl.cumsum(tie.to(tl.int32), axis=0)
    kept = (above | (tie & (tie_rank <= take - tl.sum(above.to(tl.int32), axis=0)))) & real & inside
    dest = tl.cumsum(kept.to(tl.int32), axis=0) - 1
    start = tl.load(Starts + offs, mask=inside, other=0)
    tl.store(OutStarts + dest, start, mask=kept & on)
    tl.store(OutLens + dest, length, mask=kept & on)
    count = tl.sum(kept.to(tl.int32), axis=0)
    for w0 in range(0, W, BLOCK_W):
        w = w0 + tl.arange(0, BLOCK_W)
        pad = (w >= count) & (w < W) & on
        tl.store(OutStarts + w, tl.zeros([BLOCK_W], tl.int64), mask=pad)
        tl.store(OutLens + w, tl.zeros([BLOCK_W], tl.int64), mask=pad)


def keep_top_chunks_triton(scores: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, out_starts: torch.Tensor,
                           out_lens: torch.Tensor) -> None:
    for name, t in (("scores", scores), ("starts", starts), ("lens", lens), ("out_starts", out_starts), ("out_lens", out_lens)):
        if t.dim() != 1:
            raise ValueError(f"{name} must be a contiguous vector, got shape {tuple(t.shape)}")
    keep_top_chunks_rows_triton(scores[None], starts[None], lens[None], out_starts[None], out_lens[None], None)


def keep_top_chunks_rows_triton(scores: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, out_starts: torch.Tensor,
                                out_lens: torch.Tensor, rows: torch.Tensor | None, active: torch.Tensor | None = None,
                                limit: torch.Tensor | None = None, out_limits: torch.Tensor | None = None) -> None:
    G, N = scores.shape
    W = out_starts.shape[1]
    for name, t in (("scores", scores), ("starts", starts), ("lens", lens), ("out_starts", out_starts), ("out_lens", out_lens)):
        if t.dim() != 2 or t.stride(1) != 1:
            raise ValueError(f"{name} must be rows of contiguous vectors, got shape {tuple(t.shape)}")
    if starts.shape != (G, N) or lens.shape != (G, N) or out_lens.shape != out_starts.shape or \
            out_lens.stride() != out_starts.stride() or (rows is None and out_starts.shape[0] < G):
        raise ValueError(f"shapes or strides do not match: scores {tuple(scores.shape)}, starts {tuple(starts.shape)}, "
                         f"out {tuple(out_starts.shape)}")
    if starts.dtype != torch.int64 or out_starts.dtype != torch.int64 or out_lens.dtype != torch.int64:
        raise ValueError("starts and outputs must be int64")
    if active is not None and (active.shape != (G,) or active.dtype != torch.bool):
        raise ValueError(f"active must be [G] bool, got {tuple(active.shape)} {active.dtype}")
    if limit is not None and (limit.shape != (G,) or out_limits.dim() != 1 or out_limits.shape[0] != out_starts.shape[0]
                              or limit.dtype != out_limits.dtype):
        raise ValueError(f"limit [G] goes into out_limits [R] of one dtype, got {tuple(limit.shape)} {limit.dtype} and "
                         f"{tuple(out_limits.shape)} {out_limits.dtype}")
    if G == 0 or W == 0 and limit is None:
        return
    if N == 0 or W == 0:  # nothing to rank (host shapes): empty chunks, the limits, where active
        target = torch.arange(G, device=scores.device) if rows is None else rows
        keep = torch.ones(G, dtype=torch.bool, device=scores.device) if active is None else active
        for out in (out_starts, out_lens):
            out.index_copy_(0, target, torch.where(keep[:, None], 0, out.index_select(0, target)))
        if limit is not None:
            out_limits.index_copy_(0, target, torch.where(keep, limit, out_limits.index_select(0, target)))
        return
    block_n = triton.next_power_of_2(N)
    _keep_top_chunks_kernel[(G,)](
        scores, starts, lens, out_starts, out_lens, starts if rows is None else rows,
        lens if active is None else active, lens if limit is None else limit,
        lens if out_limits is None else out_limits, N, W, scores.stride(0), starts.stride(0), lens.stride(0),
        out_starts.stride(0), 0 if active is None else active.stride(0), 0 if limit is None else limit.stride(0),
        0 if out_limits is None else out_limits.stride(0),
        HAS_ROWS=rows is not None, HAS_ACTIVE=active is not None, HAS_LIMIT=limit is not None, BLOCK_N=block_n,
        BLOCK_W=min(1024, triton.next_power_of_2(W)), num_warps=8 if block_n >= 2048 else 4)

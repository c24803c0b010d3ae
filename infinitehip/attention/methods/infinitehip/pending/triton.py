"""queue_queries as one Triton kernel (same effect as `reference.py`): program b copies query b's H * d values and its
position into slot positions[b] % P of queue row rows[b]. One launch for the batch, replacing three per sequence
(modulo, two index copies)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def _queue_query_kernel(Q, Positions, Rows, PendingQ, PendingPos, P, numel, HAS_ROWS: tl.constexpr,
                        BLOCK: tl.constexpr):
    b = tl.program_id(0)
    pos = tl.load(Positions + b).to(tl.int64)
    if HAS_ROWS:
        row = tl.load(Rows + b).to(tl.int64)
    else:
        row = b.to(tl.int64)
    slot = row * P + pos % P
    for i0 in range(0, numel, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        ok = i < numel
        x = tl.load(Q + b.to(tl.int64) * numel + i, mask=ok)
        tl.store(PendingQ + slot * numel + i, x.to(PendingQ.dtype.element_ty), mask=ok)
    tl.store(PendingPos + slot, pos)


def queue_queries_triton(q: torch.Tensor, positions: torch.Tensor, pending_q: torch.Tensor, pending_pos: torch.Tensor,
                         rows: torch.Tensor | None = None) -> None:
    if not (q.is_contiguous() and pending_q.is_contiguous() and pending_pos.is_contiguous()):
        raise ValueError("q, pending_q and pending_pos must be contiguous")
    B = q.shape[0]
    if pending_q.shape[2:] != q.shape[1:] or positions.shape != (B,) or (rows is not None and rows.shape != (B,)):
        raise ValueError(f"queries [B, H, d] at positions [B] into rows [B]; got q {tuple(q.shape)}, positions "
                         f"{tuple(positions.shape)}, pending {tuple(pending_q.shape)}")
    if B == 0:
        return
    numel = q[0].numel()
    _queue_query_kernel[(B,)](q, positions, positions if rows is None else rows, pending_q, pending_pos,
                              pending_pos.shape[1], numel, HAS_ROWS=rows is not None,
                              BLOCK=min(4096, triton.next_power_of_2(numel)))

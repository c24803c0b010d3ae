"""queue_query as one Triton kernel (same effect as `reference.py`): one program copies the query's H * d values
and its position into slot position % P. Replaces three launches (modulo, two index copies) in every decode step."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def _queue_query_kernel(Q, Position, PendingQ, PendingPos, P, numel, BLOCK: tl.constexpr):
    pos = tl.load(Position).to(tl.int64)
    slot = pos % P
    for i0 in range(0, numel, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        ok = i < numel
        x = tl.load(Q + i, mask=ok)
        tl.store(PendingQ + slot * numel + i, x.to(PendingQ.dtype.element_ty), mask=ok)
    tl.store(PendingPos + slot, pos)


def queue_query_triton(q: torch.Tensor, position: torch.Tensor, pending_q: torch.Tensor, pending_pos: torch.Tensor) -> None:
    if not (q.is_contiguous() and pending_q.is_contiguous() and pending_pos.is_contiguous()):
        raise ValueError("q, pending_q and pending_pos must be contiguous")
    if q.shape[0] != 1 or pending_q.shape[1:] != q.shape[1:] or position.numel() != 1:
        raise ValueError(f"one query [1, H, d] at one position; got q {tuple(q.shape)}, pending {tuple(pending_q.shape)}")
    numel = q[0].numel()
    _queue_query_kernel[(1,)](q, position, pending_q, pending_pos, pending_pos.shape[0], numel,
                              BLOCK=min(4096, triton.next_power_of_2(numel)))

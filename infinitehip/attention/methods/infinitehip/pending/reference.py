"""Eager oracle of queue_queries (see op.py)."""

from __future__ import annotations

import torch


def queue_queries_reference(q: torch.Tensor, positions: torch.Tensor, pending_q: torch.Tensor,
                            pending_pos: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    R, P = pending_pos.shape
    row = torch.arange(q.shape[0], device=q.device) if rows is None else rows.long()
    slot = row * P + positions % P  # [B] flat (row, slot) index
    pending_q.view(R * P, *pending_q.shape[2:]).index_copy_(0, slot, q.to(pending_q.dtype))
    pending_pos.view(R * P).index_copy_(0, slot, positions.to(pending_pos.dtype))

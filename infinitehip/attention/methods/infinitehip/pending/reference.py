"""Eager oracle of queue_query (see __init__.py)."""

from __future__ import annotations

import torch


def queue_query_reference(q: torch.Tensor, position: torch.Tensor, pending_q: torch.Tensor,
                          pending_pos: torch.Tensor) -> None:
    slot = position % pending_pos.shape[0]
    pending_q.index_copy_(0, slot, q.to(pending_q.dtype))
    pending_pos.index_copy_(0, slot, position)

"""Queue decode queries for the deferred landmark saliency update (deferred_saliency.py): one launch per step for a
whole batch (each sequence's queue is a row of one pool, decode_pool.py).

- `reference`: eager PyTorch (index_copy into row * P + position % P), the oracle.
- `triton`: one Triton kernel, imported on first use.
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.infinitehip.pending.reference import queue_queries_reference
from infinitehip.config.impl import select_impl


def queue_queries(q: torch.Tensor, positions: torch.Tensor, pending_q: torch.Tensor, pending_pos: torch.Tensor,
                  rows: torch.Tensor | None = None, impl: str = "triton") -> None:
    """Query b, q [B, H, d] at positions [B], into queue row rows[b] (None: row b), slot positions[b] % P:
    pending_q [R, P, H, d] and pending_pos [R, P] (contiguous), written in place."""
    select_impl(impl, queue_queries_reference, "infinitehip.attention.methods.infinitehip.pending.triton",
                "queue_queries_triton", "query queue")(q, positions, pending_q, pending_pos, rows)


__all__ = ["queue_queries"]

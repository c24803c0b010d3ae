"""Queue a decode query for the deferred landmark saliency update (method._apply_saliency): one launch per step.

- `reference`: eager PyTorch (index_copy into slot position % P), the oracle.
- `triton`: one Triton kernel, imported on first use.
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.infinitehip.pending.reference import queue_query_reference
from infinitehip.config.impl import select_impl


def queue_query(q: torch.Tensor, position: torch.Tensor, pending_q: torch.Tensor, pending_pos: torch.Tensor,
                impl: str = "triton") -> None:
    """q [1, H, d] at position [1] -> pending_q[position % P] and pending_pos[position % P] (P = pending_pos rows)."""
    select_impl(impl, queue_query_reference, f"infinitehip.attention.methods.infinitehip.pending.triton", "queue_query_triton", "query queue")(q, position, pending_q, pending_pos)


__all__ = ["queue_query"]

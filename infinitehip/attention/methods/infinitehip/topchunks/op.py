"""Keep a decode stage's top chunks, in position order (the end of a pruning stage in the sync-free decode step).

- `reference`: eager PyTorch, the oracle.
- `triton`: one Triton kernel (a single program: sort-based top-k and compaction), imported on first use.

`keep_top_chunks(..., impl=...)` dispatches; see `reference.py` for the arguments.
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.infinitehip.topchunks.reference import (
    keep_top_chunks_reference, keep_top_chunks_rows_reference,
)
from infinitehip.config.impl import select_impl


def keep_top_chunks(scores: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, out_starts: torch.Tensor,
                    out_lens: torch.Tensor, impl: str = "triton") -> None:
    """Writes out_starts / out_lens [W] in place (see reference.py)."""
    select_impl(impl, keep_top_chunks_reference, "infinitehip.attention.methods.infinitehip.topchunks.triton", "keep_top_chunks_triton", "top-chunks")(scores, starts, lens, out_starts, out_lens)


def keep_top_chunks_rows(scores: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, out_starts: torch.Tensor,
                         out_lens: torch.Tensor, rows: torch.Tensor | None = None, impl: str = "triton",
                         active: torch.Tensor | None = None, limit: torch.Tensor | None = None,
                         out_limits: torch.Tensor | None = None) -> None:
    """keep_top_chunks of each row of scores / starts / lens [G, N] (a batch's sequences) into row rows[g] (None: g)
    of out_starts / out_lens [R, W] (pooled stage caches, decode_pool.py), in one launch; limit [G] into
    out_limits [R] (the stage's limits, a column of the pool's [R, S]) where given; rows whose active [G] is False
    keep what they hold (sequences of a batch that do not refresh: no copy-and-select of their rows)."""
    if (limit is None) != (out_limits is None):
        raise ValueError("limit and out_limits go together")
    select_impl(impl, keep_top_chunks_rows_reference, "infinitehip.attention.methods.infinitehip.topchunks.triton",
                "keep_top_chunks_rows_triton", "top-chunks")(scores, starts, lens, out_starts, out_lens, rows,
                                                             active, limit, out_limits)


__all__ = ["keep_top_chunks", "keep_top_chunks_rows"]

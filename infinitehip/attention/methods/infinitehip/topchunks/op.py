"""Keep a decode stage's top chunks, in position order (the end of a pruning stage in the sync-free decode step).

- `reference`: eager PyTorch, the oracle.
- `triton`: one Triton kernel (a single program: sort-based top-k and compaction), imported on first use.

`keep_top_chunks(..., impl=...)` dispatches; see `reference.py` for the arguments.
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.infinitehip.topchunks.reference import keep_top_chunks_reference
from infinitehip.config.impl import select_impl


def keep_top_chunks(scores: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, out_starts: torch.Tensor,
                    out_lens: torch.Tensor, impl: str = "triton") -> None:
    """Writes out_starts / out_lens [W] in place (see reference.py)."""
    select_impl(impl, keep_top_chunks_reference, f"infinitehip.attention.methods.infinitehip.topchunks.triton", "keep_top_chunks_triton", "top-chunks")(scores, starts, lens, out_starts, out_lens)


__all__ = ["keep_top_chunks"]

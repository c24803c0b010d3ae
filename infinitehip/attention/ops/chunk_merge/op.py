"""Joining a stage's chunk list with extra chunks of the same grid (question-time selection's chunks).

- `reference`: eager PyTorch (a sort), the oracle;
- `triton`: two Triton kernels (tiles of chunks ranked against both lists), imported on first use.

`merge_chunks(..., impl=...)` dispatches; see `reference.py` for the arguments and outputs.
"""

from __future__ import annotations

import torch

from infinitehip.attention.ops.chunk_merge.reference import merge_chunks_reference
from infinitehip.config.impl import select_impl


def merge_chunks(starts: torch.Tensor, lens: torch.Tensor, extra_starts: torch.Tensor, extra_lens: torch.Tensor,
                 impl: str = "reference", out: tuple[torch.Tensor, torch.Tensor] | None = None,
                 rows: torch.Tensor | None = None,
                 active: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (starts, lens) [M, C + E]: the listed chunks of both in position order, then (0, 0) empties; or written
    into out's rows rows[m] where active[m] (pooled rows of a batch, see reference.py), returning out."""
    if out is None and (rows is not None or active is not None):
        raise ValueError("rows and active place the result in out: pass out")
    fn = select_impl(impl, merge_chunks_reference, "infinitehip.attention.ops.chunk_merge.triton", "merge_chunks_triton", "chunk merge")
    return fn(starts, lens, extra_starts, extra_lens, out, rows, active)


__all__ = ["merge_chunks"]

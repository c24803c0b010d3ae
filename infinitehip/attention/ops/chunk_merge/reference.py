"""Joining two chunk lists of one grid, eager PyTorch: the oracle for `triton.py` beside it."""

from __future__ import annotations

import torch


def merge_chunks_reference(starts: torch.Tensor, lens: torch.Tensor, extra_starts: torch.Tensor,
                           extra_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunks starts/lens [M, C] (one grid, distinct starts, length 0 = none) joined with extra chunks of the same
    grid, [E] or per row [M, E] -> [M, C + E]: the listed chunks in position order, then empties (start 0, length
    0); an extra chunk already listed is dropped. Static shapes, no host sync (CUDA-graph decode)."""
    M = starts.shape[0]
    extra_starts = extra_starts.expand(M, -1) if extra_starts.dim() == 1 else extra_starts
    extra_lens = extra_lens.expand(M, -1) if extra_lens.dim() == 1 else extra_lens
    listed = ((extra_starts[:, :, None] == starts[:, None, :]) & (lens[:, None, :] > 0)).any(-1)  # [M, E]
    all_starts = torch.cat([starts, extra_starts], 1)
    all_lens = torch.cat([lens, torch.where(listed, 0, extra_lens)], 1)
    order = torch.argsort(torch.where(all_lens > 0, all_starts, torch.iinfo(torch.int64).max), dim=1)
    out_starts, out_lens = all_starts.gather(1, order), all_lens.gather(1, order)
    return torch.where(out_lens > 0, out_starts, 0), out_lens

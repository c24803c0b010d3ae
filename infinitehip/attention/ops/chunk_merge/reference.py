"""Joining two chunk lists of one grid, eager PyTorch: the oracle for `triton.py` beside it."""

from __future__ import annotations

import torch


def merge_chunks_reference(starts: torch.Tensor, lens: torch.Tensor, extra_starts: torch.Tensor,
                           extra_lens: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None,
                           rows: torch.Tensor | None = None,
                           active: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunks starts/lens [M, C] (one grid, distinct starts, length 0 = none) joined with extra chunks of the same
    grid, [E] or per row [M, E] -> [M, C + E]: the listed chunks in position order, then empties (start 0, length
    0); an extra chunk already listed is dropped. Static shapes, no host sync (CUDA-graph decode).
    out (starts, lens [R, C + E]): row m goes into out's row rows[m] (None: m) where active[m] [M] bool (None: every
    row), the other rows left as they are (a batch's sequences that do not refresh); returns out."""
    if out is not None:
        joined = merge_chunks_reference(starts, lens, extra_starts, extra_lens)
        targets = range(starts.shape[0]) if rows is None else rows.tolist()
        flags = [True] * starts.shape[0] if active is None else active.tolist()
        for m, r in enumerate(targets):
            if flags[m]:
                out[0][r], out[1][r] = joined[0][m], joined[1][m]
        return out
    M = starts.shape[0]
    extra_starts = extra_starts.expand(M, -1) if extra_starts.dim() == 1 else extra_starts
    extra_lens = extra_lens.expand(M, -1) if extra_lens.dim() == 1 else extra_lens
    listed = ((extra_starts[:, :, None] == starts[:, None, :]) & (lens[:, None, :] > 0)).any(-1)  # [M, E]
    all_starts = torch.cat([starts, extra_starts], 1)
    all_lens = torch.cat([lens, torch.where(listed, 0, extra_lens)], 1)
    order = torch.argsort(torch.where(all_lens > 0, all_starts, torch.iinfo(torch.int64).max), dim=1)
    out_starts, out_lens = all_starts.gather(1, order), all_lens.gather(1, order)
    return torch.where(out_lens > 0, out_starts, 0), out_lens

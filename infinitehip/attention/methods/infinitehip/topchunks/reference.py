"""Eager PyTorch oracle of keep_top_chunks (see __init__.py)."""

from __future__ import annotations

import torch


def keep_top_chunks_reference(
    scores: torch.Tensor,  # [N] fp32 chunk scores (any value for empty chunks)
    starts: torch.Tensor,  # [N] int64 candidate chunks, in position order among the non-empty ones
    lens: torch.Tensor,  # [N] int64, 0 = empty (padding, past the limit): never kept
    out_starts: torch.Tensor,  # [W] int64, written: the kept chunks in position order, then zeros
    out_lens: torch.Tensor,  # [W] int64, written: their lengths, then zeros
) -> None:
    """Keep the W best-scoring non-empty chunks (ties: the earlier chunk), in position order."""
    N, W = scores.shape[0], out_starts.shape[0]
    real = lens > 0
    s = torch.where(real, scores.float(), float("-inf"))
    order = torch.sort(s, descending=True, stable=True).indices[: min(W, N)]
    kept = torch.zeros(N, dtype=torch.bool, device=scores.device).index_fill_(0, order, True) & real
    dest = torch.where(kept, kept.cumsum(0) - 1, W)  # compaction keeps position order
    out_starts.copy_(torch.zeros(W + 1, dtype=torch.long, device=scores.device).scatter_(0, dest, starts)[:W])
    out_lens.copy_(torch.zeros(W + 1, dtype=torch.long, device=scores.device).scatter_(0, dest, lens)[:W])


def keep_top_chunks_rows_reference(scores: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor,
                                   out_starts: torch.Tensor, out_lens: torch.Tensor, rows: torch.Tensor | None,
                                   active: torch.Tensor | None = None, limit: torch.Tensor | None = None,
                                   out_limits: torch.Tensor | None = None) -> None:
    """Row g of scores / starts / lens [G, N] kept into row rows[g] (None: g) of out_starts / out_lens [R, W], and
    limit[g] into out_limits[rows[g]] ([R], any stride) where given; a row whose active[g] [G] bool is False is left
    as it was (a sequence of the batch that does not refresh the stage)."""
    targets = range(scores.shape[0]) if rows is None else rows.tolist()
    flags = [True] * scores.shape[0] if active is None else active.tolist()
    for g, r in enumerate(targets):
        if not flags[g]:
            continue
        keep_top_chunks_reference(scores[g], starts[g], lens[g], out_starts[r], out_lens[r])
        if limit is not None:
            out_limits[r] = limit[g]

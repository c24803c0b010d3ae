"""TokenSelect's decode key lists in static shapes: plain torch ops whose shapes follow the config and the step's
capacity (`ForwardBatch.decode_capacity`), never the data, with a device count per row; no host sync, so a decode
step is capturable into a CUDA graph. Each is the padded form of the eager list code it replaces (method.py's
`select` / `union_below` / `key_list` + `pad_rows`): the same tokens, in the same order, then padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_PAD = torch.iinfo(torch.int64).max  # sorts after every token


def top_tokens(votes: torch.Tensor, counts: torch.Tensor, k: int) -> torch.Tensor:
    """votes [B, W] (W > k; -inf past each row's count), counts [B] -> [B, k] int64 sorted candidate indices: the
    k best votes, all candidates when they fit in k (then padded with the indices after them).
    Ties go to the lower index, so the result does not depend on W (the capacity) or on topk's algorithm: each
    vote's fp32 bits, made to order as the floats do, over its index make one int64 key."""
    idx = torch.arange(votes.shape[1], device=votes.device)
    bits = votes.contiguous().view(torch.int32)
    bits = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()  # negative floats (-inf) order reversed bits
    key = bits * (1 << 31) + ((1 << 31) - 1 - idx)
    top = torch.topk(key, k, dim=1).indices.sort(dim=1).values
    return torch.where(counts[:, None] <= k, idx[:k], top)


def union_below(selected: torch.Tensor, num_selected: torch.Tensor, extra: torch.Tensor, num_extra: torch.Tensor,
                limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row the sorted union of the first num_selected[b] of selected [B, k] and those of the first num_extra[b]
    of extra [B, q] below limit[b] (both sorted int64) -> tokens [B, k + q] (then padding), counts [B]."""
    if extra.shape[1] == 0:
        return selected, num_selected
    ok_sel = torch.arange(selected.shape[1], device=selected.device) < num_selected[:, None]
    ok_extra = (torch.arange(extra.shape[1], device=extra.device) < num_extra[:, None]) & (extra < limit[:, None])
    both = torch.cat([selected.masked_fill(~ok_sel, _PAD), extra.masked_fill(~ok_extra, _PAD)], 1).sort(1).values
    repeat = F.pad(both[:, 1:] == both[:, :-1], (1, 0))  # [B, k + q] equal to its left neighbour
    both = both.masked_fill(repeat, _PAD).sort(1).values
    return both, (both != _PAD).sum(1)


def decode_key_list(union: torch.Tensor, num_union: torch.Tensor, window_start: torch.Tensor,
                    positions: torch.Tensor, sink: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row the sorted key tokens sink [0, min(sink, p + 1)), the union's first num_union[b] (all in [sink,
    window start)), the window [min(window start, p + 1), p] (p = positions[b], the query's own token last)
    -> tokens [B, width] int32 (then zeros), counts [B] int32. The three parts are disjoint tokens <= p, so
    width = the capacity (> every p) holds them whatever the window grew to over reused steps."""
    # int32 over the width (the capacity); the union's gather only over the head where it can sit
    j = torch.arange(width, dtype=torch.int32, device=union.device)[None, :]  # [1, width]
    last = positions[:, None].int()
    n_sink = (last + 1).clamp(max=sink)
    n_union = num_union[:, None].int()
    start = torch.minimum(window_start[:, None].int(), last + 1)
    count = n_sink + n_union + last + 1 - start  # [B, 1]
    tokens = start + j - n_sink - n_union  # [B, width] the window's tokens where it sits
    head = min(width, sink + union.shape[1])
    jh = j[:, :head]
    from_union = union.gather(1, (jh - n_sink).clamp(0, union.shape[1] - 1).long()).int()  # [B, head]
    tokens[:, :head] = torch.where(jh < n_sink, jh, torch.where(jh < n_sink + n_union, from_union, tokens[:, :head]))
    return tokens.masked_fill_(j >= count, 0), count[:, 0]

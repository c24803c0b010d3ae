"""HiP's key lists for the block-sparse attention op: sinks, the selected key blocks and the window of each row
(prefill: a query block; decode: a sequence), sorted, or every key of a row that attends densely.

The width is fixed by host-known sizes (sinks, K blocks, the widest window, the dense span), never by a value read
from the device: decode builds the lists inside CUDA graphs. Entries past a row's count are padding (token 0); the
attention op reads a row's first `count` entries only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_BIG = torch.iinfo(torch.int64).max  # sorts a dropped entry after every listed one


def key_list(starts: torch.Tensor | None, lens: torch.Tensor | None, ends: torch.Tensor, last: torch.Tensor,
             sink: int, block_size: int, width: int, span: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted key tokens per row: sinks + selected blocks (starts / lens [M, K]) + the window [end, last]; a row
    whose lens are all 0 (or every row, starts None) attends every token up to `last` instead.
    ends / last [M] int64; width: the widest window any row may have (last - end + 1); span: more than any
    dense row's last (0: no row is dense).
    -> (key_tokens [M, max(sink + K * block_size + width, span)] int64, padding 0; key_counts [M] int64)"""
    device, M = ends.device, ends.shape[0]
    e = last[:, None]
    if starts is None:
        starts = lens = torch.zeros(M, 0, dtype=torch.long, device=device)
    sink_tok = torch.arange(sink, device=device)[None, :].expand(M, -1)
    offsets = torch.arange(block_size, device=device)
    sel_tok = (starts[:, :, None] + offsets).flatten(1)  # [M, K * block_size]
    sel_ok = (offsets < lens[:, :, None]).flatten(1)
    win_tok = ends[:, None] + torch.arange(width, device=device)
    tokens = torch.cat([sink_tok, sel_tok, win_tok], 1)
    ok = torch.cat([sink_tok <= e, sel_ok, win_tok <= e], 1)
    if span > 0:  # dense rows: every token of [0, span) up to their last
        W = max(tokens.shape[1], span)
        dense = (lens.sum(1) == 0)[:, None]  # [M, 1]
        all_tok = torch.arange(W, device=device)[None, :].expand(M, -1)
        tokens, ok = F.pad(tokens, (0, W - tokens.shape[1])), F.pad(ok, (0, W - ok.shape[1]))
        tokens = torch.where(dense, all_tok, tokens)
        ok = torch.where(dense, (all_tok < span) & (all_tok <= e), ok)
    tokens = torch.where(ok, tokens, _BIG).sort(dim=1).values
    return torch.where(tokens == _BIG, 0, tokens), ok.sum(1)

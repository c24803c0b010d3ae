"""Eager PyTorch oracle of the decode key list (see __init__.py)."""

from __future__ import annotations

import torch

from infinitehip.attention.methods.infinitehip.positions import ATTENTION_ROPE_STYLES_DECODE


def key_list_width(sink: int, chunks: int, chunk_size: int, window: int) -> int:
    """Static width K of the list: every sink token, every token of the kept chunks, the widest window."""
    return sink + chunks * chunk_size + window


def decode_key_list_reference(
    starts: torch.Tensor,  # [B, C] int64 the last stage's kept chunks per sequence, in position order (len 0: none)
    lens: torch.Tensor,  # [B, C] int64
    chunk_size: int,
    limits: torch.Tensor,  # [B, S] int64 every stage's cached limit; the window starts at the oldest (smallest)
    positions: torch.Tensor,  # [B] int64 the decode token (its key is cached: the window ends with it)
    sink: int,
    window: int,  # most window tokens (static)
    style: str,  # attention RoPE style: streaming | none | infllm | dynamic
    group: int,  # `dynamic` position group
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if style not in ATTENTION_ROPE_STYLES_DECODE:
        raise ValueError(f"unknown attention RoPE style {style!r}")
    device = positions.device
    B = positions.shape[0]
    e = positions[:, None]
    window_start = limits.amin(1)[:, None]  # [B, 1]
    sink_tok = torch.arange(sink, device=device)[None, :].expand(B, -1)
    offsets = torch.arange(chunk_size, device=device)
    sel_tok = (starts[:, :, None] + offsets).flatten(1)
    sel_ok = (offsets < lens[:, :, None]).flatten(1) & (sel_tok < window_start)
    win_tok = window_start + torch.arange(window, device=device)
    tokens = torch.cat([sink_tok, sel_tok, win_tok], dim=1)
    ok = torch.cat([sink_tok <= e, sel_ok, win_tok <= e], dim=1)
    # Sink < selected (chunks in position order, disjoint) < window: the valid entries are already ascending, so
    # compacting them (rank = running count) sorts the list; invalid ones go to a scratch column, then dropped.
    K = tokens.shape[1]
    rank = torch.where(ok, ok.cumsum(1) - 1, K)
    key_tokens = torch.zeros(B, K + 1, dtype=torch.long, device=device).scatter_(1, rank, tokens)[:, :K]
    counts = ok.sum(1)
    valid = torch.arange(K, device=device)[None, :] < counts[:, None]
    if style == "streaming":  # keys numbered 0.. in order; the query is its own (last) key
        key_rope = torch.arange(K, device=device)[None, :].expand(B, -1)
        query_rope = counts - 1
    elif style == "none":
        key_rope, query_rope = key_tokens, positions
    elif style == "dynamic":
        key_rope, query_rope = key_tokens // group, positions // group
    else:  # infllm: sink and selected keys at 0, window keys at 1 + (t - window_start)
        key_rope = torch.where(key_tokens >= window_start, 1 + key_tokens - window_start, 0)
        query_rope = torch.where(positions >= window_start[:, 0], 1 + positions - window_start[:, 0], 0)
    key_rope = torch.where(valid, key_rope, 0)
    return key_tokens.int(), counts.int(), key_rope.int(), query_rope.int()

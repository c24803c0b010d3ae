"""Dynamic RoPE (paper Sec. 3.2, eq. 2-3, App. B/D): which RoPE position each query and key gets.

Keys are cached without RoPE, so every style is only a choice of integer positions.

Pruning (chunk scoring), per style:
  relative       queries at n_stream + 1; left-branch keys at 0, right-branch and representative keys at 1
                 (offsets n_stream + 1 and n_stream from the query, eq. 2-3 for layers > 3)
  chunk_indexed  every key of candidate chunk j (j-th surviving chunk) at j; queries at
                 (chunks - 1) + n_stream, so the last chunk sits n_stream before the query (layers <= 3)
  dynamic        SelfExtend-style grouping: keys and queries at position // g, g = ceil(context / trained)
  infllm         all keys at 0, queries at n_stream (InfLLM's context memory at the window's distance)
  none           original positions (for inputs inside the trained length)

Block-sparse attention, per style:
  streaming      keys numbered 0.. in original order over sink + selected + window; a query gets the
                 number of its own token (StreamingLLM; the most recent key shares the query's position)
  dynamic        grouped positions as above
  infllm         sink and selected keys at 0, window keys at 1 + (t - window_start)
  none           original positions
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


ATTENTION_ROPE_STYLES_DECODE = ("streaming", "none", "dynamic", "infllm")


@dataclass(frozen=True)
class ScoringPositions:
    """Arguments of the chunk-scoring op for one stage and layer."""

    query_pos: torch.Tensor  # [M, b] int64 RoPE positions of the block's queries
    key_pos_base: torch.Tensor  # [M, N] int64
    token_pos_group: int | None
    left_offset: int
    right_offset: int
    rep_offset: int


def group_size(context_len: int, trained_len: int) -> int:
    return max(1, -(-context_len // trained_len))


def scoring_positions(
    style: str, query_orig_pos: torch.Tensor, chunk_lens: torch.Tensor, stream_tokens: int,
    context_len: int, trained_len: int,
) -> ScoringPositions:
    """query_orig_pos [M, b] original positions of each block's queries; chunk_lens [M, N] (0 = padding)."""
    M, b = query_orig_pos.shape
    zeros = torch.zeros_like(chunk_lens)
    const = lambda p: torch.full((M, b), p, dtype=torch.long, device=query_orig_pos.device)
    if style == "relative":
        return ScoringPositions(const(stream_tokens + 1), zeros, None, 0, 1, 1)
    if style == "chunk_indexed":
        rank = torch.cumsum((chunk_lens > 0).long(), dim=1) - 1  # valid chunks come first, in order
        n_valid = (chunk_lens > 0).sum(1, keepdim=True)
        q = (n_valid.clamp(min=1) - 1 + stream_tokens).expand(M, b)
        return ScoringPositions(q.contiguous(), rank.clamp(min=0), None, 0, 0, 0)
    if style == "dynamic":
        g = group_size(context_len, trained_len)
        return ScoringPositions(query_orig_pos // g, zeros, g, 0, 0, 0)
    if style == "infllm":
        return ScoringPositions(const(stream_tokens), zeros, None, 0, 0, 0)
    if style == "none":
        return ScoringPositions(query_orig_pos.clone(), zeros, 1, 0, 0, 0)
    raise ValueError(f"unknown pruning RoPE style {style!r}")


def scoring_extent(style: str, n_chunks: int, stream_tokens: int, context_len: int, trained_len: int) -> int:
    """An exclusive bound of every RoPE position `scoring_positions` and the scoring kernels use for n_chunks
    candidates (queries, and keys at key_pos_base + offsets <= 1 or + token // group), from host values alone: the
    RoPE table is grown to it without reading the positions back from the device."""
    g = group_size(context_len, trained_len)
    query = {"relative": stream_tokens + 2, "chunk_indexed": n_chunks + stream_tokens,
             "dynamic": (context_len - 1) // g + 1, "infllm": stream_tokens + 1, "none": context_len}
    key = {"chunk_indexed": n_chunks + 1, "dynamic": context_len // g + 2, "none": context_len + 2}
    if style not in query:
        raise ValueError(f"unknown pruning RoPE style {style!r}")
    return max(query[style], key.get(style, 2))


def attention_extent(style: str, n_keys: int, stream_tokens: int, context_len: int, trained_len: int) -> int:
    """An exclusive bound of the positions `attention_positions` gives for key lists of width n_keys (streaming:
    ranks <= n_keys; infllm: window offsets <= stream), from host values alone (as `scoring_extent`)."""
    bound = {"streaming": n_keys + 1, "none": context_len,
             "dynamic": (context_len - 1) // group_size(context_len, trained_len) + 1,
             "infllm": min(stream_tokens, context_len) + 1}
    if style not in bound:
        raise ValueError(f"unknown attention RoPE style {style!r}")
    return bound[style]


def attention_positions(
    style: str, key_tokens: torch.Tensor, key_counts: torch.Tensor, window_start: torch.Tensor,
    query_pos: torch.Tensor, query_block: torch.Tensor, context_len: int, trained_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE positions for the block-sparse attention.

    key_tokens [M, K] sorted token positions (valid prefix key_counts [M]); window_start [M];
    query_pos [n] original positions; query_block [n] index of each query's block.
    -> (key_rope_pos [M, K] int32, query_rope_pos [n] int32)
    """
    if style == "streaming":
        K = key_tokens.shape[1]
        key_pos = torch.arange(K, device=key_tokens.device).expand_as(key_tokens)
        valid = torch.arange(K, device=key_tokens.device)[None, :] < key_counts[:, None]
        padded = torch.where(valid, key_tokens.long(), torch.iinfo(torch.int32).max)
        # A query's number = keys listed before its own token = its rank in the sorted list. One search in all
        # rows laid end to end (row m's tokens offset by m * 2^32 stay sorted), not a row copy per query.
        row_offset = torch.arange(key_tokens.shape[0], device=key_tokens.device) << 32
        flat = (padded + row_offset[:, None]).flatten()
        q_pos = torch.searchsorted(flat, query_pos.long() + row_offset[query_block]) - query_block * K
        return key_pos.int(), q_pos.int()
    if style == "none":
        return key_tokens.int(), query_pos.int()
    if style == "dynamic":
        g = group_size(context_len, trained_len)
        return (key_tokens // g).int(), (query_pos // g).int()
    if style == "infllm":
        ws = window_start[:, None]
        key_pos = torch.where(key_tokens >= ws, 1 + key_tokens - ws, 0)
        q_ws = window_start[query_block]
        q_pos = torch.where(query_pos >= q_ws, 1 + query_pos - q_ws, 0)
        return key_pos.int(), q_pos.int()
    raise ValueError(f"unknown attention RoPE style {style!r}")

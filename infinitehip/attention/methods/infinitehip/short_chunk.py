"""A short chunk that ends the prompt (a question after a cached document), sync-free and replayed from CUDA graphs.

Why: a second question on a cached 128K document prefills only the question (tens of tokens), and the eager prefill
of those few queries is launch-bound: a few hundred small kernels and host syncs per layer (three pruning stages,
the question's vote, the landmark saliency, the sparse attention), milliseconds per layer for a few hundred
microseconds of GPU work. Here the chunk's queries are one query block padded to Q rows, every shape is fixed by
host values that questions on one document share (the chunk's start and Q), and the chunk's length n is a device
value, so each layer's work is captured once per (start, Q) and replayed by every later question of <= Q tokens.

The same selection as the eager prefill: the pruning stages and the question's vote run on static widths (empty
chunks score -inf, so the same chunks survive), the saliency update is the decode one (the same sums, another
order), the padded rows repeat the last query as the eager blocks do. A prompt whose last chunk qualifies takes this
path with caching on and off alike, so a prefix hit gives the greedy tokens of a cold run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from infinitehip.attention.ops.chunk_merge.op import merge_chunks
from infinitehip.attention.methods.infinitehip.positions import attention_positions
from infinitehip.attention.methods.infinitehip.pruning import (QueryBlocks, StageOutput, assemble_keys, host_limit,
                                                      prefill_window_width, run_stage, sparse_limit)
from infinitehip.attention.common.question_selection import question_chunks
from infinitehip.attention.ops.sparse.op import sparse_attention_prefill
from infinitehip.config.impl import resolve_impl


@dataclass(frozen=True)
class ShortChunk:
    """Host values of a short prompt-ending chunk: its first position and its row bound Q (one query block)."""

    start: int
    rows: int

    @property
    def last_bound(self) -> int:
        return self.start + self.rows - 1


@dataclass
class ShortChunkInputs:
    """What a layer's captured work reads, as static buffers (a replay copies the next question in)."""

    q: torch.Tensor  # [Q, H, d] pre-RoPE queries, rows past n repeat the last one
    n: torch.Tensor  # [1] int64 the chunk's length
    page_table: torch.Tensor  # [P] int32
    novel: torch.Tensor | None  # [stage-1 chunks of the bound] bool (hierarchy_repeat_span), else None
    repeated: torch.Tensor | None  # [question candidates of the bound] bool (repeat_span), else None


def question_bounds(config, chunk: ShortChunk) -> tuple[int, int]:
    """The question's candidate limit for the shortest (n = question_tokens) and longest (n = Q) chunk."""
    t, sink, stream = config.question_tokens, config.sink_tokens, config.stream_tokens
    return (max(sink, chunk.start + 1 - stream), max(sink, chunk.start + chunk.rows - t + 1 - stream))


def qualifies(config, chunk: ShortChunk, n: int) -> bool:
    """The chunk's shapes can be fixed: n within one query block and holding the question's queries, every stage's
    query block one block of Q, every RoPE style position-free in the context length, and more question-time chunks
    than the budget even for the shortest chunk (the vote then keeps the same chunks on a static width)."""
    c = config
    if not (c.question_tokens <= n <= chunk.rows and c.question_tokens > 0):
        return False
    if any(b != chunk.rows for b in c.query_block_sizes) or c.representative != "landmark":
        return False
    if "dynamic" in (c.early_pruning_rope, c.late_pruning_rope, c.attention_rope):
        return False
    shortest, _ = question_bounds(c, chunk)
    cs = c.chunk_sizes[-1]
    return -(-(shortest - c.sink_tokens) // cs) > c.question_keep_tokens // cs


def pad_rows(q: torch.Tensor, rows: int) -> torch.Tensor:
    """q [n, H, d] -> [rows, H, d], the last query repeated (as `pruning.query_blocks` pads a block)."""
    n = q.shape[0]
    return q if n == rows else torch.cat([q, q[-1:].expand(rows - n, -1, -1)])


def short_chunk_attention(method, layer: int, x: ShortChunkInputs, chunk: ShortChunk, cache, rope,
                          impl: str) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One layer's attention of the chunk -> (output [Q, H, d], the question's chunks (starts [E], lens [E])).
    Sync-free: only host values of `chunk` and the config set shapes; rope must already cover them."""
    c = method.config
    Q, device = chunk.rows, x.q.device
    row = torch.arange(Q, device=device)
    positions = chunk.start + torch.minimum(row, x.n - 1)  # [Q]: padded rows at the last position
    # Landmark saliency: the decode update with the chunk's queries (padded rows: no query)
    method.saliency.update_decode(layer, x.q, torch.where(row < x.n, positions, -1), x.page_table, cache, rope,
                                  impl=impl)
    # Question-time selection: the chunk's last question_tokens queries vote over [sink, first + 1 - stream), with the
    # eager prefill's implementation of the vote
    t = c.question_tokens
    first = chunk.start + x.n - t  # [1]
    recent = x.q[(x.n - t + torch.arange(t, device=device)).clamp(min=0)]
    _, bound = question_bounds(c, chunk)
    cs = c.chunk_sizes[-1]
    q_starts, q_lens = question_chunks(
        recent, cache.flat_k(layer), x.page_table, cache.page_size, c.sink_tokens, bound, c.question_keep_tokens // cs,
        cs, c.question_window, c.stream_tokens, rope, resolve_impl("auto", device), repeated=x.repeated,
        valid_limit=(first + 1 - c.stream_tokens).clamp(min=c.sink_tokens))
    # The pruning stages for the one block
    blocks = QueryBlocks(x.q[None], (row < x.n)[None], positions[None], Q, None)
    limit_bound = host_limit(chunk.last_bound, c.sink_tokens, c.stream_tokens)
    parent = None
    for s, spec in enumerate(method._specs(layer, decode=False)):
        parent = run_stage(spec, blocks, parent, cache.flat_k(layer), x.page_table, cache.page_size, c.sink_tokens,
                           c.stream_tokens, rope, chunk.last_bound + 1, method.trained_len, impl,
                           (method.saliency, layer), novel=x.novel if s == 0 else None, limit_bound=limit_bound)
    mine = (blocks.last_position >= first)[:, None]
    starts, lens = merge_chunks(parent.chunk_starts, parent.chunk_lens, q_starts, torch.where(mine, q_lens, 0),
                                impl=impl)
    final = StageOutput(starts, lens, parent.chunk_size, Q, parent.limit)
    # Block-sparse attention
    window_start = sparse_limit(blocks.last_position, c.sink_tokens, c.stream_tokens)
    key_tokens, key_counts = assemble_keys(final, blocks.last_position, window_start, c.sink_tokens,
                                           prefill_window_width(chunk.last_bound, c.sink_tokens, c.stream_tokens),
                                           static=True)
    key_rope, query_rope = attention_positions(c.attention_rope, key_tokens, key_counts, window_start, positions,
                                               torch.zeros(Q, dtype=torch.long, device=device),
                                               chunk.last_bound + 1, method.trained_len)
    out = sparse_attention_prefill(x.q, cache.flat_k(layer), cache.flat_v(layer), x.page_table, cache.page_size,
                                   key_tokens.int(), key_counts.int(), key_rope, positions.int(), query_rope, Q,
                                   rope.cos, rope.sin, method.sm_scale, impl=impl)
    return out, (q_starts, q_lens)


def padded(mask: torch.Tensor | None, width: int, value: bool) -> torch.Tensor | None:
    """mask [<= width] bool padded with value to [width] (None stays None)."""
    return None if mask is None else F.pad(mask[:width], (0, width - min(width, mask.numel())), value=value)

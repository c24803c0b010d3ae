"""Multi-stage context pruning (paper Alg. 1-2) for the queries of one sequence.

Survivors of every stage are lists of whole chunks: chunk sizes shrink by powers of two, so a stage's
candidates are its parent's kept chunks cut into `chunk_size` pieces. A stage's output per query block
is (chunk_starts [M, C], chunk_lens [M, C]) with padding chunks of length 0 at the end.

The sparse candidates of a query block whose last query is at position e are [sink, limit) with
limit = max(sink, e + 1 - stream); everything from `limit` on is the block's streaming window.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infinitehip.attention.methods.infinitehip.positions import scoring_extent, scoring_positions
from infinitehip.attention.common.needle_probe import FORCE_BONUS
from infinitehip.attention.methods.infinitehip.saliency import KeySaliency
from infinitehip.attention.methods.infinitehip.scoring.op import chunk_scores, representative_scores
from infinitehip.attention.methods.infinitehip.scoring.aggregate import aggregate_heads
from infinitehip.model.rotary.op import rotate_at


@dataclass
class QueryBlocks:
    """Queries of one stage cut into blocks of `size` rows (the last block padded)."""

    q: torch.Tensor  # [M, b, H, d] pre-RoPE
    valid: torch.Tensor  # [M, b] bool
    positions: torch.Tensor  # [M, b] int64 original positions (padding repeats the last one)
    size: int
    # positions.max() on the host (prefill: start_pos + n - 1), so widths and RoPE extents need no device read;
    # None in decode, whose positions live in a captured graph's buffers
    last: int | None = None

    @property
    def last_position(self) -> torch.Tensor:  # [M]
        return self.positions[:, -1]


def query_blocks(q: torch.Tensor, start_pos: int, size: int) -> QueryBlocks:
    """q [n, H, d] at positions start_pos.. -> blocks of `size` queries."""
    n = q.shape[0]
    M = -(-n // size)
    pad = M * size - n
    rows = torch.arange(M * size, device=q.device)
    valid = (rows < n).view(M, size)
    positions = (start_pos + rows.clamp(max=n - 1)).view(M, size)
    q_padded = torch.cat([q, q[-1:].expand(pad, -1, -1)]) if pad else q
    return QueryBlocks(q_padded.view(M, size, *q.shape[1:]), valid, positions, size, start_pos + n - 1)


def sparse_limit(last_position: torch.Tensor, sink: int, stream: int) -> torch.Tensor:
    """Exclusive end of a block's sparse candidates: max(sink, e + 1 - stream)."""
    return (last_position + 1 - stream).clamp(min=sink)


def host_limit(last: int, sink: int, stream: int) -> int:
    """`sparse_limit` of the block whose last query is at `last`, on the host (the largest limit of a prefill chunk)."""
    return max(sink, last + 1 - stream)


def prefill_window_width(last: int, sink: int, stream: int) -> int:
    """The widest streaming window [max(sink, e + 1 - stream), e] of blocks whose last query is at most `last`
    (the width grows with e), computed on the host."""
    return max(0, last + 1 - host_limit(last, sink, stream))


@dataclass
class StageOutput:
    chunk_starts: torch.Tensor  # [M, C] int64
    chunk_lens: torch.Tensor  # [M, C] int64, 0 = padding
    chunk_size: int
    query_block_size: int
    limit: torch.Tensor  # [M] the limit the candidates were clipped to

    def for_blocks(self, parent_index: torch.Tensor) -> "StageOutput":
        return StageOutput(self.chunk_starts[parent_index], self.chunk_lens[parent_index], self.chunk_size,
                           self.query_block_size, self.limit[parent_index])


def initial_chunks(limit: torch.Tensor, sink: int, chunk_size: int,
                   limit_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All chunks of [sink, limit) per block: (starts [M, N], lens [M, N]); limit_max: limit.max(), from the host."""
    n = max(0, -(-(limit_max - sink) // chunk_size)) if limit.numel() else 0
    starts = sink + chunk_size * torch.arange(n, device=limit.device)
    lens = (limit[:, None] - starts[None, :]).clamp(min=0, max=chunk_size)
    return starts.expand(limit.shape[0], n).contiguous(), lens


def subdivide(parent: StageOutput, chunk_size: int, limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut the parent's chunks into `chunk_size` pieces, clipped to `limit` [M]."""
    r = parent.chunk_size // chunk_size
    offsets = chunk_size * torch.arange(r, device=limit.device)
    starts = (parent.chunk_starts[:, :, None] + offsets).flatten(1)
    lens = (parent.chunk_lens[:, :, None] - offsets).clamp(min=0, max=chunk_size).flatten(1)
    lens = torch.minimum(lens, (limit[:, None] - starts).clamp(min=0))
    return starts, lens


def keep_top_chunks(starts: torch.Tensor, lens: torch.Tensor, scores: torch.Tensor | None, keep: int,
                    static: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the `keep` best-scoring chunks, sorted by position, padding last; cut to the widest block's count, or
    (static) kept at min(keep, N) columns without reading the counts back (a CUDA graph's fixed shapes)."""
    if scores is not None and starts.shape[1] > keep:
        idx = torch.topk(scores, keep, dim=1).indices
        starts, lens = starts.gather(1, idx), lens.gather(1, idx)
    order = torch.argsort(torch.where(lens > 0, starts, torch.iinfo(torch.int64).max), dim=1)
    starts, lens = starts.gather(1, order), lens.gather(1, order)
    if static:
        return starts, lens
    width = int((lens > 0).sum(1).max()) if lens.numel() else 0
    return starts[:, :width], lens[:, :width]


@dataclass(frozen=True)
class StageSpec:
    query_block_size: int
    chunk_size: int
    keep_tokens: int
    rope_style: str
    head_aggregation: str = "max"  # how the heads' chunk scores combine (scoring/aggregate.py)


def score_candidates(
    spec: StageSpec, blocks: QueryBlocks, q_rot: torch.Tensor, pos, starts: torch.Tensor, lens: torch.Tensor,
    k_flat: torch.Tensor, page_table: torch.Tensor, page_size: int, rope, impl: str,
    saliency: tuple[KeySaliency, int] | None, rep_keys, static_groups: bool, reduce=None,
) -> torch.Tensor:
    """Chunk scores [M, N] fp32 (-inf for empty chunks) of a stage's candidates starts / lens [M, N], for the
    blocks' rotated queries q_rot at scoring positions `pos`: SelectRep bisection (saliency None) or landmark
    representatives; heads combined by spec.head_aggregation. Landmark keys are read resident (rep_keys None) or
    through an offloaded cache's mask bank (`offload_access.RepresentativeKeys`) in groups of chunks that fit it:
    static groups in decode (sync-free), groups sized from the data in prefill.
    reduce(scores, op): tensor parallelism (`capabilities.TensorParallelHeads.reduce_heads`): the heads of every
    rank combined."""
    per_head = spec.head_aggregation != "max"  # "max" is fused into the scoring kernels
    if saliency is None:
        scores, _ = chunk_scores(
            q_rot, blocks.valid, k_flat, page_table, page_size, starts, lens, pos.key_pos_base, pos.token_pos_group,
            pos.left_offset, pos.right_offset, pos.rep_offset, rope.cos, rope.sin, impl=impl, per_head=per_head,
        )
    else:
        store, layer = saliency
        # decode (static groups): one block per sequence, no chunk shared between blocks
        reps = store.representatives(layer, starts, lens, page_table, page_size, spec.chunk_size, impl=impl,
                                     distinct=static_groups)

        def score(keys, rows: slice = slice(None), cols: slice = slice(None)):  # blocks `rows`, chunks `cols`
            return representative_scores(q_rot[rows], blocks.valid[rows], *keys, reps[rows, cols], lens[rows, cols],
                                         pos.key_pos_base[rows, cols], pos.token_pos_group, pos.rep_offset,
                                         rope.cos, rope.sin, impl=impl, per_head=per_head)

        if rep_keys is None:
            scores = score((k_flat, page_table, page_size))
        elif static_groups:
            scores = rep_keys.score_in_fixed_groups(reps, lens, spec.chunk_size, score)
        else:
            scores = rep_keys.score_in_groups(reps, starts, lens, spec.chunk_size, score)
    if per_head:  # [M, N, H] -> [M, N]
        scores = aggregate_heads(scores, lens, spec.head_aggregation, blocks.q.shape[-1] ** -0.5)
    if reduce is not None:  # [M, N]: softmax votes add up over heads, max and zscore take the largest
        scores = reduce(scores, "sum" if spec.head_aggregation == "softmax" else "max")
    return scores


def force_chunks(scores: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Oracle diagnostics (needle_probe.py): chunks starts/lens [M, N] holding any of tokens [n] outrank the rest."""
    holds = ((tokens >= starts[..., None]) & (tokens < (starts + lens)[..., None])).any(-1)
    return scores.masked_fill(holds, FORCE_BONUS)


def run_stage(
    spec: StageSpec, blocks: QueryBlocks, parent: StageOutput | None, k_flat: torch.Tensor, page_table: torch.Tensor,
    page_size: int, sink: int, stream: int, rope, context_len: int, trained_len: int, impl: str,
    saliency: tuple[KeySaliency, int] | None = None, rep_keys=None, forced_tokens: torch.Tensor | None = None,
    reduce=None, novel: torch.Tensor | None = None, limit_bound: int | None = None,
) -> StageOutput:
    """One pruning stage for all query blocks (parent None: the first stage, all chunks of [sink, limit)).

    saliency (store, layer): representatives are the most salient keys (landmark mode), not SelectRep's.
    rep_keys: an offloaded cache's representative-key reader (`offload_access.RepresentativeKeys`): the
    representatives are scored through the mask bank, in groups of chunks that fit it.
    forced_tokens (oracle diagnostics): chunks holding these tokens are kept first.
    novel [>= stage-1 chunks] bool (first stage only): False leaves the chunk out (repeated text,
    repeated_chunks.py).
    limit_bound: static shapes, no host sync (short_chunk.py's CUDA graph): the host bound of the blocks' limits
    sizes the candidates, which are scored whenever their static width exceeds the keep (the same chunks survive:
    the empty ones score -inf) and kept at a fixed width."""
    limit = sparse_limit(blocks.last_position, sink, stream)
    static = limit_bound is not None
    if parent is None:
        bound = limit_bound if static else host_limit(blocks.last, sink, stream)
        starts, lens = initial_chunks(limit, sink, spec.chunk_size, bound)
        if novel is not None:
            lens = torch.where(novel[None, : lens.shape[1]], lens, 0)
    else:
        starts, lens = subdivide(parent, spec.chunk_size, limit)
    keep = spec.keep_tokens // spec.chunk_size
    scores = None
    most_chunks = lens.shape[1] if static else int((lens > 0).sum(1).max()) if lens.numel() else 0
    if most_chunks > keep:
        pos = scoring_positions(spec.rope_style, blocks.positions, lens, stream, context_len, trained_len)
        rope.ensure(scoring_extent(spec.rope_style, lens.shape[1], stream, context_len, trained_len))
        q_rot = rotate_at(blocks.q, pos.query_pos, rope.cos, rope.sin)
        scores = score_candidates(spec, blocks, q_rot, pos, starts, lens, k_flat, page_table, page_size, rope, impl,
                                  saliency, rep_keys, static_groups=False, reduce=reduce)
        if forced_tokens is not None:
            scores = force_chunks(scores, starts, lens, forced_tokens)
    starts, lens = keep_top_chunks(starts, lens, scores, keep, static)
    return StageOutput(starts, lens, spec.chunk_size, spec.query_block_size, limit)


def assemble_keys(final: StageOutput, last_position: torch.Tensor, window_start: torch.Tensor, sink: int,
                  width: int, static: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted key tokens of each block: sink + selected (below window_start) + window [window_start, e]; width: the
    widest window, max(e + 1 - window_start) (`prefill_window_width`). The list is cut to the longest block's count,
    or (static) kept at its full width without reading the counts back.

    -> (key_tokens [M, K] int64, padding rows point at token 0; key_counts [M] int64)
    """
    device = last_position.device
    e = last_position[:, None]
    sink_tok = torch.arange(sink, device=device)[None, :].expand(e.shape[0], -1)
    sink_ok = sink_tok <= e
    offsets = torch.arange(final.chunk_size, device=device)
    sel_tok = (final.chunk_starts[:, :, None] + offsets).flatten(1)
    sel_ok = ((offsets < final.chunk_lens[:, :, None]).flatten(1)) & (sel_tok < window_start[:, None])
    win_tok = window_start[:, None] + torch.arange(width, device=device)
    win_ok = win_tok <= e
    tokens = torch.cat([sink_tok, sel_tok, win_tok], dim=1)
    ok = torch.cat([sink_ok, sel_ok, win_ok], dim=1)
    big = torch.iinfo(torch.int64).max
    tokens = torch.where(ok, tokens, big).sort(dim=1).values
    counts = ok.sum(1)
    if not static:
        tokens = tokens[:, : int(counts.max())]
    return torch.where(tokens == big, 0, tokens), counts

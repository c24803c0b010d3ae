"""Sync-free decode step of `infinitehip` (paper Alg. 4, Fig. 7), capturable in a CUDA graph.

Every shape is fixed by the config and a stage-1 candidate capacity, and the step's token positions are a
device tensor, so one decode step of a layer launches the same kernels with the same arguments whatever the
position: no host synchronisation, no data-dependent shape. Per layer and stage the sequence keeps a
`StageCache` of fixed width C_s = keep_tokens / chunk_size (chunks of length 0 pad it); stage s is
recomputed from the latest query every refresh_intervals[s] steps (which stages refresh is decided on the
host from the step counter, so a CUDA graph exists per refresh pattern) and read from its cache otherwise.

Attended keys per sequence: sink + the last stage's chunks (below the window) + the window from the oldest
cached stage's limit to the new token; at most sink + keep + stream + max(refresh_intervals) keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infinitehip.attention.ops.chunk_merge.op import merge_chunks
from infinitehip.attention.methods.infinitehip.positions import scoring_positions
from infinitehip.attention.methods.infinitehip.pruning import (QueryBlocks, StageOutput, StageSpec, force_chunks, score_candidates,
                                                      sparse_limit, subdivide)
from infinitehip.attention.methods.infinitehip.saliency import KeySaliency
from infinitehip.attention.methods.infinitehip.topchunks.op import keep_top_chunks
from infinitehip.model.rotary.op import rotate_at


@dataclass
class StageCache:
    """One stage's kept chunks for one sequence and layer (updated in place: graphs hold these tensors)."""

    starts: torch.Tensor  # [C] int64
    lens: torch.Tensor  # [C] int64, 0 = padding
    limits: torch.Tensor  # [S] int64 the layer's stage limits, shared by its stages (the key list reads the row)
    stage: int
    chunk_size: int

    @classmethod
    def empty(cls, width: int, chunk_size: int, limits: torch.Tensor, stage: int) -> "StageCache":
        zeros = lambda n: torch.zeros(n, dtype=torch.long, device=limits.device)
        return cls(zeros(width), zeros(width), limits, stage, chunk_size)

    @property
    def limit(self) -> torch.Tensor:
        """[1] exclusive end of the candidates when the stage was last refreshed (a view)."""
        return self.limits[self.stage : self.stage + 1]

    def as_output(self) -> StageOutput:
        return StageOutput(self.starts[None], self.lens[None], self.chunk_size, 1, self.limit)


def stage1_candidates(capacity: int, sink: int, chunk_size: int) -> int:
    """Stage-1 candidate chunks of a context of up to `capacity` tokens."""
    return max(1, -(-(capacity - sink) // chunk_size))


def window_width(stream_tokens: int, refresh_intervals: tuple[int, ...]) -> int:
    """Most window keys: the oldest cached limit lags the newest by < max(refresh_intervals) steps."""
    return stream_tokens + max(refresh_intervals)


def refresh_stage(
    spec: StageSpec, q: torch.Tensor, position: torch.Tensor, parent: StageCache | None, out: StageCache,
    k_flat: torch.Tensor, page_table: torch.Tensor, page_size: int, sink: int, stream: int, rope, num_candidates: int,
    group: int, trained_len: int, impl: str, saliency: tuple[KeySaliency, int] | None, shared: dict | None = None,
    rep_keys=None, forced_tokens: torch.Tensor | None = None, reduce=None, novel: torch.Tensor | None = None,
) -> None:
    """Recompute one stage for one sequence's decode query q [H, d] at position [1]; write `out` in place.

    num_candidates: stage-1 chunk count (static; chunks past the limit get length 0). shared: a dict that lives
    for this sequence's step, so the stages refreshed together compute their common inputs once (the limit, and
    the rotated query of every RoPE style whose query position does not depend on the stage's chunks).
    rep_keys: an offloaded cache's representative-key reader (`offload_access.RepresentativeKeys`): the
    candidates are scored in static groups of chunks, each group's representatives resolved into the mask bank
    just before it is scored, so the bank holds one group, not the stage; the scores of all groups [1, N] are
    ranked together, as in one call. None: the keys are read resident (k_flat / page_table / page_size).
    novel [num_candidates] bool (stage 1 only): False leaves the chunk out (repeated text, repeated_chunks.py)."""
    scores, starts, lens, limit = stage_scores(
        spec, q[None], position, None if parent is None else parent.as_output(), k_flat, page_table, page_size, sink,
        stream, rope, num_candidates, group, trained_len, impl, saliency, shared, rep_keys, reduce,
        None if novel is None else novel[None])
    if forced_tokens is not None:  # oracle diagnostics (needle_probe.py); eager steps only
        scores = force_chunks(scores, starts, lens, forced_tokens)
    # The top chunks (ties: the earlier one), in position order: candidates are already in position order (stage 1
    # by construction, later stages subdivide an ordered parent); empty chunks are never kept.
    keep_top_chunks(scores[0], starts[0], lens[0], out.starts, out.lens, impl=impl)
    out.limit.copy_(limit)


def stage_scores(
    spec: StageSpec, q: torch.Tensor, positions: torch.Tensor, parent: StageOutput | None, k_flat: torch.Tensor,
    page_table: torch.Tensor, page_size: int, sink: int, stream: int, rope, num_candidates: int, group: int,
    trained_len: int, impl: str, saliency: tuple[KeySaliency, int] | None, shared: dict | None = None, rep_keys=None,
    reduce=None, novel: torch.Tensor | None = None, token_offset: torch.Tensor | None = None,
    active: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A stage's candidates and scores for G sequences' decode queries q [G, H, d] at positions [G] (each one query
    block) -> (scores [G, N] fp32, starts [G, N], lens [G, N], limit [G]); parent: the stage before's chunks [G, Cp]
    (None: stage 1), novel [G or 1, num_candidates] or None; shared and rep_keys as in `refresh_stage`.
    token_offset [G, 1] (several sequences, decode_batch.py): sequence g's tokens are read as tokens + offset[g]
    through page_table, its page table laid end to end with the others' (offset g * its width in tokens), so one
    scoring call reads every sequence's own keys; RoPE positions never depend on a token (no token_pos_group).
    active [G] bool or None: the sequences whose scores are used; the others' candidates are emptied, so the
    scoring kernels read nothing for them (a batch graph's stage runs for every sequence, decode_batch.py)."""
    shared = {} if shared is None else shared
    if "limit" not in shared:
        shared["limit"] = sparse_limit(positions, sink, stream)  # [G]
    limit = shared["limit"]
    c = spec.chunk_size
    if parent is None:
        starts = (sink + c * torch.arange(num_candidates, device=q.device))[None]
        lens = (limit[:, None] - starts).clamp(min=0, max=c)
        if novel is not None:
            lens = torch.where(novel, lens, 0)
    else:
        starts, lens = subdivide(parent, c, limit)
    if active is not None:
        lens = torch.where(active[:, None], lens, 0)
    starts = torch.where(lens > 0, starts, 0)  # empty chunks (past the limit, padding) point at token 0: never out of range
    G = q.shape[0]
    blocks = QueryBlocks(q[:, None], torch.ones(G, 1, dtype=torch.bool, device=q.device), positions[:, None], 1)
    # `dynamic` scoring groups positions by ceil(context / trained); the caller passes that group as `group`.
    pos = scoring_positions(spec.rope_style, blocks.positions, lens, stream, group * trained_len, trained_len)
    if token_offset is not None and pos.token_pos_group is not None:
        raise ValueError(f"RoPE style {spec.rope_style!r} places keys by their tokens: score one sequence at a time")
    rotate = lambda: rotate_at(blocks.q, pos.query_pos, rope.cos, rope.sin)
    if spec.rope_style == "chunk_indexed":  # the query's position depends on this stage's chunk count
        q_rot = rotate()
    else:
        if ("q_rot", spec.rope_style) not in shared:
            shared["q_rot", spec.rope_style] = rotate()
        q_rot = shared["q_rot", spec.rope_style]
    read = starts if token_offset is None else starts + token_offset
    scores = score_candidates(spec, blocks, q_rot, pos, read, lens, k_flat, page_table, page_size, rope, impl,
                              saliency, rep_keys, static_groups=True, reduce=reduce)
    return scores, starts, lens, limit


def merge_question(question: tuple[torch.Tensor, torch.Tensor], last: StageCache,
                   merged: tuple[torch.Tensor, torch.Tensor], impl: str) -> None:
    """The refreshed last stage's chunks joined with the question's (starts, lens [E]) into `merged` (starts, lens
    [C + E]), in place (graphs hold it)."""
    merge_chunks(last.starts[None], last.lens[None], question[0], question[1], impl=impl,
                 out=(merged[0][None], merged[1][None]))

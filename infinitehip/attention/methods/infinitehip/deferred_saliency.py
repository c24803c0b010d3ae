"""The landmark saliency of decode queries, deferred to mask refreshes (`KeySaliency.update_decode`): every step queues
its query, a refresh applies every queued one. For one sequence, or for the sequences of a decode batch at once.

Deferring is exact: a key is a candidate only once it is stream_tokens behind the query, and every query of its
landmark window (the next landmark_window <= stream_tokens tokens) is then queued or applied. A refresh happens at
least every min(refresh_intervals) steps, so P slots indexed by position % P hold every query in between.

Each sequence's queue is a row of a pool (decode_pool.py): q [R, P, H, d] and positions [R, P] (-1: empty) per layer,
so a batch's sequences of one pool queue their queries in one launch and the refreshing ones apply theirs in one more.
With a device mask of who refreshes (decode_batch.refresh_mask), all of them apply theirs when any does: the others'
queues are read as empty (positions -1: no query, nothing written) and kept.
"""

from __future__ import annotations

import torch

from infinitehip.attention.base import ForwardBatch, SequenceSlice
from infinitehip.attention.methods.infinitehip.decode_pool import DecodePools, Pool
from infinitehip.attention.methods.infinitehip.pending.op import queue_queries
from infinitehip.attention.methods.infinitehip.saliency import KeySaliency
from infinitehip.attention.methods.infinitehip.state import InfiniteHiPState


def queues(pool: Pool, layer: int, q: torch.Tensor, P: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pool's queues of `layer`: queries [R, P, H, d] (q's dtype) and positions [R, P] int64."""
    return (pool.tensor("pending_q", layer, (P, *q.shape[1:]), q.dtype, q.device),
            pool.tensor("pending_pos", layer, (P,), torch.long, q.device, fill=-1))


def own_queue(pools: DecodePools, state: InfiniteHiPState, layer: int, q: torch.Tensor, P: int) -> None:
    """The sequence's queue views (state.pending_q / pending_pos [P, ...]), emptied at its first decode step (a row
    released by an earlier sequence may hold its positions)."""
    if state.pending_q[layer] is None:
        pool, row = pools.row_of(state)
        pending_q, pending_pos = queues(pool, layer, q, P)
        state.pending_q[layer], state.pending_pos[layer] = pending_q[row], pending_pos[row]
        state.pending_pos[layer].fill_(-1)


def apply_saliency(saliency: KeySaliency, pools: DecodePools, layer: int, q: torch.Tensor, position: torch.Tensor,
                   page_table: torch.Tensor, refresh: bool, state: InfiniteHiPState, batch: ForwardBatch, P: int,
                   impl: str, read_keys=None) -> None:
    """One sequence: queue its decode query q [1, H, d] at position [1]; at a refresh apply every queued one (its keys
    read by read_keys, decode_rows.py, or the cache). A non-refresh step only queues its query (one launch)."""
    own_queue(pools, state, layer, q, P)
    pending_q, pending_pos = state.pending_q[layer], state.pending_pos[layer]
    queue_queries(q.contiguous(), position, pending_q[None], pending_pos[None], impl=impl)
    if refresh:
        saliency.update_decode(layer, pending_q, pending_pos, page_table, batch.cache, batch.rope, read_keys, impl=impl)
        pending_pos.fill_(-1)


def apply_saliency_batch(saliency: KeySaliency, pools: DecodePools, layer: int, q: torch.Tensor,
                         seqs: list[SequenceSlice], refresh: list[bool], batch: ForwardBatch, P: int, impl: str,
                         mask: torch.Tensor | None = None) -> None:
    """`apply_saliency` of every sequence of a decode batch over a resident cache, q [B, H, d]: per pool, one launch
    queues the queries of its sequences and, when some refresh, one applies their queues and one empties them (mask
    [B, S]: the queues of all, when any of the batch refreshes, as the mask says)."""
    for state in (s.state for s in seqs):
        own_queue(pools, state, layer, q, P)
    for pool, members in pools.groups([s.state for s in seqs]):
        pending_q, pending_pos = queues(pool, layer, q, P)
        rows = [seqs[i].state.pool_row[1] for i in members]
        members = tuple(members)
        queue_queries(pools.take(q, members).contiguous(), pools.take(batch.decode_positions, members), pending_q,
                      pending_pos, pools.rows(pool, tuple(rows), q.device), impl=impl)
        if mask is not None:
            if any(refresh):
                _apply_masked(saliency, pools, pool, layer, pending_q, pending_pos, members, tuple(rows), mask.any(1),
                              batch, impl)
            continue
        mine = tuple(i for i in members if refresh[i])
        if mine:
            applied = pools.rows(pool, tuple(seqs[i].state.pool_row[1] for i in mine), q.device)
            saliency.update_decode_batched(layer, pending_q, pending_pos, applied,
                                           pools.take(batch.decode_page_tables, mine), batch.cache, batch.rope,
                                           impl=impl)
            pending_pos.index_fill_(0, applied, -1)


def _apply_masked(saliency: KeySaliency, pools: DecodePools, pool: Pool, layer: int, pending_q: torch.Tensor,
                  pending_pos: torch.Tensor, members: tuple[int, ...], row_ids: tuple[int, ...], refresh: torch.Tensor,
                  batch: ForwardBatch, impl: str) -> None:
    """The queues of the pool's members (batch positions; their rows row_ids) applied where refresh [B] says (the
    others' positions read as -1: no query) and emptied there."""
    rows = pools.rows(pool, row_ids, pending_q.device)
    flag = pools.take(refresh, members)[:, None]  # [G, 1]
    positions = pools.take_rows(pending_pos, pool, row_ids)  # [G, P]
    saliency.update_decode_batched(layer, pools.take_rows(pending_q, pool, row_ids), torch.where(flag, positions, -1),
                                   None, pools.take(batch.decode_page_tables, members), batch.cache, batch.rope,
                                   impl=impl)
    pending_pos.index_copy_(0, rows, torch.where(flag, -1, positions))

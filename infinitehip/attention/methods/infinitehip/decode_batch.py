"""The stage refreshes of a decode batch's sequences at once (resident cache): per pool and stage, one call for the
sequences whose refresh pattern refreshes that stage, instead of one per sequence.

Each sequence's stage caches are rows of pooled tensors (decode_pool.py): per layer, stage s's chunks starts / lens
[R, C_s] and the stage limits [R, S]; a sequence's `StageCache` views its row, so the one-sequence path
(`decode.refresh_stage`) and the key list read the same memory. A batched refresh scores the stage's candidates of
its G sequences as G query blocks in one call (`decode.stage_scores`: each sequence's tokens offset into its page
table, the tables laid end to end), keeps each row's top chunks and writes its stage limit in one launch
(`keep_top_chunks_rows`); the refreshed last stages are joined with their questions' chunks in one call.

A stage that any sequence of the batch refreshes runs for all of them (the graph key holds only that union, so a batch
at different phases replays a few graphs, not one per tuple of patterns); each sequence's own pattern is a device
mask [B, S] (`refresh_mask`: the graph's static flags), and a sequence that does not refresh the stage keeps its old
row (the top-chunks launch and the question join skip it), so its caches are those it has alone. Which stages run
and which rows they read are host-known, so index tensors are built once and shapes stay static.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infinitehip.attention.base import ForwardBatch, SequenceSlice
from infinitehip.host_values import device_tensor
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.attention.methods.infinitehip.decode import StageCache, merge_question, stage_scores
from infinitehip.attention.methods.infinitehip.decode_pool import DecodePools, Pool
from infinitehip.attention.methods.infinitehip.pruning import StageOutput, StageSpec
from infinitehip.attention.methods.infinitehip.repeated_chunks import decode_novel
from infinitehip.attention.methods.infinitehip.saliency import KeySaliency
from infinitehip.attention.methods.infinitehip.state import InfiniteHiPState
from infinitehip.attention.methods.infinitehip.topchunks.op import keep_top_chunks_rows
from infinitehip.attention.ops.chunk_merge.op import merge_chunks


def _chunks(pool: Pool, layer: int, config: InfiniteHiPConfig, stage: int, device: torch.device):
    """The pool's stage `stage` chunks of `layer`: (starts, lens) [R, C_s] int64."""
    width = config.keep_tokens_for(layer, stage) // config.chunk_sizes[stage]
    return tuple(pool.tensor(f"{name}{stage}", layer, (width,), torch.long, device) for name in ("starts", "lens"))


def _limits(pool: Pool, layer: int, config: InfiniteHiPConfig, device: torch.device) -> torch.Tensor:
    return pool.tensor("limits", layer, (config.num_stages,), torch.long, device)  # [R, S]


def stage_caches(pools: DecodePools, state: InfiniteHiPState, layer: int, config: InfiniteHiPConfig,
                 device: torch.device) -> list[StageCache]:
    """The sequence's stage caches of `layer`, views of its pool row, emptied at its first decode step (a row
    released by an earlier sequence holds that one's chunks)."""
    if state.stage_cache[layer] is None:
        pool, row = pools.row_of(state)
        limits = _limits(pool, layer, config, device)[row]
        limits.zero_()
        caches = []
        for s in range(config.num_stages):
            starts, lens = (t[row] for t in _chunks(pool, layer, config, s, device))
            starts.zero_()
            lens.zero_()
            caches.append(StageCache(starts, lens, limits, s, config.chunk_sizes[s]))
        state.stage_cache[layer] = caches
    return state.stage_cache[layer]


def batchable(specs: list[StageSpec]) -> bool:
    """Whether every stage's scoring positions ignore the key's token (no `dynamic` / `none` pruning RoPE), which
    reading several sequences through one laid-out page table needs (`decode.stage_scores`)."""
    return all(spec.rope_style in ("relative", "chunk_indexed", "infllm") for spec in specs)


def refresh_mask(batch: ForwardBatch, patterns: list[tuple[bool, ...]], device: torch.device) -> torch.Tensor:
    """Each sequence's refresh pattern on the device, [B, S] bool: a graph's static flags (written before each replay),
    else (an eager step) made from the host patterns."""
    return batch.decode_flags if batch.decode_flags is not None else device_tensor(patterns, torch.bool, device)


def refresh_batch(specs: list[StageSpec], layer: int, q: torch.Tensor, seqs: list[SequenceSlice],
                  patterns: list[tuple[bool, ...]], batch: ForwardBatch, pools: DecodePools, config: InfiniteHiPConfig,
                  num_candidates: int, group: int, trained_len: int, impl: str,
                  saliency: tuple[KeySaliency, int] | None, reduce=None, mask: torch.Tensor | None = None) -> None:
    """Every stage refresh of the step's sequences q [B, H, d] (their stage caches made, `stage_caches`): per pool,
    stage by stage, in one call: the sequences refreshing it (mask None), or (mask [B, S], `refresh_mask`) all of
    them when any of the batch does, each row kept unless its mask says, the others' candidates emptied so the
    scoring reads nothing for them. Sync-free, static shapes."""
    cache, device = batch.cache, q.device
    union = [any(p[s] for p in patterns) for s in range(len(specs))]
    k_flat, page_size = cache.flat_k(layer), cache.page_size
    for pool, members in pools.groups([s.state for s in seqs]):
        limits = _limits(pool, layer, config, device)
        shared: dict[tuple[int, ...], dict] = {}  # per set of sequences: limit, rotated queries, token offsets
        for s, spec in enumerate(specs):
            mine = tuple(i for i in members if patterns[i][s]) if mask is None else (tuple(members) if union[s] else ())
            if not mine:
                continue
            row_ids = tuple(seqs[i].state.pool_row[1] for i in mine)
            rows = pools.rows(pool, row_ids, device)
            take = lambda t: pools.take(t, mine)  # the step's tensors of these sequences
            tables = take(batch.decode_page_tables).reshape(-1)  # [G * Pmax] the tables laid end to end
            common = shared.setdefault(mine, {})
            if "offset" not in common:  # sequence g's tokens at g * (Pmax * page_size) in the laid-out tables
                common["offset"] = (torch.arange(len(mine), device=device) * (tables.numel() // len(mine) * page_size))[:, None]
            parent = None
            if s > 0:
                p_starts, p_lens = (pools.take_rows(t, pool, row_ids) for t in _chunks(pool, layer, config, s - 1, device))
                parent = StageOutput(p_starts, p_lens, config.chunk_sizes[s - 1], 1, limits[:, s - 1])
            novel = None
            if s == 0:
                masks = [decode_novel(seqs[i].state, num_candidates) for i in mine]
                if any(m is not None for m in masks):
                    every = torch.ones(num_candidates, dtype=torch.bool, device=device)
                    novel = torch.stack([every if m is None else m for m in masks])
            flag = None if mask is None else take(mask[:, s])  # [G]: the sequences refreshing stage s this step
            scores, starts, lens, limit = stage_scores(
                spec, take(q), take(batch.decode_positions), parent, k_flat, tables, page_size, config.sink_tokens,
                config.stream_tokens, batch.rope, num_candidates, group, trained_len, impl, saliency, common,
                reduce=reduce, novel=novel, token_offset=common["offset"], active=flag)
            out_starts, out_lens = _chunks(pool, layer, config, s, device)
            # into the pool rows with the stage limits, in one launch; a sequence not refreshing s (flag False:
            # mask given) keeps its rows
            keep_top_chunks_rows(scores, starts, lens, out_starts, out_lens, rows, impl=impl, active=flag,
                                 limit=limit, out_limits=limits[:, s])
            for i in mine:
                seqs[i].state.refreshes[s] += int(patterns[i][s])  # host counters: its own pattern


def _joined(pool: Pool, layer: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The pool's last-stage chunks joined with the question's, of `layer`: (starts, lens) [R, C + E] int64."""
    return tuple(pool.tensor(name, layer, (width,), torch.long, device) for name in ("joined_starts", "joined_lens"))


def join_question(pools: DecodePools, state: InfiniteHiPState, layer: int, last: StageCache, impl: str) -> None:
    """One sequence's refreshed last stage joined with its question's chunks (`merge_question`) into its pool row,
    which the key list reads at every step (state.question_merged[layer]: views of the row)."""
    if state.question_merged[layer] is None:
        pool, row = pools.row_of(state)
        width = last.starts.numel() + state.question[layer][0].numel()
        state.question_merged[layer] = tuple(t[row] for t in _joined(pool, layer, width, last.starts.device))
    merge_question(state.question[layer], last, state.question_merged[layer], impl)


def join_questions(pools: DecodePools, layer: int, seqs: list[SequenceSlice], patterns: list[tuple[bool, ...]],
                   finals: list[list[StageCache]], config: InfiniteHiPConfig, impl: str,
                   mask: torch.Tensor | None = None) -> None:
    """`join_question` of every sequence with a question whose last stage refreshed: per pool, one merge for all
    (mask [B, S], `refresh_mask`: of all with a question when any of the batch refreshed, each row kept unless its
    mask says)."""
    last = config.num_stages - 1
    union = any(p[-1] for p in patterns)
    for pool, members in pools.groups([s.state for s in seqs]):
        mine = tuple(i for i in members if seqs[i].state.question[layer] is not None
                     and (patterns[i][-1] if mask is None else union))
        if not mine or mask is None and len(mine) < 2:
            for i in mine:
                join_question(pools, seqs[i].state, layer, finals[i][-1], impl)
            continue
        device = finals[mine[0]][-1].starts.device
        row_ids = tuple(seqs[i].state.pool_row[1] for i in mine)
        rows = pools.rows(pool, row_ids, device)
        starts, lens = (pools.take_rows(t, pool, row_ids) for t in _chunks(pool, layer, config, last, device))  # [G, C]
        questions = [seqs[i].state.question[layer] for i in mine]
        q_starts, q_lens = torch.stack([qs for qs, _ in questions]), torch.stack([ql for _, ql in questions])  # [G, E]
        targets = _joined(pool, layer, starts.shape[1] + q_starts.shape[1], device)  # [R, C + E]
        # straight into the pool rows; a sequence not refreshing its last stage (mask given) keeps its row
        merge_chunks(starts, lens, q_starts, q_lens, impl=impl, out=targets, rows=rows,
                     active=None if mask is None else pools.take(mask[:, last], mine))
        for i in mine:
            row = seqs[i].state.pool_row[1]
            seqs[i].state.question_merged[layer] = (targets[0][row], targets[1][row])


def key_list_chunks(pools: DecodePools, layer: int, seqs: list[SequenceSlice], finals: list[list[StageCache]],
                    config: InfiniteHiPConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The key list's chunks: each sequence's last stage, joined with its question's chunks where it has them (the
    answer attends them too; padded to one width when only some sequences have them), and its stage limits (the oldest
    cached stage bounds what was selectable: the window reaches back to it) -> starts, lens [B, W], limits [B, S].
    Views of the pool when the batch is consecutive rows of one pool, else stacked."""
    states = [s.state for s in seqs]
    merged = [state.question_merged[layer] for state in states]
    joined = all(m is not None for m in merged)
    first = states[0].pool_row
    if all(st.pool_row is not None and st.pool_row[0] is first[0] and st.pool_row[1] == first[1] + i
           for i, st in enumerate(states)) and (joined or not any(m is not None for m in merged)):
        pool, rows, device = first[0], slice(first[1], first[1] + len(seqs)), finals[0][-1].starts.device
        if joined:
            starts, lens = _joined(pool, layer, merged[0][0].numel(), device)
        else:
            starts, lens = _chunks(pool, layer, config, config.num_stages - 1, device)
        return starts[rows], lens[rows], _limits(pool, layer, config, device)[rows]
    chunks = [(f[-1].starts, f[-1].lens) for f in finals]
    if any(m is not None for m in merged):
        E = config.question_keep_tokens // config.chunk_sizes[-1]
        chunks = [m if m is not None else (F.pad(r[0], (0, E)), F.pad(r[1], (0, E))) for m, r in zip(merged, chunks)]
    return (torch.stack([r[0] for r in chunks]), torch.stack([r[1] for r in chunks]),
            torch.stack([f[-1].limits for f in finals]))

"""`infinitehip`: multi-stage context pruning + block-sparse attention with dynamic RoPE and mask caching.

Prefill: for each chunk, every pruning stage runs for the chunk's query blocks (Alg. 1), then sparse
attention reads sink + selected + streaming-window keys of each final block.
Decode (Alg. 4): stage i's output is cached per layer and recomputed every refresh_intervals[i] steps
from the latest query; the stream window starts at the oldest cached stage's limit, so a token that
left the window since the last refresh is still attended (nothing falls between the two).
Question-time selection (question_tokens > 0, preset `3k-question`; not in the paper): in the chunk that ends the prompt
the last question_tokens queries vote over every candidate once (attention/common/question_selection.py); the chosen
final-stage chunks join the question's blocks and every decode step's last-stage chunks.
Offloaded KV: decode steps reuse the bank rows of earlier steps where they are unchanged (decode_rows.py, mask_rows.py).
A decode batch over a resident cache launches each per-sequence op (query queue, saliency update, a stage's refresh,
the question join) once for its sequences: their decode state is rows of pooled tensors (decode_pool.py,
deferred_saliency.py, decode_batch.py).
"""

from __future__ import annotations

from typing import Any

import torch

from infinitehip.attention.base import AttentionMethod, ForwardBatch, KVSizing, SequenceSlice
from infinitehip.attention.capabilities import KVOffload, TensorParallelHeads
from infinitehip.attention.methods.dense.method import causal_sdpa, resident_decode
from infinitehip.attention.methods.infinitehip.decode import (StageCache, refresh_stage, stage1_candidates,
                                                     window_width)
from infinitehip.attention.methods.infinitehip.decode_rows import (
    attention_access, decode_rows_for, window_reader,
)
from infinitehip.attention.methods.infinitehip.keylist.op import decode_key_list
from infinitehip.attention.methods.infinitehip.mask_rows import mask_rows_for, stage_keys
from infinitehip.attention.methods.infinitehip.offload_access import (StagedLayer, check_offload, prefill_attention_in_groups,
                                                              question_key_reader, scoring_access, stage_prefill_layer)
from infinitehip.attention.methods.infinitehip.decode_pool import DecodePools
from infinitehip.attention.methods.infinitehip.decode_batch import (batchable, join_question, join_questions,
                                                                   key_list_chunks, refresh_batch, refresh_mask,
                                                                   stage_caches)
from infinitehip.attention.methods.infinitehip.deferred_saliency import apply_saliency, apply_saliency_batch
from infinitehip.attention.methods.infinitehip.positions import attention_extent, attention_positions, group_size
from infinitehip.attention.methods.infinitehip.pruning import (QueryBlocks, StageOutput, StageSpec, assemble_keys, query_blocks,
                                                      prefill_window_width, run_stage, sparse_limit)
from infinitehip.attention.methods.infinitehip.repeated_chunks import decode_novel, prompt_novel
from infinitehip.attention.ops.chunk_merge.op import merge_chunks
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.attention.methods.infinitehip.graph_hooks import InfiniteHiPGraphHooks
from infinitehip.attention.methods.infinitehip.prefix_hooks import InfiniteHiPPrefixHooks
from infinitehip.attention.methods.infinitehip.state import InfiniteHiPState
from infinitehip.attention.methods.infinitehip.saliency import KeySaliency
from infinitehip.attention.methods.infinitehip.short_chunk_graphs import ShortChunkGraphs, prefill_short_chunk
from infinitehip.attention.common.question_selection import chunk_rank, chunk_scores, question_chunks, question_scores
from infinitehip.attention.common.repeated_text import repeated_candidates
from infinitehip.attention.ops.sparse.op import sparse_attention_decode, sparse_attention_prefill
from infinitehip.config.impl import resolve_impl
from infinitehip.config.model import ModelConfig
from infinitehip.kv.paged_cache import is_offloaded
from infinitehip.profiling import phase


def _forced(probe, device: torch.device) -> torch.Tensor | None:
    """The tokens an oracle probe forces into every selection (needle_probe.py), else None."""
    return probe.on(device) if probe is not None and probe.oracle else None


class InfiniteHiPAttention(AttentionMethod, InfiniteHiPGraphHooks, KVOffload, InfiniteHiPPrefixHooks,
                           TensorParallelHeads):
    name = "infinitehip"

    def __init__(self, model_config: ModelConfig, config: InfiniteHiPConfig | None = None):
        super().__init__(model_config)
        self.config = config or InfiniteHiPConfig()
        self.trained_len = model_config.max_position_embeddings
        self.sm_scale = model_config.head_dim ** -0.5
        self.saliency = KeySaliency(self.config.landmark_window) if self.config.representative == "landmark" else None
        self.short_graphs = ShortChunkGraphs()
        self.pools = DecodePools()  # each decoding sequence's row of the pooled per-sequence decode state

    @classmethod
    def kv_sizing(cls, model_config: ModelConfig, config: Any = None, tokenizer: Any = None) -> KVSizing:
        return KVSizing(1 << 17)

    def check_offload(self, offload, max_context_tokens: int, max_num_seqs: int) -> None:
        check_offload(self.config, offload, max_context_tokens, self.model_config.num_heads, max_num_seqs)

    def offload_spare_rows(self) -> int:
        """Spare attention-bank rows for the tokens a sequence appends between refreshes (decode_rows.py)."""
        return min(self.config.refresh_intervals)

    def release(self, state: InfiniteHiPState) -> None:
        for kept in filter(None, (state.decode_rows, state.mask_rows)):
            kept.release()
        if state.pool_row is not None:
            self.pools.release(*state.pool_row)
            state.pool_row = None

    def device_bytes_per_slot(self) -> int:
        """Landmark saliency: a sum [H] and a count, fp32, per slot and layer (`saliency.KeySaliency`)."""
        if self.saliency is None:
            return 0
        return self.model_config.num_layers * (self.model_config.num_heads + 1) * 4

    def new_state(self) -> InfiniteHiPState:
        L, S = self.model_config.num_layers, self.config.num_stages
        return InfiniteHiPState(stage_cache=[None] * L, decode_steps=[0] * L, refreshes=[0] * S,
                                pending_q=[None] * L, pending_pos=[None] * L, question=[None] * L, recent_q=[None] * L,
                                question_merged=[None] * L)

    def prompt_end_tokens(self, prompt_tokens: int) -> int:
        """The question's queries attend the question's chunks only in the chunk that ends the prompt: all of them
        are there (a prompt ending one token past a chunk boundary left 31 of 32 outside it). A prompt attended
        exactly to its end (`within_trained`) selects nothing there."""
        return 1 if self.within_trained(prompt_tokens) else max(1, self.config.question_tokens)

    def _impl(self, x: torch.Tensor) -> str:
        """Every op's implementation for x's device (config/impl.py): Triton on CUDA; on CPU the ops' CPU
        formulations ("auto"; sparse attention: the batched-SDPA path) or the eager oracles."""
        return resolve_impl(self.config.impl, x.device)

    @property
    def _reduce(self):
        """Tensor parallelism: the chunk scores of every rank's heads combined (one mask, as single-process)."""
        return None if self.parallel is None else self.reduce_heads

    def _specs(self, layer: int, decode: bool) -> list[StageSpec]:
        c = self.config
        return [
            StageSpec(1 if decode else c.query_block_sizes[i], c.chunk_sizes[i], c.keep_tokens_for(layer, i), c.pruning_rope_for(layer),
                      c.head_aggregation)
            for i in range(c.num_stages)
        ]

    @phase("pruning stages")
    def _stage(self, spec, blocks, parent, layer, seq: SequenceSlice, batch: ForwardBatch,
               staged: StagedLayer | None = None, novel: torch.Tensor | None = None) -> StageOutput:
        c = self.config
        k_flat, rep_keys = scoring_access(seq.cache, layer, seq.page_table) if staged is None else (staged.k, staged)
        return run_stage(spec, blocks, parent, k_flat, seq.page_table, seq.cache.page_size,
                         c.sink_tokens, c.stream_tokens, batch.rope, seq.context_len, self.trained_len, self._impl(blocks.q),
                         None if self.saliency is None else (self.saliency, layer), rep_keys=rep_keys,
                         forced_tokens=_forced(seq.probe, blocks.q.device), reduce=self._reduce, novel=novel)

    def prompt_novel(self, seq: SequenceSlice, device: torch.device) -> torch.Tensor | None:
        """The prompt's stage-1 chunks of new text (repeated_chunks.py), made at its last chunk; else None."""
        return prompt_novel(seq, self.config, device)

    def _update_saliency(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch,
                         staged: StagedLayer | None = None) -> None:
        if self.saliency is not None:
            self.saliency.update(layer, q, seq.start_pos, seq.page_table, seq.cache, batch.rope, impl=self._impl(q),
                                 keys=None if staged is None else staged.keys)

    def within_trained(self, context_len: int) -> bool:
        """`dense_within_trained`: a context within dense_within_share of the trained length is attended exactly."""
        c = self.config
        return c.dense_within_trained and context_len <= int(c.dense_within_share * self.trained_len)

    def _keeps_every_key(self, layer: int, context_len: int) -> bool:
        """Every query of a chunk ending at context_len attends every earlier key, at its original position."""
        c = self.config
        original_positions = c.attention_rope in ("streaming", "none") or (
            c.attention_rope == "dynamic" and context_len <= self.trained_len)
        candidates = context_len - c.sink_tokens - c.stream_tokens
        return original_positions and candidates <= c.keep_tokens_for(layer, c.num_stages - 1)

    # ---- prefill ----------------------------------------------------------------------------------------
    @phase("prefill attention (all)")
    def prefill(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> torch.Tensor:
        c = self.config
        # a question after a cached document: CUDA graphs (pruned; a context within the trained length runs dense)
        short = None if self.within_trained(seq.context_len) else prefill_short_chunk(self, layer, q, seq, batch)
        if short is not None:
            return short
        staged = stage_prefill_layer(seq.cache, layer, seq.page_table, seq.context_len)  # offloaded: one GPU copy
        self._update_saliency(layer, q, seq, batch, staged)
        question = self._question_prefill(layer, q, seq, batch, staged)
        novel = self.prompt_novel(seq, q.device)  # made even where this chunk runs dense: decode reads it
        unpruned = c.dense_when_unpruned and self._keeps_every_key(layer, seq.context_len)
        if unpruned or self.within_trained(seq.context_len):
            if staged is None:
                return _exact(q, seq, seq.cache.read(layer, seq.context_slots), batch)
            return _exact(q, seq, (staged.k[: seq.context_len], staged.v[: seq.context_len]), batch)
        parent, blocks = None, None
        probe = seq.probe if seq.probe is not None and seq.probe.is_last_prefill(seq.context_len) else None
        for s, spec in enumerate(self._specs(layer, decode=False)):
            blocks = query_blocks(q, seq.start_pos, spec.query_block_size)
            if parent is not None:  # child block m reads the candidates of the parent block containing it
                rows = torch.arange(blocks.q.shape[0], device=q.device) * spec.query_block_size
                parent = parent.for_blocks(rows // parent.query_block_size)
            parent = self._stage(spec, blocks, parent, layer, seq, batch, staged, novel if s == 0 else None)
            if probe is not None:  # the block holding the prompt's last query
                share = probe.share_of_chunks(parent.chunk_starts[-1], parent.chunk_lens[-1], c.sink_tokens,
                                              int(parent.limit[-1]))
                probe.record_prefill(f"stage{s}", layer, self.model_config.num_layers, share)
        window_start = sparse_limit(blocks.last_position, c.sink_tokens, c.stream_tokens)
        if question is not None:  # the blocks holding question queries attend the question's chunks too
            first, (q_starts, q_lens) = question
            mine = (blocks.last_position >= first)[:, None]
            starts, lens = merge_chunks(parent.chunk_starts, parent.chunk_lens, q_starts, torch.where(mine, q_lens, 0),
                                        impl=self._impl(q))
            parent = StageOutput(starts, lens, parent.chunk_size, parent.query_block_size, parent.limit)
        return self._attend_prefill(layer, q, seq, batch, parent, blocks, window_start, staged)

    @phase("question-time selection")
    def _question_prefill(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch,
                          staged: StagedLayer | None = None):
        """Keep the last question_tokens queries; in the chunk that ends the prompt, make the question-time selection
        (attention/common/question_selection.py) and keep it in the state -> (first question position, (starts, lens)) or
        None."""
        c = self.config
        if c.question_tokens == 0:
            return None
        state: InfiniteHiPState = seq.state
        previous = state.recent_q[layer]
        recent = (q if previous is None else torch.cat([previous, q]))[-c.question_tokens :].clone()
        state.recent_q[layer] = recent  # kept at the prompt's end too: a prefix boundary there snapshots it
        if not seq.ends_prompt:
            return None
        first = seq.context_len - recent.shape[0]
        limit = max(c.sink_tokens, first + 1 - c.stream_tokens)
        cs = c.chunk_sizes[-1]
        if staged is not None:  # offloaded, staged: read in place as from a resident cache
            k_flat, page_table, read_keys = staged.k, staged.page_table, None
        else:  # offloaded without staging: scans the host store
            read_keys = question_key_reader(seq.cache, layer, seq.page_table)
            k_flat, page_table = seq.cache.flat_k(layer) if read_keys is None else None, seq.page_table
        repeated = repeated_candidates(seq.text, c.repeat_span, c.sink_tokens, limit, q.device)
        chunks = question_chunks(recent, k_flat, page_table, seq.cache.page_size, c.sink_tokens, limit,
                                 c.question_keep_tokens // cs, cs, c.question_window, c.stream_tokens, batch.rope,
                                 resolve_impl("auto", q.device), _forced(seq.probe, q.device), read_keys,
                                 reduce=self._reduce, repeated=repeated)
        state.question[layer] = chunks
        if seq.probe is not None:
            seq.probe.record_prefill("question", layer, self.model_config.num_layers,
                                     seq.probe.share_of_chunks(*chunks, c.sink_tokens, limit))
            if not seq.probe.oracle and limit > c.sink_tokens:  # how far the needle ranks: would a wider budget keep it
                scores = question_scores(recent, k_flat, page_table, seq.cache.page_size, c.sink_tokens, limit,
                                         c.question_window, c.stream_tokens, batch.rope, resolve_impl("auto", q.device),
                                         read_keys, self._reduce, repeated)
                rank = chunk_rank(chunk_scores(scores, cs, repeated), seq.probe.on(q.device), c.sink_tokens, cs)
                seq.probe.record_prefill("question_rank", layer, self.model_config.num_layers, rank)
        return first, chunks

    @phase("block-sparse attention")
    def _attend_prefill(self, layer, q, seq, batch, final: StageOutput, blocks: QueryBlocks, window_start,
                        staged: StagedLayer | None = None) -> torch.Tensor:
        c = self.config
        key_tokens, key_counts = assemble_keys(final, blocks.last_position, window_start, c.sink_tokens,
                                               prefill_window_width(blocks.last, c.sink_tokens, c.stream_tokens))
        if seq.probe is not None and seq.probe.is_last_prefill(seq.context_len):
            share = seq.probe.share_of_tokens(key_tokens[-1, : int(key_counts[-1])])
            seq.probe.record_prefill("attended", layer, self.model_config.num_layers, share)
        query_pos = torch.arange(seq.start_pos, seq.context_len, device=q.device)
        query_block = torch.arange(q.shape[0], device=q.device) // blocks.size
        key_rope, query_rope = attention_positions(self.config.attention_rope, key_tokens, key_counts, window_start,
                                                   query_pos, query_block, seq.context_len, self.trained_len)
        batch.rope.ensure(attention_extent(c.attention_rope, key_tokens.shape[1], c.stream_tokens, seq.context_len,
                                           self.trained_len))
        key_tokens, key_counts, query_pos = key_tokens.int(), key_counts.int(), query_pos.int()

        def attend(k_flat, v_flat, page_table, page_size, m: slice, rows: slice) -> torch.Tensor:
            return sparse_attention_prefill(
                q[rows], k_flat, v_flat, page_table, page_size, key_tokens[m], key_counts[m], key_rope[m],
                query_pos[rows], query_rope[rows], blocks.size, batch.rope.cos, batch.rope.sin, self.sm_scale,
                impl=self._impl(q),
            )

        if staged is not None and staged.stages_values(key_counts):
            return attend(staged.k, staged.v, staged.page_table, staged.page_size, slice(0, key_tokens.shape[0]),
                          slice(0, q.shape[0]))
        return prefill_attention_in_groups(seq.cache, layer, seq.page_table, key_tokens, key_counts, blocks.size,
                                           q.shape[0], attend)

    # ---- decode ----------------------------------------------------------------------------------------
    def group(self, context_len: int) -> int:
        """The `dynamic` styles' position group at this context (1 unless a style uses it)."""
        c = self.config
        uses = "dynamic" in (c.early_pruning_rope, c.late_pruning_rope, c.attention_rope)
        return group_size(context_len, self.trained_len) if uses else 1

    def _refresh_one(self, layer: int, q: torch.Tensor, position: torch.Tensor, seq: SequenceSlice,
                     page_table: torch.Tensor, specs: list[StageSpec], pattern: tuple[bool, ...],
                     caches: list[StageCache], alone: bool, num_candidates: int, group: int, rope) -> None:
        """One sequence's stage refreshes of this step (its decode query q [H, d] at position [1])."""
        c, state = self.config, seq.state
        k_flat, rep_keys = scoring_access(seq.cache, layer, page_table)
        keys = stage_keys(state.mask_rows if alone else None, rep_keys, seq.cache, layer, page_table, pattern,
                          state.decode_steps[layer])  # per stage; the last one's may keep its mask-bank rows
        parent, shared = None, {}
        novel = decode_novel(state, num_candidates)
        for s, spec in enumerate(specs):
            if pattern[s]:
                refresh_stage(spec, q, position, parent, caches[s], k_flat, page_table, seq.cache.page_size,
                              c.sink_tokens, c.stream_tokens, rope, num_candidates, group,
                              self.trained_len, self._impl(q), None if self.saliency is None else (self.saliency, layer),
                              shared, keys[s], _forced(seq.probe, q.device), reduce=self._reduce,
                              novel=novel if s == 0 else None)
                state.refreshes[s] += 1
            parent = caches[s]

    def decode(self, layer: int, q: torch.Tensor, seqs: list[SequenceSlice], batch: ForwardBatch) -> torch.Tensor:
        """Sync-free decode (decode.py): fixed shapes, positions from batch.decode_positions; CUDA-graph capturable.
        With `dense_within_trained`, a sequence whose context fits the trained length is attended exactly (dense's
        paged op; in a mixed batch its pruned row is replaced)."""
        exact = [i for i, s in enumerate(seqs) if self.within_trained(s.context_len)]
        if len(exact) == len(seqs):
            return self._exact_decode(layer, q, seqs, batch, 0)
        out = self._pruned_decode(layer, q, seqs, batch)
        for i in exact:
            out[i : i + 1] = self._exact_decode(layer, q[i : i + 1], [seqs[i]], batch, i).to(out.dtype)
        return out

    def _exact_decode(self, layer: int, q: torch.Tensor, seqs: list[SequenceSlice], batch: ForwardBatch,
                      first: int) -> torch.Tensor:
        """q [B, H, d] of the step's decode sequences first..first+B-1 -> [B, H, d]: each query over every key of its
        sequence at original positions; one paged op over a resident cache (as dense decodes)."""
        if not is_offloaded(batch.cache):
            return resident_decode(layer, q, batch, slice(first, first + len(seqs)))
        return torch.cat([_exact(q[i : i + 1], seq, seq.cache.read(layer, seq.context_slots), batch)
                          for i, seq in enumerate(seqs)])

    def _pruned_decode(self, layer: int, q: torch.Tensor, seqs: list[SequenceSlice],
                       batch: ForwardBatch) -> torch.Tensor:
        c = self.config
        positions, page_tables = batch.decode_positions, batch.decode_page_tables
        capacity = batch.decode_capacity
        group = self.group(max(s.context_len for s in seqs))  # a graph key holds it: a host int is fine
        num_candidates = stage1_candidates(capacity, c.sink_tokens, c.chunk_sizes[0])
        batch.rope.ensure(self.decode_rope_positions(capacity))  # reserved before the prompt's last chunk
        patterns = [self.refresh_pattern(s.state, layer) for s in seqs]
        specs = self._specs(layer, decode=True)
        saliency = None if self.saliency is None else (self.saliency, layer)
        # A batch over a resident cache: the per-sequence ops launched once for the sequences of a pool
        batched = len(seqs) > 1 and not is_offloaded(batch.cache)
        refresh_together = batched and batchable(specs) and all(s.probe is None for s in seqs)
        P = min(c.refresh_intervals)
        # Refreshing together: a stage any sequence refreshes runs for all, each row kept unless its mask [B, S] says
        mask = refresh_mask(batch, patterns, q.device) if refresh_together else None
        if batched and self.saliency is not None:
            apply_saliency_batch(self.saliency, self.pools, layer, q, seqs, [any(p) for p in patterns], batch, P,
                                 self._impl(q), mask)
        finals = [stage_caches(self.pools, s.state, layer, c, q.device) for s in seqs]
        if refresh_together:
            refresh_batch(specs, layer, q, seqs, patterns, batch, self.pools, c, num_candidates, group, self.trained_len,
                          self._impl(q), saliency, self._reduce, mask)
        elif batched:
            for i, seq in enumerate(seqs):
                self._refresh_one(layer, q[i], positions[i : i + 1], seq, page_tables[i], specs, patterns[i], finals[i],
                                  False, num_candidates, group, batch.rope)
        if batched:  # after every refresh of the step
            join_questions(self.pools, layer, seqs, patterns, finals, c, self._impl(q), mask)
        for i, seq in enumerate(seqs):
            state: InfiniteHiPState = seq.state
            pattern, caches = patterns[i], finals[i]
            if state.decode_rows is None:  # False: a resident cache, or no spare rows
                state.decode_rows = decode_rows_for(seq.cache, self.model_config.num_layers, c.refresh_intervals) or False
                state.mask_rows = mask_rows_for(seq.cache, self.model_config.num_layers, c.num_stages) or False
            alone = len(seqs) == 1 and not batch.prefill
            kept = state.decode_rows if alone and state.decode_rows else None
            held = kept is not None and kept.kept(layer, state.decode_steps[layer])  # alone: reuse = held, no refresh
            if not batched:  # one sequence, or an offloaded cache: each sequence's own ops
                if self.saliency is not None:
                    read_keys = window_reader(kept if held else None, seq.cache, layer, caches, c)
                    apply_saliency(self.saliency, self.pools, layer, q[i : i + 1], positions[i : i + 1],
                                   page_tables[i], any(pattern), state, batch, P, self._impl(q), read_keys)
                self._refresh_one(layer, q[i], positions[i : i + 1], seq, page_tables[i], specs, pattern, caches,
                                  alone, num_candidates, group, batch.rope)
                if state.question[layer] is not None and pattern[-1]:
                    join_question(self.pools, state, layer, caches[-1], self._impl(q))
            state.decode_steps[layer] += 1
        starts, lens, limits = key_list_chunks(self.pools, layer, seqs, finals, c)
        key_tokens, key_counts, key_rope, query_rope = decode_key_list(
            starts, lens, c.chunk_sizes[-1], limits, positions, c.sink_tokens,
            window_width(c.stream_tokens, c.refresh_intervals), c.attention_rope, group, impl=self._impl(q))
        for i, seq in enumerate(seqs):
            if seq.probe is not None:
                seq.probe.record_decode(layer, seq.probe.share_of_tokens(key_tokens[i, : int(key_counts[i])]))
        k_flat, v_flat, tables, page_size, key_tokens = attention_access(kept, held and not any(pattern), seqs[0].cache,
                                                                          layer, batch, key_tokens, key_counts)
        return sparse_attention_decode(
            q, k_flat, v_flat, tables, page_size,
            key_tokens, key_counts, key_rope, query_rope, *batch.rope.decode_tables(q.dtype),
            self.sm_scale, impl=self._impl(q),
        )


def _exact(q: torch.Tensor, seq: SequenceSlice, kv: tuple[torch.Tensor, torch.Tensor],
           batch: ForwardBatch) -> torch.Tensor:
    """Queries q [n, H, d] (the sequence's last n positions) over every key kv ([L, Hkv, d] each, pre-RoPE) at
    original positions -> [n, H, d]."""
    k, v = kv
    batch.rope.ensure(seq.context_len)
    return causal_sdpa(batch.rope.apply_range(q, seq.start_pos), batch.rope.apply_range(k, 0), v, seq.start_pos)

"""`tokenselect`: token-level KV selection by per-head soft vote (paper Sec. 4) with the decode Selection Cache.

Every query block (prefill) or decoding sequence attends to
  sink     tokens [0, sink_tokens), always;
  selected the k = select_tokens candidates of [sink, window_start) with the highest head soft vote
           (eq. 10: per query head a softmax over the candidates of sm_scale * q . k, summed over all H
           query heads; GQA heads sharing a kv head vote separately); all candidates when they fit in k;
  local    tokens [window_start, last query], window_start = max(sink, first query + 1 - local_tokens).
Prefill blocks of query_block_size queries share one selection, scored with the block's mean query (Sec. 4.2).
Question-time selection (question_tokens > 0, the default; not in the paper): the prompt's last queries vote
together once (attention/common/question_selection.py) and their selection joins the question's own block and every
decode step's selection, below its window.
With vote_pool_size > 1 each candidate takes the best vote within vote_pool_size // 2 tokens before top-k.

Scoring positions. The cache holds keys without RoPE. Every candidate is scored as if it sat local_tokens
before the query (InfLLM's context-memory distance, which TokenSelect's budget layout follows): only the query
is rotated (by local_tokens), keys are read as cached, so the score depends on content, not on the original
distance, and stays meaningful far beyond the trained length. The selection is then a pure paged dot
product (triton.py), no per-key rotation.

Attention positions. Keys are renumbered 0.. in token order over sink + selected + local, and a query gets its
own token's number (queries after the selected tokens, contiguous), so every position stays below
sink + k + local + block size, whatever the context length. When every token is listed this is exactly the
original numbering: the method equals dense.

Selection Cache (App. C, Alg. 1), per sequence and layer: a decode step reuses the layer's last selection
while cos(q, q_sel) >= selection_cache_threshold, where q is the step's pre-RoPE query of all heads flattened
to one H * d vector (the paper's cos(Q, C_Q) on the whole multi-head query) and q_sel the query that made the
last selection (C_Q is updated on a miss only, as in Alg. 1). Pre-RoPE queries are compared because the
selection depends on the pre-RoPE query only (its scoring rotation is constant). On a hit the local window
keeps starting at the selection's window_start, so tokens that left the window since are still attended.
The cache lives in fixed device rows (selection_rows.py) and decides on the device: a step scores a new
selection for every sequence and keeps the old one where the query is similar (an eager step whose sequences all
hit skips the scoring), its lists in shapes of the capacity (decode_lists.py), so decode replays from CUDA graphs
(graph_hooks.py). Hits and misses are counted per layer on the device; `stats(state)` gives the hit ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from infinitehip.attention.base import AttentionMethod, ForwardBatch, KVSizing, SequenceSlice
from infinitehip.attention.capabilities import PrefixCaching, TensorParallelHeads
from infinitehip.host_values import device_tensor
from infinitehip.attention.common.needle_probe import FORCE_BONUS
from infinitehip.attention.common.question_selection import question_tokens
from infinitehip.attention.common.repeated_text import repeated_candidates
from infinitehip.attention.ops.sparse.op import sparse_attention_decode, sparse_attention_prefill
from infinitehip.attention.methods.tokenselect.soft_vote.op import soft_vote
from infinitehip.attention.methods.tokenselect.config import TokenSelectConfig
from infinitehip.attention.methods.tokenselect.decode_lists import decode_key_list, top_tokens
from infinitehip.attention.methods.tokenselect.decode_lists import union_below as decode_union
from infinitehip.attention.methods.tokenselect.graph_hooks import TokenSelectGraphHooks
from infinitehip.attention.methods.tokenselect.selection_rows import SelectionRows, read_rows, updated_rows, write_rows
from infinitehip.config.impl import resolve_impl
from infinitehip.config.model import ModelConfig
from infinitehip.kv.prefix_reuse import PrefixReuse
from infinitehip.model.rope import RotaryEmbedding, apply_rotary


@dataclass
class TokenSelectState:
    """Per sequence: the decode Selection Cache (device rows, allocated at the first decode step) and, per layer,
    what the prefill leaves for the answer."""

    question: list[torch.Tensor | None]  # [<= question_select_tokens] sorted question-time selection (attention/common/question_selection.py)
    # The last question_tokens pre-RoPE prefill queries [<= question_tokens, H, d]: the question may start in the
    # chunk before the one that ends the prompt.
    recent_q: list[torch.Tensor | None]
    rows: SelectionRows | None = None  # selection_rows.py

    @classmethod
    def empty(cls, num_layers: int) -> "TokenSelectState":
        return cls([None] * num_layers, [None] * num_layers)

    def counts(self) -> tuple[list[int], list[int]]:
        """Per layer (hits, misses) of the decode steps so far; misses = selections made (a host read)."""
        if self.rows is None:
            return [0] * len(self.question), [0] * len(self.question)
        return self.rows.counts()

    @property
    def hits(self) -> list[int]:
        return self.counts()[0]

    @property
    def misses(self) -> list[int]:  # selections made (every decode step when the cache is off)
        return self.counts()[1]

    @property
    def hit_ratio(self) -> float | None:
        """Share of decode steps (over all layers) that reused a selection; None before the first decode step."""
        hits, misses = self.counts()
        total = sum(hits) + sum(misses)
        return sum(hits) / total if total else None


def pad_rows(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Variable-length int rows -> ([R, K] int32 padded with token 0, counts [R] int32)."""
    K = max(r.numel() for r in rows)
    tokens = torch.stack([F.pad(r, (0, K - r.numel())) for r in rows]).int()
    counts = device_tensor([r.numel() for r in rows], torch.int32, tokens.device)
    return tokens, counts


def union_below(selected: torch.Tensor, extra: torch.Tensor | None, limit: int) -> torch.Tensor:
    """Sorted union of a selection and the extra tokens (both sorted int64) below `limit`."""
    if extra is None:
        return selected
    return torch.unique(torch.cat([selected, extra[extra < limit]]), sorted=True)


class TokenSelectAttention(AttentionMethod, TokenSelectGraphHooks, PrefixCaching, TensorParallelHeads):
    name = "tokenselect"

    def __init__(self, model_config: ModelConfig, config: TokenSelectConfig | None = None):
        super().__init__(model_config)
        self.config = config or TokenSelectConfig()
        self.sm_scale = model_config.head_dim ** -0.5
        self.vote_scale = 1.0 if self.config.vote_logits == "raw" else self.sm_scale

    @classmethod
    def kv_sizing(cls, model_config: ModelConfig, config: Any = None, tokenizer: Any = None) -> KVSizing:
        return KVSizing(1 << 17)

    def new_state(self) -> TokenSelectState:
        return TokenSelectState.empty(self.model_config.num_layers)

    def prompt_end_tokens(self, prompt_tokens: int) -> int:
        """The question's queries attend its selection only in the chunk that ends the prompt: all of them are there."""
        return max(1, self.config.question_tokens)

    def prefix_reuse(self) -> PrefixReuse:
        """A block's selection uses its mean query (future tokens of the block) and blocks follow the chunks: a
        prefix is exact on the prefill-chunk grid. The question's queries are recomputed (they may start in the
        chunk before the last); the per-sequence state is all made after the boundary (Selection Cache: decode)."""
        return PrefixReuse(chunk_aligned=True, min_recompute_tokens=max(1, self.config.question_tokens))

    def stats(self, state: TokenSelectState) -> dict:
        """Selection Cache counts of one sequence (summed over layers) and its hit ratio."""
        hits, misses = (sum(n) for n in state.counts())  # one host read of the device counts
        return {"hits": hits, "misses": misses, "hit_ratio": hits / (hits + misses) if hits + misses else None}

    def _impl(self, x: torch.Tensor) -> str:
        """The ops' implementation for x's device (config/impl.py): Triton on CUDA; on CPU ("auto") the eager vote
        (it has no CPU formulation) and the batched-SDPA sparse attention, or the eager oracles."""
        return resolve_impl(self.config.impl, x.device)

    def window_start(self, first_query: int) -> int:
        """Start of the local window of queries from position first_query on (= end of the candidates)."""
        return max(self.config.sink_tokens, first_query + 1 - self.config.local_tokens)

    # ---- selection ----------------------------------------------------------------------------------------
    def select(self, q: torch.Tensor, k_flat: torch.Tensor, page_tables: torch.Tensor, page_size: int,
               limits: list[int], rope: RotaryEmbedding, forced: list[torch.Tensor | None] | None = None) -> list[torch.Tensor]:
        """q [R, H, d] pre-RoPE, one query per row (a block's mean or a decode query); row r's candidates are
        [sink, limits[r]) of the sequence with page_tables[r] -> per row the sorted selected tokens (int64).
        forced[r] (oracle diagnostics, needle_probe.py): tokens ranked above every other candidate of row r."""
        c = self.config
        sink, k = c.sink_tokens, c.select_tokens
        counts = [max(0, limit - sink) for limit in limits]
        need = [r for r, n in enumerate(counts) if n > k]
        picked = {r: torch.arange(sink, sink + n, device=q.device) for r, n in enumerate(counts) if n <= k}
        if need:
            if len(need) < len(counts):
                index = device_tensor(need, torch.int64, q.device)
                q, page_tables = q[index], page_tables[index]
            need_counts = [counts[r] for r in need]
            votes = self.votes(q, k_flat, page_tables, page_size, device_tensor(need_counts, torch.int64, q.device),
                               max(need_counts), rope)
            if forced is not None:
                for row, r in enumerate(need):
                    if forced[r] is not None:
                        f = forced[r][(forced[r] >= sink) & (forced[r] < limits[r])] - sink
                        votes[row, f] = FORCE_BONUS
            top = torch.topk(votes, k, dim=1).indices.sort(dim=1).values + sink  # every row has > k candidates
            picked.update(zip(need, top))
        return [picked[r] for r in range(len(counts))]

    def votes(self, q: torch.Tensor, k_flat: torch.Tensor, page_tables: torch.Tensor, page_size: int,
              counts: torch.Tensor, width: int, rope: RotaryEmbedding) -> torch.Tensor:
        """q [R, H, d] pre-RoPE; row r's candidates [sink, sink + counts[r]) (counts [R] int64 on the device)
        -> votes [R, width] fp32 over all heads (pooled), -inf past each row's count."""
        c = self.config
        rope.ensure(c.local_tokens + 1)
        distance = c.local_tokens  # candidates scored as if local_tokens before the query (module doc)
        q_rot = apply_rotary(q.float(), rope.cos[distance], rope.sin[distance]).contiguous()
        starts = torch.full((q.shape[0],), c.sink_tokens, dtype=torch.int64, device=q.device)
        votes = soft_vote(q_rot, k_flat, page_tables, page_size, starts, counts, width, self.vote_scale,
                          impl=self._impl(q))
        votes = self.reduce_heads(votes, "sum")  # tensor parallelism: every rank's heads vote
        if c.vote_pool_size > 1:  # spans around the peaks; past a row's count stays -inf (never picked)
            pooled = F.max_pool1d(votes[:, None], c.vote_pool_size, stride=1, padding=c.vote_pool_size // 2)
            votes = pooled[:, 0].masked_fill(votes == float("-inf"), float("-inf"))
        return votes

    def key_list(self, selected: torch.Tensor, window_start: int, last: int) -> torch.Tensor:
        """Sorted key tokens: sink, selected, local window [window_start, last] (int64)."""
        device = selected.device
        sink = torch.arange(min(self.config.sink_tokens, last + 1), device=device)
        window = torch.arange(min(window_start, last + 1), last + 1, device=device)  # empty inside the sink
        return torch.cat([sink, selected, window])

    # ---- prefill ----------------------------------------------------------------------------------------
    def prefill(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> torch.Tensor:
        """Blocks of query_block_size queries, each selecting with its mean query. When the chunk ends the prompt
        and question_tokens > 0, its last question_tokens queries make the question-time selection (attention/common/question_selection.py),
        kept in the state for the answer, and attend it as one block besides that block's own selection."""
        c = self.config
        n = q.shape[0]
        if c.question_tokens == 0:
            return self._prefill_blocks(layer, q, seq, batch, 0, c.query_block_size)
        state: TokenSelectState = seq.state
        previous = state.recent_q[layer]
        recent = q if previous is None else torch.cat([previous, q])
        state.recent_q[layer] = recent = recent[-c.question_tokens :].clone()
        if not seq.ends_prompt:
            return self._prefill_blocks(layer, q, seq, batch, 0, c.query_block_size)
        state.recent_q[layer] = None
        tail = min(n, c.question_tokens)  # the question's queries in this chunk
        first = seq.context_len - recent.shape[0]  # the question's first query (maybe in the previous chunk)
        probe = seq.probe
        limit = self.window_start(first)
        question = question_tokens(
            recent, seq.cache.flat_k(layer), seq.page_table, seq.cache.page_size, c.sink_tokens,
            limit, c.question_select_tokens, c.question_window, c.local_tokens, batch.rope,
            self._impl(q), probe.on(q.device) if probe is not None and probe.oracle else None,
            reduce=None if self.parallel is None else self.reduce_heads,
            repeated=repeated_candidates(seq.text, c.repeat_span, c.sink_tokens, limit, q.device))
        seq.state.question[layer] = question
        outs = [self._prefill_blocks(layer, q[: n - tail], seq, batch, 0, c.query_block_size)] if tail < n else []
        outs.append(self._prefill_blocks(layer, q[n - tail :], seq, batch, n - tail, tail, question))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _prefill_blocks(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch, row0: int,
                        b: int, extra: torch.Tensor | None = None) -> torch.Tensor:
        """Queries q [n, H, d] = rows row0.. of the chunk, in blocks of b sharing one selection each; `extra`
        (sorted tokens) joins every block's selection below its window."""
        n, H, d = q.shape
        start = seq.start_pos + row0
        end = start + n  # exclusive: the last query's position + 1
        M = -(-n // b)
        firsts = [start + i * b for i in range(M)]
        lasts = [min(f + b, end) - 1 for f in firsts]
        limits = [self.window_start(f) for f in firsts]
        sizes = device_tensor([e - f + 1 for f, e in zip(firsts, lasts)], torch.int64, q.device)
        q_mean = F.pad(q.float(), (0, 0, 0, 0, 0, M * b - n)).view(M, b, H, d).sum(1) / sizes[:, None, None]
        k_flat = seq.cache.flat_k(layer)
        probe = seq.probe
        forced = [probe.on(q.device)] * M if probe is not None and probe.oracle else None
        picked = self.select(q_mean, k_flat, seq.page_table[None].expand(M, -1), seq.cache.page_size, limits, batch.rope,
                             forced)
        if extra is not None:
            picked = [union_below(p, extra, ws) for p, ws in zip(picked, limits)]
        lists = [self.key_list(p, ws, e) for p, ws, e in zip(picked, limits, lasts)]
        if probe is not None and probe.is_last_prefill(end):  # the block holding the prompt's last query
            probe.record_prefill("attended", layer, self.model_config.num_layers, probe.share_of_tokens(lists[-1]))
        key_tokens, key_counts = pad_rows(lists)

        # Keys numbered 0.. in order; a query gets its own token's number: keys listed before the window plus
        # its offset in the window, or its own index when it is a sink token (then nothing is selected).
        query_pos = torch.arange(start, end, device=q.device)
        block = torch.arange(n, device=q.device) // b
        ws = device_tensor(limits, torch.int64, q.device)[block]
        before = device_tensor([min(self.config.sink_tokens, e + 1) + p.numel() for p, e in zip(picked, lasts)],
                               torch.int64, q.device)[block]
        query_rope = torch.where(query_pos >= ws, before + query_pos - ws, query_pos)
        K = key_tokens.shape[1]
        key_rope = torch.arange(K, device=q.device, dtype=torch.int32).expand(M, K).contiguous()
        batch.rope.ensure(K)
        return sparse_attention_prefill(
            q, k_flat, seq.cache.flat_v(layer), seq.page_table, seq.cache.page_size, key_tokens, key_counts,
            key_rope, query_pos.int(), query_rope.int(), b, batch.rope.cos, batch.rope.sin, self.sm_scale,
            impl=self._impl(q),
        )

    # ---- decode -------------------------------------------------------------------------------------------
    def _similarity(self, cur: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Cosine similarity [B] of queries [B, H * d] over all heads; under tensor parallelism the dot product and
        norms are summed over the ranks, so every rank takes the same reuse decision (as one process would)."""
        if self.parallel is None:
            return F.cosine_similarity(cur, last, dim=-1)
        parts = self.reduce_heads(torch.stack([(cur * last).sum(-1), cur.square().sum(-1), last.square().sum(-1)]), "sum")
        return parts[0] / (parts[1] * parts[2]).sqrt().clamp(min=1e-8)

    def decode(self, layer: int, q: torch.Tensor, seqs: list[SequenceSlice], batch: ForwardBatch) -> torch.Tensor:
        """q [B, H, d] pre-RoPE, one token per sequence -> [B, H, d]. Sync-free, shapes of batch.decode_capacity:
        positions and page tables read from the batch's device tensors, the Selection Cache from the sequences'
        rows (module doc), so the step is capturable (graph_hooks.py)."""
        c = self.config
        rows = [self.decode_rows(s.state, q) for s in seqs]
        layout = rows[0].layout
        ints, last_q = read_rows(rows, layer)  # [B, width], [B, H * d]
        positions, page_tables, capacity = batch.decode_positions, batch.decode_page_tables, batch.decode_capacity
        k_flat, page_size = seqs[0].cache.flat_k(layer), seqs[0].cache.page_size
        flat_q = q.flatten(1).float()  # [B, H * d]
        reuse = ints[:, layout.made] > 0  # [B] bool: keep the last selection (never before one, nor with the cache off)
        if c.selection_cache:
            reuse &= self._similarity(flat_q, last_q) >= c.selection_cache_threshold
        limits = (positions + 1 - c.local_tokens).clamp(min=c.sink_tokens)  # [B] a new selection's window start
        old = ints[:, layout.selected], ints[:, layout.num_selected]
        new = old if self.eager_all_reuse(reuse) else self._select_rows(q, seqs, k_flat, page_tables, page_size,
                                                                         limits, capacity, batch.rope)
        selected = torch.where(reuse[:, None], old[0], new[0])  # [B, k] sorted, then padding
        num_selected = torch.where(reuse, old[1], new[1])
        window_start = torch.where(reuse, ints[:, layout.window_start], limits)
        union, num_union = decode_union(selected, num_selected, ints[:, layout.question], ints[:, layout.num_question],
                                        window_start)
        kept = updated_rows(layout, ints, reuse, selected, num_selected, window_start, c.selection_cache)
        write_rows(rows, layer, kept, torch.where(reuse[:, None], last_q, flat_q))  # in place: a graph's buffers

        key_tokens, key_counts = decode_key_list(union, num_union, window_start, positions, c.sink_tokens, capacity)
        for i, s in enumerate(seqs):
            if s.probe is not None:  # eager only (graph_key)
                s.probe.record_decode(layer, s.probe.share_of_tokens(key_tokens[i, : int(key_counts[i])]))
        B, K = key_tokens.shape
        key_rope = torch.arange(K, device=q.device, dtype=torch.int32).expand(B, K).contiguous()
        query_rope = key_counts - 1  # the query's own token is the last key
        batch.rope.ensure(K)
        return sparse_attention_decode(
            q, k_flat, seqs[0].cache.flat_v(layer), page_tables, page_size,
            key_tokens, key_counts, key_rope, query_rope, *batch.rope.decode_tables(q.dtype), self.sm_scale,
            impl=self._impl(q),
        )

    def _select_rows(self, q: torch.Tensor, seqs: list[SequenceSlice], k_flat: torch.Tensor, page_tables: torch.Tensor,
                     page_size: int, limits: torch.Tensor, capacity: int,
                     rope: RotaryEmbedding) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's new selection of [sink, limits[b]) (limits [B] on the device) -> tokens [B, k] sorted (then
        padding), counts [B]: `select` in the shapes of the capacity."""
        c = self.config
        sink, k = c.sink_tokens, c.select_tokens
        counts = limits - sink  # [B] candidates
        width = capacity - c.local_tokens - sink  # most candidates of a row within the capacity
        if width <= k:  # every row's candidates fit: all selected, nothing scored
            return torch.arange(sink, sink + k, device=q.device).expand(len(seqs), k), counts
        votes = self.votes(q, k_flat, page_tables, page_size, counts, width, rope)  # [B, width]
        for row, s in enumerate(seqs):  # oracle diagnostics (needle_probe.py), eager only
            if s.probe is not None and s.probe.oracle:
                f = s.probe.on(q.device)
                votes[row, f[(f >= sink) & (f < self.window_start(s.start_pos))] - sink] = FORCE_BONUS
        return top_tokens(votes, counts, k) + sink, counts.clamp(max=k)

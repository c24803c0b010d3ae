"""Runs one scheduled step through the model: builds the flat token batch, calls the method per layer."""

from __future__ import annotations

import torch

from infinitehip.attention.base import AttentionMethod, ChunkHooks, ForwardBatch, SequenceSlice
from infinitehip.attention.capabilities import CacheCompaction, GraphBatching, supports
from infinitehip.attention.common.hybrid import LayerRouter
from infinitehip.attention.common.repeated_text import PromptText
from infinitehip.attention.common.sliding_window import SlidingWindowAttention
from infinitehip.engine import prefix_pages
from infinitehip.engine.graph_decode import GraphDecoder
from infinitehip.engine.logprobs import prompt_logprobs
from infinitehip.engine.prefix_pages import BoundaryState
from infinitehip.engine.scheduler import StepPlan
from infinitehip.engine.sequence import Sequence
from infinitehip.host_values import device_tensor
from infinitehip.kv.paged_cache import PagedKVCache
from infinitehip.kv.prefix_reuse import PrefixHit, PrefixPolicy
from infinitehip.model.loading import Decoder
from infinitehip.model.rope import RotaryEmbedding


class StepCancelled(Exception):
    """Every sequence of the step was cancelled while it ran (LLMEngine.request_cancel): it stopped between layers."""


class ModelRunner:
    def __init__(self, model: Decoder, cache: PagedKVCache, rope: RotaryEmbedding, method: AttentionMethod,
                 graph_decoder: GraphDecoder | None = None, router: LayerRouter | None = None):
        self.model, self.cache, self.rope, self.method = model, cache, rope, method
        # The decoder's layer callable: the method, or for hybrid models a router that gives it only the
        # full-attention layers and runs the sliding-window ones itself.
        self.router = router
        self.device = cache.device
        self.graph_decoder = graph_decoder  # decode-only steps replay CUDA graphs (CUDA only)
        self.prefix: PrefixPolicy | None = None  # prefix caching's policy (set by the engine): ring copies at boundaries
        # Per sequence: a device copy of its page table [capacity] (int32) and how many entries are valid.
        self._page_tables: dict[int, tuple[torch.Tensor, int]] = {}
        # stop_check(seq ids of a step) -> True once all of them are cancelled (set by the engine; checked between
        # layers of a step's forward, so a client gone mid-chunk frees its KV within a layer, not a chunk)
        self.stop_check = None

    def page_table(self, seq: Sequence) -> torch.Tensor:
        """The sequence's page table on the device [num_pages]. A sequence's table only grows while it runs (it
        is released when preempted or finished), so only new pages are copied: at 1M tokens the table has 16K
        entries, and rebuilding it from the Python list costs milliseconds per decode step."""
        n = len(seq.page_table)
        table, valid = self._page_tables.get(seq.seq_id, (None, 0))
        if table is None or n < valid:
            table, valid = torch.empty(max(n, 1), dtype=torch.int32, device=self.device), 0
        if n > table.numel():
            grown = torch.empty(max(n, 2 * table.numel()), dtype=torch.int32, device=self.device)
            grown[:valid] = table[:valid]
            table = grown
        if n > valid:
            table[valid:n] = torch.tensor(seq.page_table[valid:n], dtype=torch.int32).to(self.device)
        self._page_tables[seq.seq_id] = (table, n)
        return table[:n]

    @property
    def sliding(self) -> SlidingWindowAttention | None:
        return None if self.router is None else self.router.sliding

    def apply_prefix_hit(self, seq: Sequence, hit: PrefixHit, state: BoundaryState | None, page_size: int) -> None:
        """A reused prefix's page copies and boundary state, before the sequence's first forward."""
        prefix_pages.apply_hit(self.cache, self.method, self.sliding, seq, hit, state, page_size)

    def keep_boundary(self, seq: Sequence, policy: PrefixPolicy, boundary: int) -> BoundaryState | None:
        """The state a cached prefix boundary keeps (after the chunk that reached it ran)."""
        return prefix_pages.boundary_state(self.cache, self.method, self.sliding, policy, seq, boundary)

    def release(self, seq: Sequence) -> None:
        self._page_tables.pop(seq.seq_id, None)
        if self.router is not None:
            self.router.release(seq.seq_id)
        if self.graph_decoder is not None:
            self.graph_decoder.release(seq.seq_id)

    def _slice(self, seq: Sequence, offset: int, n: int, is_prefill: bool, scratch: bool = False) -> SequenceSlice:
        ends_prompt = is_prefill and not seq.output_ids and seq.num_computed + n == seq.prefill_target and not scratch
        ring_boundary = None
        if is_prefill and not scratch and self.prefix is not None and self.prefix.rings:
            # a boundary this chunk registers before its end: the sliding layers keep their rings there too
            b = self.prefix.registrable(seq.num_computed, seq.num_computed + n, seq.num_prompt_tokens)
            ring_boundary = b if b is not None and seq.num_computed < b < seq.num_computed + n else None
        return SequenceSlice(
            seq_id=seq.seq_id, query_start=offset, num_queries=n, start_pos=seq.num_cached, token_start=seq.num_computed,
            page_table=self.page_table(seq), cache=self.cache, state=seq.method_state, is_prefill=is_prefill,
            ends_prompt=ends_prompt, probe=seq.probe, scratch=scratch,
            text=PromptText(seq.prompt_ids) if ends_prompt else None, ring_boundary=ring_boundary,
        )

    def _forward(self, input_ids: list[int], slices: list[SequenceSlice], may_stop: bool = False) -> torch.Tensor:
        batch = ForwardBatch(slices, self.cache, self.rope, len(input_ids))
        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        attention = self.router or self.method
        stop, seq_ids = (self.stop_check if may_stop else None), [s.seq_id for s in slices]

        def layer_attention(layer, q, k, v):
            if stop is not None and stop(seq_ids):  # nothing of this step is kept: its KV slots are rewritten or freed
                raise StepCancelled
            return attention(layer, q, k, v, batch)

        return self.model(ids, layer_attention)

    @torch.inference_mode()
    def run(self, plan: StepPlan) -> tuple[list[Sequence], torch.Tensor]:
        """Compute the step; return the sequences that sample a token now and their logits [N, vocab]."""
        if self.graph_decoder is not None and not plan.prefill and plan.decode:
            logits = self._graph_steps(plan.decode)
            if logits is not None:
                return plan.decode, logits
        slices, input_ids, sample_rows, samplers = [], [], [], []
        for seq, n in plan.prefill:
            slices.append(self._slice(seq, len(input_ids), n, is_prefill=True))
            input_ids += seq.token_ids(seq.num_computed, seq.num_computed + n)
            if seq.num_computed + n == seq.prefill_target and not seq.output_ids:  # prompt done: predict the first output
                sample_rows.append(len(input_ids) - 1)
                samplers.append(seq)
        for seq in plan.decode:
            slices.append(self._slice(seq, len(input_ids), 1, is_prefill=False))
            sample_rows.append(len(input_ids))
            samplers.append(seq)
            input_ids += seq.token_ids(seq.num_computed, seq.num_computed + 1)
        if self.graph_decoder is not None:
            for s in slices:
                if s.ends_prompt:  # the decode's RoPE reach, before graphs of this chunk are captured over the tables
                    self.graph_decoder.reserve_rope(s.start_pos + s.num_queries + 1)
        hidden = self._forward(input_ids, slices, may_stop=True)
        logits = self.model.compute_logits(hidden[sample_rows])
        for s, (seq, _) in zip(slices, plan.prefill):
            if seq.params.prompt_logprobs is not None:
                self._prompt_logprobs(seq, s, hidden)
        for s, seq in zip(slices, [seq for seq, _ in plan.prefill] + plan.decode):
            self._advance(seq, s, hidden)
        return samplers, logits

    def _graph_steps(self, decode: list[Sequence]) -> torch.Tensor | None:
        """A decode-only step from CUDA graphs -> logits [N, vocab], or None (eager: nothing ran). The sequences are
        grouped by the batch class of their method keys (`GraphDecode.graph_batch_class`: infinitehip's pruned steps
        share one whatever stages each refreshes); each group replays one graph of them all, or each one's in turn,
        as the method says (`GraphDecode.graph_batching`)."""
        if any(seq.probe is not None for seq in decode):  # a probe records on the host: eager steps only
            return None
        alone = [self._slice(seq, 0, 1, is_prefill=False) for seq in decode]
        keys = [self.graph_decoder.key(s) for s in alone]
        if None in keys:
            return None
        tokens = [seq.token_ids(seq.num_computed, seq.num_computed + 1)[0] for seq in decode]
        if len(decode) == 1:
            logits = self.graph_decoder.step(alone, tokens, keys[0])
        else:
            groups: dict = {}
            for i, key in enumerate(keys):
                groups.setdefault(self.method.graph_batch_class(key[1]), []).append(i)
            rows, parts = [], []  # each graph's output stays valid until its next replay: the step's end
            for members in groups.values():
                if len(members) == 1 or self.method.graph_batching([alone[i] for i in members], keys[members[0]][1]) \
                        is GraphBatching.EACH_GRAPH:
                    parts += [self.graph_decoder.step([alone[i]], [tokens[i]], keys[i]) for i in members]
                else:
                    batch = [self._slice(decode[i], j, 1, is_prefill=False) for j, i in enumerate(members)]
                    parts.append(self.graph_decoder.step(batch, [tokens[i] for i in members],
                                                         self.graph_decoder.batch_key([keys[i] for i in members]),
                                                         [keys[i][1] for i in members]))
                rows += members
            logits = parts[0] if len(parts) == 1 else torch.cat(parts)
            if rows != list(range(len(decode))):  # back to the step's order
                order = [0] * len(rows)
                for at, i in enumerate(rows):
                    order[i] = at
                logits = logits[device_tensor(order, torch.long, logits.device)]
        for seq, s in zip(decode, alone):
            self._advance(seq, s, None)
        return logits

    @torch.inference_mode()
    def run_graph_ahead(self, seqs: list[Sequence]) -> torch.Tensor | None:
        """The next decode step of `seqs`, whose input tokens the GPU already wrote into the graphs' input buffer in
        this order (engine/decode_ahead.py) -> logits [N, vocab] in the same order, or None (not one graph of them
        all: nothing ran)."""
        alone = [self._slice(seq, 0, 1, is_prefill=False) for seq in seqs]
        keys = [self.graph_decoder.key(s) for s in alone]
        if None in keys:
            return None
        if len(seqs) == 1:
            logits = self.graph_decoder.step(alone, None, keys[0])
        else:
            classes = {self.method.graph_batch_class(key[1]) for key in keys}
            if len(classes) > 1 or self.method.graph_batching(alone, keys[0][1]) is GraphBatching.EACH_GRAPH:
                return None
            batch = [self._slice(seq, j, 1, is_prefill=False) for j, seq in enumerate(seqs)]
            logits = self.graph_decoder.step(batch, None, self.graph_decoder.batch_key(keys), [k[1] for k in keys])
        for seq, s in zip(seqs, alone):
            self._advance(seq, s, None)
        return logits

    def _prompt_logprobs(self, seq: Sequence, s: SequenceSlice, hidden: torch.Tensor) -> None:
        """Log-probabilities of the prompt tokens this prefill chunk predicts: row i (position token_start + i)
        predicts token token_start + i + 1, up to the prompt's last token. Positions already recorded (a
        recomputation after preemption) are skipped."""
        t0 = s.token_start
        lo = max(0, len(seq.prompt_logprobs) - t0)
        hi = min(s.num_queries, seq.num_prompt_tokens - 1 - t0)
        if hi <= lo:
            return
        targets = torch.tensor(seq.token_ids(t0 + lo + 1, t0 + hi + 1), device=hidden.device)
        rows = hidden[s.query_start + lo : s.query_start + hi]
        seq.prompt_logprobs += prompt_logprobs(self.model.compute_logits, rows, targets, seq.params.prompt_logprobs)

    def _advance(self, seq: Sequence, s: SequenceSlice, hidden: torch.Tensor | None) -> None:
        """The step's tokens of `seq` went through the model: count them, then let a compacting method compact."""
        seq.advance(s.num_queries)
        if not supports(self.method, CacheCompaction):
            return
        hooks = ChunkHooks(
            extra_forward=lambda ids: self._extra_forward(seq, ids),
            token_nll=lambda: self._token_nll(hidden[s.query_rows], seq, s.token_start),
            prompt_ids=seq.prompt_ids,
        )
        kept = self.method.after_forward(s, hooks)
        if kept is not None:  # the method compacted the sequence's cache to its first `kept` slots
            seq.num_cached = kept

    @torch.inference_mode()
    def forward_logits(self, seq: Sequence, n: int) -> torch.Tensor:
        """Prefill the sequence's next n prompt tokens and return logits of every one of them [n, vocab]."""
        s = self._slice(seq, 0, n, is_prefill=True)
        hidden = self._forward(seq.token_ids(seq.num_computed, seq.num_computed + n), [s])
        logits = self.model.compute_logits(hidden)
        self._advance(seq, s, hidden)
        return logits

    def _token_nll(self, hidden: torch.Tensor, seq: Sequence, token_start: int, rows_per_pass: int = 512) -> torch.Tensor:
        """NLL [n - 1] of tokens token_start+1 .. token_start+n-1 from the chunk's hidden states [n, D]."""
        n = hidden.shape[0]
        targets = torch.tensor(seq.token_ids(token_start + 1, token_start + n), device=hidden.device)
        out = []
        for i in range(0, n - 1, rows_per_pass):  # logits of a whole chunk would take n * vocab floats
            logits = self.model.compute_logits(hidden[i : min(i + rows_per_pass, n - 1)]).float()
            out.append(torch.nn.functional.cross_entropy(logits, targets[i : i + logits.shape[0]], reduction="none"))
        return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)

    def _extra_forward(self, seq: Sequence, token_ids: torch.Tensor) -> torch.Tensor:
        """Run extra tokens [n] after the sequence's cached tokens (e.g. a catalyst prompt) -> logits [n, vocab].

        Their k/v land in slots past num_cached, which the sequence's next tokens overwrite."""
        n = token_ids.numel()
        if seq.num_cached + n > len(seq.page_table) * self.cache.page_size:
            raise RuntimeError(f"sequence {seq.seq_id} has no KV room for {n} extra tokens")
        s = self._slice(seq, 0, n, is_prefill=True, scratch=True)
        hidden = self._forward(token_ids.tolist(), [s])
        return self.model.compute_logits(hidden)

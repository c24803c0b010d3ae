"""`hip` (HiP attention v1): hierarchical top-k key blocks + sinks + sliding window, block-sparse attention.

Prefill: a chunk's queries form blocks of `query_block_size` (from the chunk's start). A block whose first query
sits at position a attends the sinks, the K key blocks the hierarchy (`hierarchy.py`) picks among the candidates
[sink, a - window + 1), and the window [a - window + 1, itself] (causal): sinks, candidates and window partition
the keys before it. A block whose candidates span fewer than 2 * top_k_tokens keys attends every key.
Decode: one query per block. Each layer's selection (and the candidates' end at that step) is kept per sequence and
recomputed every `refresh_interval` steps (steps 0, R, 2R, ...); between refreshes the window reaches back to the
kept end, so every key that arrived since is attended. The decode step reads nothing back to the host: positions
and page tables come from the batch's device tensors, widths from the config and the capacity, so it replays from
CUDA graphs (`graph_hooks.py`); a step whose sequences all attend every key runs dense's paged op.
The first `dense_layers` layers attend every key. Positions: original ones everywhere (queries and keys rotated at
their own positions, in the scores and in the attention), as HiP v1 does within the trained length; the method
keeps the model's trained length as its default context limit.
The attention reads the key lists through the project's sparse attention op (Triton on CUDA).
A needle probe (attention/common/needle_probe.py) records the share of its tokens among the keys attended by the
prompt's last query block ("attended", per layer) and by each decode step (1.0 where every key is attended); an
oracle probe forces its tokens into every selection (`hierarchy.py`).
"""

from __future__ import annotations

import torch

from infinitehip.attention.base import AttentionMethod, ForwardBatch, SequenceSlice
from infinitehip.attention.capabilities import TensorParallelHeads
from infinitehip.attention.common.needle_probe import NeedleProbe
from infinitehip.attention.methods.dense.method import causal_sdpa, resident_decode
from infinitehip.attention.methods.hip.config import HiPConfig, candidate_end
from infinitehip.attention.methods.hip.graph_hooks import HiPGraphHooks
from infinitehip.attention.methods.hip.hierarchy import hierarchy_rounds, select_blocks, select_blocks_reference
from infinitehip.attention.methods.hip.key_list import key_list
from infinitehip.attention.methods.hip.state import HiPState
from infinitehip.attention.ops.sparse.op import sparse_attention_decode, sparse_attention_prefill
from infinitehip.config.impl import resolve_impl
from infinitehip.config.model import ModelConfig
from infinitehip.model.rope import apply_rotary


class HiPAttention(AttentionMethod, HiPGraphHooks, TensorParallelHeads):
    name = "hip"

    def __init__(self, model_config: ModelConfig, config: HiPConfig | None = None):
        super().__init__(model_config)
        self.config = config or HiPConfig()
        self.sm_scale = model_config.head_dim ** -0.5

    def new_state(self) -> HiPState:
        return HiPState.empty(self.model_config.num_layers)

    def _impl(self, x: torch.Tensor) -> str:
        return resolve_impl(self.config.impl, x.device)

    def _select(self, q_rot, seq_cache, layer, page_table, rope, ends, rounds=None, forced=None):
        c = self.config
        op = select_blocks_reference if self._impl(q_rot) == "reference" else select_blocks
        return op(q_rot, seq_cache.flat_k(layer), page_table, seq_cache.page_size, rope.cos, rope.sin, ends,
                  c.sink_tokens, c.top_k_blocks, c.key_block_size,
                  reduce=None if self.parallel is None else self.reduce_heads, rounds=rounds, forced=forced)

    def _record_prefill(self, probe: NeedleProbe | None, layer: int, seq: SequenceSlice,
                        key_tokens: torch.Tensor | None = None, count: int = 0) -> None:
        """The share of the probe's tokens among the keys of the prompt's last query block: key_tokens [>= count]
        (None: every key attended)."""
        if probe is not None and probe.is_last_prefill(seq.context_len):
            share = 1.0 if key_tokens is None else probe.share_of_tokens(key_tokens[:count])
            probe.record_prefill("attended", layer, self.model_config.num_layers, share)

    # ---- prefill ----------------------------------------------------------------------------------------
    def _dense(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> torch.Tensor:
        batch.rope.ensure(seq.context_len)
        k, v = seq.cache.read(layer, seq.context_slots)
        return causal_sdpa(batch.rope.apply_range(q, seq.start_pos), batch.rope.apply_range(k, 0), v, seq.start_pos)

    def prefill(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> torch.Tensor:
        c = self.config
        n, b = q.shape[0], c.query_block_size
        if layer < c.dense_layers or not c.selects(seq.context_len - 1 - (n - 1) % b):
            self._record_prefill(seq.probe, layer, seq)
            return self._dense(layer, q, seq, batch)  # no block selects (the last block's first query decides)
        device = q.device
        batch.rope.ensure(seq.context_len)
        M = -(-n // b)
        first = seq.start_pos + torch.arange(M, device=device) * b
        last = torch.clamp(first + b - 1, max=seq.context_len - 1)
        ends = torch.clamp(first - c.window_tokens + 1, min=c.sink_tokens)
        selecting = ends - c.sink_tokens >= 2 * c.top_k_tokens
        query_pos = torch.arange(seq.start_pos, seq.context_len, device=device)
        q_rot = apply_rotary(q.float(), batch.rope.cos[query_pos][:, None], batch.rope.sin[query_pos][:, None])
        rows = selecting.nonzero().flatten()
        padded = torch.clamp(torch.arange(M * b, device=device), max=n - 1)  # a short last block repeats its queries
        q_blocks = q_rot[padded].view(M, b, *q.shape[1:])[rows]
        forced = seq.probe.on(device) if seq.probe is not None and seq.probe.oracle else None
        sel_starts, sel_lens = self._select(q_blocks, seq.cache, layer, seq.page_table, batch.rope, ends[rows],
                                            forced=forced)
        starts = torch.zeros(M, c.top_k_blocks, dtype=torch.long, device=device)
        lens = torch.zeros_like(starts)
        starts[rows], lens[rows] = sel_starts, sel_lens
        span = 0 if c.selects(seq.start_pos) else seq.context_len  # the first block is the last to select
        key_tokens, key_counts = key_list(starts, lens, ends, last, c.sink_tokens, c.key_block_size,
                                          c.window_tokens + b - 1, span)
        key_tokens = key_tokens[:, : int(key_counts.max())]  # prefill reads back (eager): the op's lists no wider
        self._record_prefill(seq.probe, layer, seq, key_tokens[-1], int(key_counts[-1]))
        key_tokens, key_counts, qpos = key_tokens.int(), key_counts.int(), query_pos.int()
        return sparse_attention_prefill(q, seq.cache.flat_k(layer), seq.cache.flat_v(layer), seq.page_table,
                                        seq.cache.page_size, key_tokens, key_counts, key_tokens, qpos, qpos, b,
                                        batch.rope.cos, batch.rope.sin, self.sm_scale, impl=self._impl(q))

    # ---- decode ----------------------------------------------------------------------------------------
    def refreshes_now(self, state: HiPState, layer: int) -> bool:
        """Whether this layer's next decode step recomputes its selection: steps 0, R, 2R, ..."""
        return state.ends[layer] is None or state.decode_steps[layer] % self.config.refresh_interval == 0

    def decode(self, layer: int, q: torch.Tensor, seqs: list[SequenceSlice], batch: ForwardBatch) -> torch.Tensor:
        """q [B, H, d] pre-RoPE -> [B, H, d]. Fixed shapes, no host read: the Python below branches on host counters
        only (the graph key's), the device work reads batch.decode_positions / decode_page_tables."""
        c = self.config
        if layer < c.dense_layers:
            self._record_decode(seqs, layer)
            return resident_decode(layer, q, batch)
        capacity = batch.decode_capacity
        batch.rope.ensure(capacity)
        states: list[HiPState] = [s.state for s in seqs]
        refreshing = []
        for i, (seq, state) in enumerate(zip(seqs, states)):
            state.allocate(self.model_config.num_layers, c.top_k_blocks, q.device)
            if self.refreshes_now(state, layer):
                state.ends[layer], state.sparse[layer] = candidate_end(seq.start_pos, c), c.selects(seq.start_pos)
                state.refreshes[layer] += 1
                refreshing.append(i)
            state.decode_steps[layer] += 1
            state.position = seq.start_pos
        if refreshing:
            self._refresh(layer, q, seqs, refreshing, batch)
        sparse = [state.sparse[layer] for state in states]
        if not any(sparse):  # every sequence attends every key
            self._record_decode(seqs, layer)
            return resident_decode(layer, q, batch)
        if len(states) == 1:
            rows = slice(layer, layer + 1)
            starts, lens, ends = states[0].starts[rows], states[0].lens[rows], states[0].end[rows]
        else:
            starts, lens, ends = (torch.stack([getattr(s, name)[layer] for s in states])
                                  for name in ("starts", "lens", "end"))
        # The window reaches back to the kept end: at most refresh_interval - 1 steps after a refresh (the graph
        # key's steps: one token each); an eager step after a longer gap widens it on the host.
        width = max([c.window_tokens + c.refresh_interval - 1] +
                    [s.start_pos - st.ends[layer] + 1 for s, st, on in zip(seqs, states, sparse) if on])
        last = batch.decode_positions  # [B] int64
        key_tokens, key_counts = key_list(starts, lens, ends, last, c.sink_tokens, c.key_block_size, width,
                                          0 if all(sparse) else capacity)
        self._record_decode(seqs, layer, key_tokens, key_counts)
        key_tokens = key_tokens.int()
        cache = seqs[0].cache
        return sparse_attention_decode(q, cache.flat_k(layer), cache.flat_v(layer), batch.decode_page_tables,
                                       cache.page_size, key_tokens, key_counts.int(), key_tokens, last.int(),
                                       *batch.rope.decode_tables(q.dtype), self.sm_scale, impl=self._impl(q))

    @staticmethod
    def _record_decode(seqs: list[SequenceSlice], layer: int, key_tokens: torch.Tensor | None = None,
                       key_counts: torch.Tensor | None = None) -> None:
        """Each probed sequence's share of its tokens among the keys its step attends: row i of key_tokens [B, W]
        up to key_counts [B] (None: every key). A probed step runs eagerly (engine/runner.py): host reads are fine."""
        for i, s in enumerate(seqs):
            if s.probe is not None:
                share = 1.0 if key_tokens is None else s.probe.share_of_tokens(key_tokens[i, : int(key_counts[i])])
                s.probe.record_decode(layer, share)

    @staticmethod
    def _forced(seqs: list[SequenceSlice], device: torch.device) -> torch.Tensor | None:
        """Oracle probes' tokens per decode row -> [B, n] (padding -1: forces nothing), None when none forces."""
        rows = [s.probe.on(device) if s.probe is not None and s.probe.oracle else None for s in seqs]
        if all(r is None for r in rows):
            return None
        n = max(r.numel() for r in rows if r is not None)
        pad = torch.full((len(rows), n), -1, dtype=torch.long, device=device)
        for i, r in enumerate(rows):
            if r is not None:
                pad[i, : r.numel()] = r
        return pad

    def _refresh(self, layer: int, q: torch.Tensor, seqs: list[SequenceSlice], rows: list[int],
                 batch: ForwardBatch) -> None:
        """Recompute the kept selection of the step's sequences `rows` (their host counters already say whether
        they select). Every sequence is scored at once (fixed shapes); those not refreshing drop theirs."""
        c = self.config
        picked = [i for i in rows if seqs[i].state.sparse[layer]]
        for i in rows:
            if i not in picked:  # too short to select: lens 0, every key attended
                seqs[i].state.lens[layer].zero_()
        if not picked:
            return
        positions = batch.decode_positions
        ends = torch.clamp(positions - c.window_tokens + 1, min=c.sink_tokens)  # [B] candidate_end
        if len(picked) < len(seqs):  # results dropped: any end the hierarchy takes (below a selecting one's)
            ends = torch.clamp(ends, min=c.sink_tokens + 2 * c.top_k_tokens)
        cos, sin = batch.rope.cos[positions][:, None], batch.rope.sin[positions][:, None]
        q_rot = apply_rotary(q.float(), cos, sin)  # [B, H, d]
        rounds = hierarchy_rounds(candidate_end(batch.decode_capacity - 1, c), c.sink_tokens, c.top_k_blocks,
                                  c.key_block_size)
        starts, lens = self._select(q_rot[:, None], seqs[0].cache, layer, batch.decode_page_tables, batch.rope,
                                    ends, rounds, self._forced(seqs, q.device))  # [B, K] each
        for i in picked:
            state: HiPState = seqs[i].state
            state.starts[layer].copy_(starts[i])
            state.lens[layer].copy_(lens[i])
            state.end[layer].copy_(ends[i])

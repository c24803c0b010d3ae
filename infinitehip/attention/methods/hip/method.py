"""`hip` (HiP attention v1): hierarchical top-k key blocks + sinks + sliding window, block-sparse attention.

Prefill: a chunk's queries form blocks of `query_block_size` (from the chunk's start). A block whose first query
sits at position a attends the sinks, the K key blocks the hierarchy (`hierarchy.py`) picks among the candidates
[sink, a - window + 1), and the window [a - window + 1, itself] (causal): sinks, candidates and window partition
the keys before it. A block whose candidates span fewer than 2 * top_k_tokens keys attends every key.
Decode: one query per block. Each layer's selection (and the candidates' end at that step) is kept per sequence and
recomputed every `refresh_interval` steps (steps 0, R, 2R, ...); between refreshes the window reaches back to the
kept end, so every key that arrived since is attended.
The first `dense_layers` layers attend every key. Positions: original ones everywhere (queries and keys rotated at
their own positions, in the scores and in the attention), as HiP v1 does within the trained length; the method
keeps the model's trained length as its default context limit.
The attention reads the key lists through the project's sparse attention op (Triton on CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from infinitehip.attention.base import AttentionMethod, ForwardBatch, SequenceSlice
from infinitehip.attention.capabilities import TensorParallelHeads
from infinitehip.attention.methods.dense.method import causal_sdpa
from infinitehip.attention.methods.hip.config import HiPConfig, candidate_end
from infinitehip.attention.methods.hip.hierarchy import select_blocks, select_blocks_reference
from infinitehip.attention.ops.sparse.op import sparse_attention_decode, sparse_attention_prefill
from infinitehip.config.impl import resolve_impl
from infinitehip.config.model import ModelConfig
from infinitehip.model.rope import apply_rotary

_BIG = torch.iinfo(torch.int64).max


@dataclass
class LayerMask:
    """A layer's decode selection: block starts / lens [K] (None: every key attended) and the candidates' end."""

    starts: torch.Tensor | None
    lens: torch.Tensor | None
    end: int


@dataclass
class HiPState:
    masks: list[LayerMask | None]
    decode_steps: list[int]  # decode steps run, per layer
    refresh_steps: list[list[int]] = field(default_factory=list)  # per layer: the decode steps that refreshed


def key_list(starts: torch.Tensor | None, lens: torch.Tensor | None, ends: torch.Tensor, last: torch.Tensor,
             sink: int, block_size: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted key tokens per row: sinks + selected blocks (starts/lens [M, K]) + the window [end, last]; a row
    whose starts are None, or whose lens are all 0, attends every token up to `last`. width: the widest window.
    -> (key_tokens [M, W] int64, padding 0; key_counts [M] int64)"""
    device = ends.device
    e = last[:, None]
    if starts is None:
        starts = torch.zeros(ends.shape[0], 0, dtype=torch.long, device=device)
        lens = starts
    dense = (lens.sum(1) == 0)[:, None]  # [M, 1]
    sink_tok = torch.arange(sink, device=device)[None, :].expand(ends.shape[0], -1)
    offsets = torch.arange(block_size, device=device)
    sel_tok = (starts[:, :, None] + offsets).flatten(1)
    sel_ok = (offsets < lens[:, :, None]).flatten(1)
    win_tok = ends[:, None] + torch.arange(width, device=device)
    sparse_tok = torch.cat([sink_tok, sel_tok, win_tok], 1)
    sparse_ok = torch.cat([sink_tok <= e, sel_ok, win_tok <= e], 1)
    span = int(last.max()) + 1 if bool(dense.any()) else 0
    all_tok = torch.arange(span, device=device)[None, :].expand(ends.shape[0], -1)
    W = max(sparse_tok.shape[1], span)
    sparse_tok, sparse_ok = F.pad(sparse_tok, (0, W - sparse_tok.shape[1])), F.pad(sparse_ok, (0, W - sparse_ok.shape[1]))
    all_tok = F.pad(all_tok, (0, W - span))
    all_ok = F.pad(all_tok[:, :span] <= e, (0, W - span))
    tokens = torch.where(dense, all_tok, sparse_tok)
    ok = torch.where(dense, all_ok, sparse_ok)
    tokens = torch.where(ok, tokens, _BIG).sort(dim=1).values
    counts = ok.sum(1)
    tokens = tokens[:, : int(counts.max())]
    return torch.where(tokens == _BIG, 0, tokens), counts


class HiPAttention(AttentionMethod, TensorParallelHeads):
    name = "hip"

    def __init__(self, model_config: ModelConfig, config: HiPConfig | None = None):
        super().__init__(model_config)
        self.config = config or HiPConfig()
        self.sm_scale = model_config.head_dim ** -0.5

    def new_state(self) -> HiPState:
        L = self.model_config.num_layers
        return HiPState(masks=[None] * L, decode_steps=[0] * L, refresh_steps=[[] for _ in range(L)])

    def _impl(self, x: torch.Tensor) -> str:
        return resolve_impl(self.config.impl, x.device)

    def _select(self, q_rot, seq_cache, layer, page_table, rope, ends):
        c = self.config
        op = select_blocks_reference if self._impl(q_rot) == "reference" else select_blocks
        return op(q_rot, seq_cache.flat_k(layer), page_table, seq_cache.page_size, rope.cos, rope.sin, ends,
                  c.sink_tokens, c.top_k_blocks, c.key_block_size,
                  reduce=None if self.parallel is None else self.reduce_heads)

    # ---- prefill ----------------------------------------------------------------------------------------
    def _dense(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> torch.Tensor:
        batch.rope.ensure(seq.context_len)
        k, v = seq.cache.read(layer, seq.context_slots)
        return causal_sdpa(batch.rope.apply_range(q, seq.start_pos), batch.rope.apply_range(k, 0), v, seq.start_pos)

    def prefill(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> torch.Tensor:
        c = self.config
        n, b = q.shape[0], c.query_block_size
        if layer < c.dense_layers or not c.selects(seq.context_len - 1 - (n - 1) % b):
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
        sel_starts, sel_lens = self._select(q_blocks, seq.cache, layer, seq.page_table, batch.rope, ends[rows])
        starts = torch.zeros(M, c.top_k_blocks, dtype=torch.long, device=device)
        lens = torch.zeros_like(starts)
        starts[rows], lens[rows] = sel_starts, sel_lens
        key_tokens, key_counts = key_list(starts, lens, ends, last, c.sink_tokens, c.key_block_size,
                                          c.window_tokens + b - 1)
        key_tokens, key_counts, qpos = key_tokens.int(), key_counts.int(), query_pos.int()
        return sparse_attention_prefill(q, seq.cache.flat_k(layer), seq.cache.flat_v(layer), seq.page_table,
                                        seq.cache.page_size, key_tokens, key_counts, key_tokens, qpos, qpos, b,
                                        batch.rope.cos, batch.rope.sin, self.sm_scale, impl=self._impl(q))

    # ---- decode ----------------------------------------------------------------------------------------
    def refreshes_now(self, state: HiPState, layer: int) -> bool:
        """Whether this layer's next decode step recomputes its selection: steps 0, R, 2R, ..."""
        return state.masks[layer] is None or state.decode_steps[layer] % self.config.refresh_interval == 0

    def _refresh(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> LayerMask:
        c = self.config
        position = seq.start_pos
        end = candidate_end(position, c)
        if not c.selects(position):
            return LayerMask(None, None, end)
        pos = torch.tensor([position], device=q.device)
        q_rot = apply_rotary(q.float(), batch.rope.cos[pos][:, None], batch.rope.sin[pos][:, None])  # [1, H, d]
        ends = torch.tensor([end], dtype=torch.long, device=q.device)
        starts, lens = self._select(q_rot[None], seq.cache, layer, seq.page_table, batch.rope, ends)
        return LayerMask(starts[0], lens[0], end)

    def decode(self, layer: int, q: torch.Tensor, seqs: list[SequenceSlice], batch: ForwardBatch) -> torch.Tensor:
        c = self.config
        if layer < c.dense_layers:
            return torch.cat([self._dense(layer, q[i : i + 1], s, batch) for i, s in enumerate(seqs)])
        batch.rope.ensure(max(s.context_len for s in seqs))
        masks = []
        for i, seq in enumerate(seqs):
            state: HiPState = seq.state
            if self.refreshes_now(state, layer):
                state.masks[layer] = self._refresh(layer, q[i : i + 1], seq, batch)
                state.refresh_steps[layer].append(state.decode_steps[layer])
            state.decode_steps[layer] += 1
            masks.append(state.masks[layer])
        if all(m.starts is None for m in masks):
            return torch.cat([self._dense(layer, q[i : i + 1], s, batch) for i, s in enumerate(seqs)])
        device = q.device
        K = c.top_k_blocks
        none = torch.zeros(K, dtype=torch.long, device=device)
        starts = torch.stack([none if m.starts is None else m.starts for m in masks])
        lens = torch.stack([none if m.lens is None else m.lens for m in masks])
        ends = torch.tensor([m.end for m in masks], dtype=torch.long, device=device)
        last = torch.tensor([s.start_pos for s in seqs], dtype=torch.long, device=device)
        width = int((last - ends).max()) + 1
        key_tokens, key_counts = key_list(starts, lens, ends, last, c.sink_tokens, c.key_block_size, width)
        key_tokens, key_counts = key_tokens.int(), key_counts.int()
        return sparse_attention_decode(q, seqs[0].cache.flat_k(layer), seqs[0].cache.flat_v(layer),
                                       batch.decode_page_tables, seqs[0].cache.page_size, key_tokens, key_counts,
                                       key_tokens, last.int(), batch.rope.cos, batch.rope.sin, self.sm_scale,
                                       impl=self._impl(q))

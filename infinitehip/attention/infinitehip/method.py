"""`infinitehip`: multi-stage context pruning + block-sparse attention with dynamic RoPE and mask caching.

Prefill: for each chunk, every pruning stage runs for the chunk's query blocks (Alg. 1), then sparse
attention reads sink + selected + streaming-window keys of each final block.
Decode (Alg. 4): stage i's output is cached per layer and recomputed every refresh_intervals[i] steps
from the latest query; the stream window starts at the oldest cached stage's limit, so a token that
left the window since the last refresh is still attended (nothing falls between the two).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from infinitehip.attention.base import AttentionMethod, ForwardBatch, SequenceSlice
from infinitehip.attention.dense import causal_sdpa
from infinitehip.attention.infinitehip.positions import attention_positions
from infinitehip.attention.infinitehip.pruning import QueryBlocks, StageOutput, StageSpec, query_blocks, run_stage, sparse_limit
from infinitehip.attention.infinitehip.saliency import KeySaliency
from infinitehip.attention.sparse import sparse_attention_decode, sparse_attention_prefill
from infinitehip.config.infinitehip import PRESETS, InfiniteHiPConfig
from infinitehip.config.model import ModelConfig


@dataclass
class InfiniteHiPState:
    """Per sequence: each layer's cached stage outputs and decode step counter."""

    stage_cache: list[list[StageOutput | None]]
    decode_steps: list[int]
    refreshes: list[int] = field(default_factory=list)  # stage recomputations in decode, per stage


def assemble_keys(final: StageOutput, last_position: torch.Tensor, window_start: torch.Tensor, sink: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted key tokens of each block: sink + selected (below window_start) + window [window_start, e].

    -> (key_tokens [M, K] int64, padding rows point at token 0; key_counts [M] int64)
    """
    device = last_position.device
    e = last_position[:, None]
    sink_tok = torch.arange(sink, device=device)[None, :].expand(e.shape[0], -1)
    sink_ok = sink_tok <= e
    offsets = torch.arange(final.chunk_size, device=device)
    sel_tok = (final.chunk_starts[:, :, None] + offsets).flatten(1)
    sel_ok = ((offsets < final.chunk_lens[:, :, None]).flatten(1)) & (sel_tok < window_start[:, None])
    width = max(0, int((last_position + 1 - window_start).max()))
    win_tok = window_start[:, None] + torch.arange(width, device=device)
    win_ok = win_tok <= e
    tokens = torch.cat([sink_tok, sel_tok, win_tok], dim=1)
    ok = torch.cat([sink_ok, sel_ok, win_ok], dim=1)
    big = torch.iinfo(torch.int64).max
    tokens = torch.where(ok, tokens, big).sort(dim=1).values
    counts = ok.sum(1)
    tokens = tokens[:, : int(counts.max())]
    return torch.where(tokens == big, 0, tokens), counts


class InfiniteHiPAttention(AttentionMethod):
    name = "infinitehip"

    def __init__(self, model_config: ModelConfig, config: InfiniteHiPConfig | None = None):
        super().__init__(model_config)
        self.config = config or PRESETS["3k"]
        self.trained_len = model_config.max_position_embeddings
        self.sm_scale = model_config.head_dim ** -0.5
        self.saliency = KeySaliency(self.config.landmark_window) if self.config.representative == "landmark" else None

    def default_max_context_tokens(self) -> int:
        return 1 << 17

    def new_state(self) -> InfiniteHiPState:
        L, S = self.model_config.num_layers, self.config.num_stages
        return InfiniteHiPState([[None] * S for _ in range(L)], [0] * L, [0] * S)

    def _impl(self, x: torch.Tensor) -> str:
        if self.config.impl == "auto":
            return "triton" if x.is_cuda else "reference"
        return self.config.impl

    def _attention_impl(self, x: torch.Tensor) -> str:
        """Sparse attention: Triton on CUDA; on CPU the batched-SDPA path ("auto") or the eager oracle."""
        if self.config.impl == "auto":
            return "triton" if x.is_cuda else "sdpa"
        return self.config.impl

    def _specs(self, layer: int, decode: bool) -> list[StageSpec]:
        c = self.config
        return [
            StageSpec(1 if decode else c.query_block_sizes[i], c.chunk_sizes[i], c.keep_tokens_for(layer, i), c.pruning_rope_for(layer),
                      c.head_aggregation)
            for i in range(c.num_stages)
        ]

    def _stage(self, spec, blocks, parent, layer, seq: SequenceSlice, batch: ForwardBatch) -> StageOutput:
        c = self.config
        return run_stage(spec, blocks, parent, seq.cache.flat_k(layer), seq.page_table, seq.cache.page_size,
                         c.sink_tokens, c.stream_tokens, batch.rope, seq.context_len, self.trained_len, self._impl(blocks.q),
                         None if self.saliency is None else (self.saliency, layer))

    def _update_saliency(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> None:
        if self.saliency is not None:
            self.saliency.update(layer, q, seq.start_pos, seq.page_table, seq.cache, batch.rope)

    def _keeps_every_key(self, layer: int, context_len: int) -> bool:
        """Every query of a chunk ending at context_len attends every earlier key, at its original position."""
        c = self.config
        original_positions = c.attention_rope in ("streaming", "none") or (
            c.attention_rope == "dynamic" and context_len <= self.trained_len)
        candidates = context_len - c.sink_tokens - c.stream_tokens
        return original_positions and candidates <= c.keep_tokens_for(layer, c.num_stages - 1)

    # ---- prefill ----------------------------------------------------------------------------------------
    def prefill(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> torch.Tensor:
        c = self.config
        self._update_saliency(layer, q, seq, batch)
        if c.dense_when_unpruned and self._keeps_every_key(layer, seq.context_len):
            batch.rope.ensure(seq.context_len)
            k, v = seq.cache.read(layer, seq.context_slots)
            return causal_sdpa(batch.rope.apply_range(q, seq.start_pos), batch.rope.apply_range(k, 0), v, seq.start_pos)
        parent, blocks = None, None
        for spec in self._specs(layer, decode=False):
            blocks = query_blocks(q, seq.start_pos, spec.query_block_size)
            if parent is not None:  # child block m reads the candidates of the parent block containing it
                rows = torch.arange(blocks.q.shape[0], device=q.device) * spec.query_block_size
                parent = parent.for_blocks(rows // parent.query_block_size)
            parent = self._stage(spec, blocks, parent, layer, seq, batch)
        window_start = sparse_limit(blocks.last_position, c.sink_tokens, c.stream_tokens)
        return self._attend_prefill(layer, q, seq, batch, parent, blocks, window_start)

    def _attend_prefill(self, layer, q, seq, batch, final: StageOutput, blocks: QueryBlocks, window_start) -> torch.Tensor:
        key_tokens, key_counts = assemble_keys(final, blocks.last_position, window_start, self.config.sink_tokens)
        query_pos = torch.arange(seq.start_pos, seq.context_len, device=q.device)
        query_block = torch.arange(q.shape[0], device=q.device) // blocks.size
        key_rope, query_rope = attention_positions(self.config.attention_rope, key_tokens, key_counts, window_start,
                                                   query_pos, query_block, seq.context_len, self.trained_len)
        batch.rope.ensure(max(int(key_rope.max()), int(query_rope.max())) + 1)
        return sparse_attention_prefill(
            q, seq.cache.flat_k(layer), seq.cache.flat_v(layer), seq.page_table, seq.cache.page_size,
            key_tokens.int(), key_counts.int(), key_rope, query_pos.int(), query_rope, blocks.size,
            batch.rope.cos, batch.rope.sin, self.sm_scale, impl=self._attention_impl(q),
        )

    # ---- decode -----------------------------------------------------------------------------------------
    def decode(self, layer: int, q: torch.Tensor, seqs: list[SequenceSlice], batch: ForwardBatch) -> torch.Tensor:
        c = self.config
        lists, counts, key_ropes, query_ropes = [], [], [], []
        for i, seq in enumerate(seqs):
            state: InfiniteHiPState = seq.state
            self._update_saliency(layer, q[i : i + 1], seq, batch)
            step = state.decode_steps[layer]
            blocks = query_blocks(q[i : i + 1], seq.start_pos, 1)
            parent = None
            for s, spec in enumerate(self._specs(layer, decode=True)):
                cached = state.stage_cache[layer][s]
                if cached is None or step % c.refresh_intervals[s] == 0:
                    cached = self._stage(spec, blocks, parent, layer, seq, batch)
                    state.stage_cache[layer][s] = cached
                    state.refreshes[s] += 1
                parent = cached
            state.decode_steps[layer] += 1
            # The oldest cached stage bounds what was selectable; the window reaches back to it.
            window_start = torch.stack([o.limit for o in state.stage_cache[layer]]).amin(0)
            tokens, count = assemble_keys(parent, blocks.last_position, window_start, c.sink_tokens)
            key_rope, query_rope = attention_positions(c.attention_rope, tokens, count, window_start, blocks.positions[0],
                                                       torch.zeros(1, dtype=torch.long, device=q.device), seq.context_len, self.trained_len)
            lists.append(tokens[0])
            counts.append(count)
            key_ropes.append(key_rope[0])
            query_ropes.append(query_rope)
        K = max(t.numel() for t in lists)
        pad = lambda t: torch.nn.functional.pad(t, (0, K - t.numel()))
        key_tokens = torch.stack([pad(t) for t in lists]).int()
        key_rope = torch.stack([pad(t) for t in key_ropes]).int()
        P = max(s.page_table.numel() for s in seqs)
        page_tables = torch.stack([torch.nn.functional.pad(s.page_table, (0, P - s.page_table.numel())) for s in seqs])
        batch.rope.ensure(int(key_rope.max()) + 1)
        return sparse_attention_decode(
            q, seqs[0].cache.flat_k(layer), seqs[0].cache.flat_v(layer), page_tables, seqs[0].cache.page_size,
            key_tokens, torch.cat(counts).int(), key_rope, torch.cat(query_ropes).int(), batch.rope.cos, batch.rope.sin,
            self.sm_scale, impl=self._attention_impl(q),
        )

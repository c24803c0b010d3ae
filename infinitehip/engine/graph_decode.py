"""Decode steps of one sequence replayed from CUDA graphs: the whole model (every layer's projections, attention
method and MLP, plus the logits) as one launch.

A method opts in by declaring `attention/capabilities.GraphDecode` (its `graph_key`): its decode reads the step's
position and page table from device tensors (`ForwardBatch.decode_positions` / `decode_page_tables`) and its shapes
depend only on `ForwardBatch.decode_capacity`, so a graph captured once replays at any later position. Graphs are kept per
(sequence, capacity bucket, method key): capacity buckets double (a graph sized for 2^k tokens serves every
context up to it) and the method key tells which of its stages refresh at this step (paper Alg. 4).

The step whose graph is missing runs eagerly on the same static buffers (its real effects: cache write, stage
refreshes, saliency), then the graph is captured without executing (host counters restored afterwards), so
Triton kernels are compiled before capture and no step is computed twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from infinitehip.attention.base import AttentionMethod, ForwardBatch, SequenceSlice
from infinitehip.attention.capabilities import GraphDecode, supports
from infinitehip.graph_recorders import ClosureRecorder, CudaGraphRecorder
from infinitehip.kv.paged_cache import PagedKVCache
from infinitehip.model.loading import Decoder
from infinitehip.model.rope import RotaryEmbedding
from infinitehip.profiling import graph_replay


def capacity_bucket(context_len: int, min_bucket: int, max_bucket: int) -> int:
    """Smallest power of two >= context_len (and >= min_bucket), capped at max_bucket."""
    bucket = max(min_bucket, 1 << max(0, context_len - 1).bit_length())
    return min(bucket, max_bucket)


@dataclass
class _CapturedStep:
    recorder: CudaGraphRecorder | ClosureRecorder
    counters: Any  # the method's host counters when captured (what the captured Python saw)


class GraphDecoder:
    """One decode token of one sequence per step, replayed from a CUDA graph when the method allows it."""

    def __init__(self, model: Decoder, cache: PagedKVCache, rope: RotaryEmbedding, method: AttentionMethod,
                 max_context_tokens: int, min_bucket: int = 4096, recorder: type = CudaGraphRecorder,
                 attention: Callable | None = None):
        """attention: the decoder's layer callable (`attention/common/hybrid.LayerRouter`); default: the method itself."""
        self.model, self.cache, self.rope, self.method = model, cache, rope, method
        self.attention = attention or method
        self.max_bucket = max(min_bucket, -(-max_context_tokens // cache.page_size) * cache.page_size)
        self.min_bucket = min(min_bucket, self.max_bucket)
        device = cache.device
        # Static inputs and output every graph reads / writes.
        self.input_ids = torch.zeros(1, dtype=torch.long, device=device)
        self.positions = torch.zeros(1, dtype=torch.long, device=device)
        self.page_table = torch.zeros(1, -(-self.max_bucket // cache.page_size), dtype=torch.int32, device=device)
        self.recorder = recorder
        # Per sequence: its graphs and their memory pool (a pool dies with its last graph, so it is not reused).
        self._seqs: dict[int, dict[tuple, _CapturedStep]] = {}
        self._pools: dict[int, Any] = {}
        self._rope_ptr = None
        self.captures = self.replays = 0

    def key(self, seq: SequenceSlice) -> tuple | None:
        if not supports(self.method, GraphDecode):  # every step eager
            return None
        method_key = self.method.graph_key(seq)
        if method_key is None:
            return None
        return capacity_bucket(seq.context_len, self.min_bucket, self.max_bucket), method_key

    def reserve_rope(self, context_len: int) -> None:
        """Grow the RoPE tables now to what decoding a `context_len`-token sequence reads (its capacity bucket): run
        before a prompt's last chunk, whose short-chunk graphs (attention/methods/infinitehip/short_chunk_graphs.py) would
        otherwise be invalidated by the first decode step's growth and captured again by the next question."""
        bucket = capacity_bucket(context_len, self.min_bucket, self.max_bucket)
        reads = self.method.decode_rope_positions(bucket) if supports(self.method, GraphDecode) else bucket
        self.rope.ensure(reads)

    def release(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)
        self._pools.pop(seq_id, None)

    def _batch(self, seq: SequenceSlice, bucket: int) -> ForwardBatch:
        batch = ForwardBatch([seq], self.cache, self.rope, 1)
        pages = bucket // self.cache.page_size
        # The graph's inputs: static buffers instead of tensors built from host ints (see ForwardBatch).
        batch.__dict__.update(decode_positions=self.positions, decode_page_tables=self.page_table[:, :pages],
                              decode_capacity=bucket)
        return batch

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        ps = self.cache.page_size
        table = batch.decode_page_tables[0]
        batch.__dict__["new_slots"] = table[self.positions // ps].long() * ps + self.positions % ps
        hidden = self.model(self.input_ids, lambda layer, q, k, v: self.attention(layer, q, k, v, batch))
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def step(self, seq: SequenceSlice, token_id: int | None, key: tuple) -> torch.Tensor:
        """Run the decode token `token_id` of `seq` (its slice for this step); -> logits [1, vocab]. token_id None:
        the token is already in `input_ids` (written on the GPU by the step before, engine/decode_ahead.py)."""
        bucket, method_key = key
        if token_id is not None:
            self.input_ids.fill_(token_id)
        self.positions.fill_(seq.start_pos)
        n = seq.page_table.numel()
        self.page_table[0, :n].copy_(seq.page_table)
        if self._rope_ptr != self.rope.cos.data_ptr():  # tables regrown: every captured graph reads freed memory
            self._seqs.clear()
            self._pools.clear()
            self._rope_ptr = self.rope.cos.data_ptr()
        graphs = self._seqs.setdefault(seq.seq_id, {})
        captured = graphs.get(key)
        state = seq.state
        if captured is not None:
            now = self.method.host_counters(state)
            self.method.set_host_counters(state, captured.counters)
            with graph_replay(key, self.cache.device):
                logits = captured.recorder.replay()
            self.method.set_host_counters(state, now)
            self.method.advance_host_counters(state, method_key)
            self.replays += 1
            return logits
        # First step with this key: run it for real on the static buffers, then capture it for the next ones
        # (a CUDA capture records without executing; the host counters its Python advances are put back).
        before = self.method.host_counters(state)
        logits = self._forward(self._batch(seq, bucket))
        if self._rope_ptr != self.rope.cos.data_ptr():  # the eager step grew the tables to cover the bucket
            self._seqs.clear()
            self._pools.clear()
            self._rope_ptr = self.rope.cos.data_ptr()
            graphs = self._seqs.setdefault(seq.seq_id, {})
        after = self.method.host_counters(state)
        self.method.set_host_counters(state, before)
        if seq.seq_id not in self._pools:
            self._pools[seq.seq_id] = torch.cuda.graph_pool_handle() if self.recorder is CudaGraphRecorder else None
        recorder = self.recorder(self._pools[seq.seq_id])
        recorder.capture(lambda: self._forward(self._batch(seq, bucket)))
        self.method.set_host_counters(state, after)
        graphs[key] = _CapturedStep(recorder, before)
        for old in [k for k in graphs if k[0] < bucket]:  # a sequence only grows: smaller buckets never return
            del graphs[old]
        self.captures += 1
        return logits

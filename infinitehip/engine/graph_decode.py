"""Decode steps replayed from CUDA graphs: the whole model (every layer's projections, attention method and MLP,
plus the logits) as one launch, for one sequence or several decoding together.

A method opts in by declaring `attention/capabilities.GraphDecode` (its `graph_key`): its decode reads the step's
position and page table from device tensors (`ForwardBatch.decode_positions` / `decode_page_tables`) and its shapes
depend only on `ForwardBatch.decode_capacity`, so a graph captured once replays at any later position. Graphs are kept per
composition (the step's sequences in batch order), capacity bucket and method key(s): capacity buckets double (a
graph sized for 2^k tokens serves every context up to it) and the method key tells which of its stages refresh at
this step (paper Alg. 4). Sequences whose method keys share a batch class decode in one graph keyed by
`GraphDecode.graph_batch_key` of their keys (infinitehip: which stages any of them refreshes); what differs per
sequence (each keeps its own refresh phase, so its tokens are those it decodes alone) is read from a static buffer
of per-sequence flags written before the replay (`GraphDecode.graph_row_flags`). How a method's sequences of one
class batch: `GraphDecode.graph_batching`.

The step whose graph is missing runs eagerly on the same static buffers (its real effects: cache write, stage
refreshes, saliency), then the graph is captured without executing (host counters restored afterwards), so
Triton kernels are compiled before capture and no step is computed twice.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch

from infinitehip.attention.base import AttentionMethod, ForwardBatch, SequenceSlice
from infinitehip.attention.capabilities import GraphDecode, supports
from infinitehip.graph_recorders import ClosureRecorder, CudaGraphRecorder
from infinitehip.host_values import device_tensor
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
    counters: list  # each sequence's host counters when captured (what the captured Python saw)


class GraphDecoder:
    """Decode steps (one token per sequence) replayed from CUDA graphs when the method allows it: one sequence's,
    or several sequences' in one graph (a batch reads the weights once for all)."""

    def __init__(self, model: Decoder, cache: PagedKVCache, rope: RotaryEmbedding, method: AttentionMethod,
                 max_context_tokens: int, min_bucket: int = 4096, recorder: type = CudaGraphRecorder,
                 attention: Callable | None = None, max_num_seqs: int = 1, max_batch_compositions: int | None = None,
                 max_graphs_per_composition: int = 128):
        """attention: the decoder's layer callable (`attention/common/hybrid.LayerRouter`); default: the method itself.
        max_batch_compositions: sets of several sequences whose graphs are kept (the least recently used set's go);
        default 4 x max_num_seqs: the groups of a step's keys follow the sequences' refresh phases, which cycle.
        max_graphs_per_composition: graphs kept for one composition (the least recently replayed goes): a batch's
        key is its method's `graph_batch_key` (at worst the tuple of its sequences' keys, which cycle with their
        refresh phases)."""
        self.model, self.cache, self.rope, self.method = model, cache, rope, method
        self.attention = attention or method
        self.max_bucket = max(min_bucket, -(-max_context_tokens // cache.page_size) * cache.page_size)
        self.min_bucket = min(min_bucket, self.max_bucket)
        device = cache.device
        # Static inputs and output every graph reads / writes; a batch of N uses their first N rows.
        self.input_ids = torch.zeros(max_num_seqs, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_num_seqs, dtype=torch.long, device=device)
        self.page_table = torch.zeros(max_num_seqs, -(-self.max_bucket // cache.page_size), dtype=torch.int32,
                                      device=device)
        self.flags: torch.Tensor | None = None  # [max_num_seqs, F] bool each row's graph_row_flags (made once)
        self.recorder = recorder
        self.max_batch_compositions = max_batch_compositions or 4 * max_num_seqs
        self.max_graphs_per_composition = max_graphs_per_composition
        # Per composition (the step's sequence ids, in batch order: a graph holds pointers to each one's state and
        # its batch row): its graphs and their memory pool (a pool dies with its last graph, so it is not reused).
        self._graphs: OrderedDict[tuple[int, ...], dict[tuple, _CapturedStep]] = OrderedDict()
        self._pools: dict[tuple[int, ...], Any] = {}
        self._rope_ptr = None
        self.captures = self.replays = 0
        self.batch_replays = 0  # replays of graphs of several sequences

    def key(self, seq: SequenceSlice) -> tuple | None:
        if not supports(self.method, GraphDecode):  # every step eager
            return None
        method_key = self.method.graph_key(seq)
        if method_key is None:
            return None
        return capacity_bucket(seq.context_len, self.min_bucket, self.max_bucket), method_key

    def batch_key(self, keys: list[tuple]) -> tuple:
        """The graph key of several sequences decoding together (their keys from `key`, one batch class): the largest
        bucket (every shape is sized for it) and the method's key of their method keys (`graph_batch_key`)."""
        classes = {self.method.graph_batch_class(k[1]) for k in keys}
        if len(classes) != 1:
            raise ValueError(f"sequences of one graph share a batch class, not {sorted(map(repr, classes))}")
        return max(k[0] for k in keys), self.method.graph_batch_key([k[1] for k in keys])

    def reserve_rope(self, context_len: int) -> None:
        """Grow the RoPE tables now to what decoding a `context_len`-token sequence reads (its capacity bucket): run
        before a prompt's last chunk, whose short-chunk graphs (attention/methods/infinitehip/short_chunk_graphs.py) would
        otherwise be invalidated by the first decode step's growth and captured again by the next question."""
        bucket = capacity_bucket(context_len, self.min_bucket, self.max_bucket)
        reads = self.method.decode_rope_positions(bucket) if supports(self.method, GraphDecode) else bucket
        self.rope.ensure(reads)

    def release(self, seq_id: int) -> None:
        """The sequence is gone: every graph of a composition holding it goes too (its state is freed)."""
        for ids in [ids for ids in self._graphs if seq_id in ids]:
            self._drop(ids)

    def graphs_of(self, seq_id: int) -> dict[tuple, _CapturedStep]:
        """The graphs of the sequence decoding alone (bucket, method key) -> captured step."""
        return self._graphs.get((seq_id,), {})

    def _drop(self, ids: tuple[int, ...]) -> None:
        self._graphs.pop(ids, None)
        self._pools.pop(ids, None)

    def _drop_all(self) -> None:
        self._graphs.clear()
        self._pools.clear()

    def _batch(self, seqs: list[SequenceSlice], bucket: int) -> ForwardBatch:
        n = len(seqs)
        batch = ForwardBatch(seqs, self.cache, self.rope, n)
        pages = bucket // self.cache.page_size
        # The graph's inputs: static buffers instead of tensors built from host ints (see ForwardBatch).
        batch.__dict__.update(decode_positions=self.positions[:n], decode_page_tables=self.page_table[:n, :pages],
                              decode_capacity=bucket, decode_flags=None if self.flags is None or n == 1 else self.flags[:n])
        return batch

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        ps, n = self.cache.page_size, len(batch.slices)
        positions = self.positions[:n]
        page = batch.decode_page_tables.gather(1, (positions // ps)[:, None])[:, 0]  # [N] page of each new token
        batch.__dict__["new_slots"] = page.long() * ps + positions % ps
        hidden = self.model(self.input_ids[:n], lambda layer, q, k, v: self.attention(layer, q, k, v, batch))
        return self.model.compute_logits(hidden)

    def _write_flags(self, own_keys: list) -> None:
        flags = [tuple(self.method.graph_row_flags(k)) for k in own_keys]
        if not flags[0]:
            return
        if self.flags is None or self.flags.shape[1] != len(flags[0]):  # made once: graphs hold the pointer
            self._drop_all()
            self.flags = torch.zeros(self.input_ids.shape[0], len(flags[0]), dtype=torch.bool,
                                     device=self.input_ids.device)
        self.flags[: len(flags)].copy_(device_tensor(flags, torch.bool, self.flags.device))  # [N, F]

    def _counters(self, seqs: list[SequenceSlice]) -> list:
        return [self.method.host_counters(s.state) for s in seqs]

    def _set_counters(self, seqs: list[SequenceSlice], counters: list) -> None:
        for s, c in zip(seqs, counters):
            self.method.set_host_counters(s.state, c)

    @torch.inference_mode()
    def step(self, seqs: list[SequenceSlice], token_ids: list[int] | None, key: tuple,
             own_keys: list | None = None) -> torch.Tensor:
        """Run the decode tokens `token_ids` of `seqs` (their slices for this step, in batch order) under the graph
        key `key` (`key` of one sequence, `batch_key` of several; own_keys: then each one's method key, default the
        key's tuple); -> logits [N, vocab], valid until the graph's next replay. token_ids None: the tokens are already
        in `input_ids` (written on the GPU by the step before, engine/decode_ahead.py)."""
        bucket, method_key = key
        n = len(seqs)
        own_keys = own_keys or ([method_key] if n == 1 else list(method_key))
        if n > 1:
            self._write_flags(own_keys)
        if n == 1:  # host ints as kernel arguments: no copy to stage
            if token_ids is not None:
                self.input_ids[:1].fill_(token_ids[0])
            self.positions[:1].fill_(seqs[0].start_pos)
        else:
            if token_ids is not None:
                self.input_ids[:n].copy_(device_tensor(token_ids, torch.long, self.cache.device))
            self.positions[:n].copy_(device_tensor([s.start_pos for s in seqs], torch.long, self.cache.device))
        for i, s in enumerate(seqs):
            self.page_table[i, : s.page_table.numel()].copy_(s.page_table)
        if self._rope_ptr != self.rope.cos.data_ptr():  # tables regrown: every captured graph reads freed memory
            self._drop_all()
            self._rope_ptr = self.rope.cos.data_ptr()
        ids = tuple(s.seq_id for s in seqs)
        graphs = self._graphs.setdefault(ids, {})
        self._graphs.move_to_end(ids)
        captured = graphs.pop(key, None)
        if captured is not None:
            graphs[key] = captured  # the most recently replayed last
            now = self._counters(seqs)
            self._set_counters(seqs, captured.counters)
            with graph_replay(key, self.cache.device):
                logits = captured.recorder.replay()
            self._set_counters(seqs, now)
            for s, own in zip(seqs, own_keys):  # each sequence's own step
                self.method.advance_host_counters(s.state, own)
            if n > 1:
                self.method.after_batch_replay(seqs, own_keys)
            self.replays += 1
            self.batch_replays += n > 1
            return logits
        # First step with this key: run it for real on the static buffers, then capture it for the next ones
        # (a CUDA capture records without executing; the host counters its Python advances are put back).
        before = self._counters(seqs)
        logits = self._forward(self._batch(seqs, bucket))
        if self._rope_ptr != self.rope.cos.data_ptr():  # the eager step grew the tables to cover the bucket
            self._drop_all()
            self._rope_ptr = self.rope.cos.data_ptr()
            graphs = self._graphs.setdefault(ids, {})
        after = self._counters(seqs)
        self._set_counters(seqs, before)
        if ids not in self._pools:
            self._pools[ids] = torch.cuda.graph_pool_handle() if self.recorder is CudaGraphRecorder else None
        recorder = self.recorder(self._pools[ids])
        recorder.capture(lambda: self._forward(self._batch(seqs, bucket)))
        self._set_counters(seqs, after)
        graphs[key] = _CapturedStep(recorder, before)
        while len(graphs) > self.max_graphs_per_composition:  # the least recently replayed first (insertion order)
            del graphs[next(iter(graphs))]
        for old in [k for k in graphs if k[0] < bucket]:  # sequences only grow: smaller buckets never return
            del graphs[old]
        batches = [c for c in self._graphs if len(c) > 1]
        for old in batches[: max(0, len(batches) - self.max_batch_compositions)]:  # least recently used first
            self._drop(old)
        self.captures += 1
        return logits

"""CUDA graphs of `short_chunk.short_chunk_attention`: per chunk shape, one graph per layer, replayed by every later
question of that shape (questions on one cached document share the chunk's start).

The first chunk of a shape runs each layer eagerly (its result is this request's; the Triton kernels compile) and
then captures it; later chunks copy their inputs into the static buffers and replay. The graphs of a shape share one
memory pool (layers replay in capture order, so a layer reuses the dead intermediates of the one before); the last
`keep` shapes are kept.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from infinitehip.attention.methods.infinitehip.pruning import host_limit
from infinitehip.attention.methods.infinitehip.short_chunk import (ShortChunk, ShortChunkInputs, pad_rows, padded, qualifies,
                                                          question_bounds, short_chunk_attention)
from infinitehip.attention.common.repeated_text import repeated_candidates
from infinitehip.graph_recorders import ClosureRecorder, CudaGraphRecorder
from infinitehip.kv.paged_cache import is_offloaded

Outputs = tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]


@dataclass
class _Shape:
    inputs: ShortChunkInputs
    pool: tuple | None
    recorders: dict[int, CudaGraphRecorder | ClosureRecorder] = field(default_factory=dict)


class ShortChunkGraphs:
    """recorder: CudaGraphRecorder (CUDA tensors and Triton kernels only), or ClosureRecorder (graph semantics on
    the CPU, for tests)."""

    def __init__(self, keep: int = 2, recorder: type = CudaGraphRecorder):
        self.keep, self.recorder = keep, recorder
        self._shapes: OrderedDict[tuple, _Shape] = OrderedDict()
        # A failed capture can leave the allocator recording to its pool (PyTorch: "already recording to
        # mempool_id" at the next capture): after one, this engine captures no more and runs the static work eagerly.
        self.failed = False

    def usable(self, q: torch.Tensor, impl: str) -> bool:
        return not self.failed and (self.recorder is not CudaGraphRecorder or (q.is_cuda and impl == "triton"))

    def run(self, key: tuple, layer: int, make_inputs: Callable[[], ShortChunkInputs],
            fill: Callable[[ShortChunkInputs], None], work: Callable[[ShortChunkInputs], Outputs]) -> Outputs:
        """key: everything the captured work's addresses and shapes depend on; make_inputs: new static buffers;
        fill: copies this chunk's inputs into them; work: the layer's computation on them. The outputs of a replay
        are the graph's own tensors, overwritten by the next replay of that layer: the caller copies what it keeps."""
        shape = self._shapes.get(key)
        if shape is None:
            pool = torch.cuda.graph_pool_handle() if self.recorder is CudaGraphRecorder else None
            shape = self._shapes[key] = _Shape(make_inputs(), pool)
            while len(self._shapes) > self.keep:
                self._shapes.popitem(last=False)
        self._shapes.move_to_end(key)
        fill(shape.inputs)
        recorder = shape.recorders.get(layer)
        if recorder is not None:
            return recorder.replay()
        result = work(shape.inputs)  # eager: this chunk's result, and every kernel compiled before the capture
        if self.failed:
            return result
        recorder = self.recorder(shape.pool)
        try:
            recorder.capture(lambda: work(shape.inputs))
        except RuntimeError as e:  # an op that cannot be captured: say so once, keep the (correct) eager path
            warnings.warn(f"short-chunk CUDA graph of layer {layer} not captured ({e}); short chunks run eagerly")
            self.failed = True
            self._shapes.clear()
            return result
        shape.recorders[layer] = recorder
        return result


def prefill_short_chunk(method, layer: int, q: torch.Tensor, seq, batch) -> torch.Tensor | None:
    """InfiniteHiP's prefill of a short prompt-ending chunk with static shapes (config.short_chunk_graphs): CUDA
    graphs on a GPU, the same work eagerly elsewhere -> [n, H, d], or None where the chunk does not qualify (the
    eager prefill runs). The question-time chunks go to the sequence's state as the eager prefill leaves them."""
    c, n = method.config, q.shape[0]
    if not (c.short_chunk_graphs and seq.ends_prompt and seq.probe is None and method.parallel is None
            and method.saliency is not None and not is_offloaded(seq.cache)):
        return None
    chunk = ShortChunk(seq.start_pos, c.query_block_sizes[0])
    if not qualifies(c, chunk, n) or method._keeps_every_key(layer, seq.start_pos + c.question_tokens):
        return None
    state = seq.state
    state.recent_q[layer] = q[-c.question_tokens :].clone()  # as the eager prefill keeps them (n >= question_tokens)
    novel = method.prompt_novel(seq, q.device)
    _, bound = question_bounds(c, chunk)
    repeated = repeated_candidates(seq.text, c.repeat_span, c.sink_tokens, bound, q.device)
    stage1 = -(-(host_limit(chunk.last_bound, c.sink_tokens, c.stream_tokens) - c.sink_tokens) // c.chunk_sizes[0])
    pages = -(-(chunk.last_bound + 1) // seq.cache.page_size)
    # every RoPE position the work reads (positions, chunk ranks, key-list ranks) up front: a table grown inside the
    # first run would move under the key
    reach = c.sink_tokens + c.stream_tokens + c.keep_tokens[0] + c.question_keep_tokens
    batch.rope.ensure(chunk.last_bound + 1 + reach)
    impl = method._impl(q)

    def make_inputs() -> ShortChunkInputs:
        mask = lambda m, width: None if m is None else torch.empty(width, dtype=torch.bool, device=q.device)
        return ShortChunkInputs(torch.empty(chunk.rows, *q.shape[1:], dtype=q.dtype, device=q.device),
                                torch.empty(1, dtype=torch.long, device=q.device),
                                torch.empty(pages, dtype=torch.int32, device=q.device),
                                mask(novel, stage1), mask(repeated, bound - c.sink_tokens))

    def fill(x: ShortChunkInputs) -> None:
        x.q.copy_(pad_rows(q, chunk.rows))
        x.n.fill_(n)
        x.page_table.copy_(F.pad(seq.page_table[:pages], (0, pages - min(pages, seq.page_table.numel()))))
        for buffer, value, pad in ((x.novel, novel, True), (x.repeated, repeated, False)):
            if buffer is not None:
                buffer.copy_(padded(value, buffer.numel(), pad))

    def work(x: ShortChunkInputs):
        return short_chunk_attention(method, layer, x, chunk, seq.cache, batch.rope, impl)

    if method.short_graphs.usable(q, impl):
        # one key for every layer of the chunk shape: what the captured work's shapes and addresses depend on
        key = (chunk, q.dtype, tuple(q.shape[1:]), seq.cache.flat_k(0).data_ptr(), seq.cache.num_slots,
               batch.rope.cos.data_ptr(), novel is None, repeated is None)
        out, (starts, lens) = method.short_graphs.run(key, layer, make_inputs, fill, work)
    else:
        x = make_inputs()
        fill(x)
        out, (starts, lens) = work(x)
    state.question[layer] = (starts.clone(), lens.clone())
    return out[:n].clone()

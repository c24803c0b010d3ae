"""Benchmark-only instrumentation of the engine, in one place: each wraps or replaces a product function for the
length of a run (the product has no hook for these; nothing in the package calls this module). Per-phase prefill
times are the product's own (`infinitehip.profiling.record_phases`), not a patch.

- use_fast_prefill: the prefill's sparse attention output replaced by zeros, K/V and saliency written as usual
  (decode timing at contexts whose real prefill would take most of a device session; random weights only);
- time_graph_replays: CUDA events around every CUDA-graph replay;
- time_calls: the synchronised wall time of each call of a function;
- record_calls: the arguments of a module function's calls (to time a kernel alone with its real inputs).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from bench.common.timing import sync


def use_fast_prefill() -> None:
    """Prefill writes K/V and saliency as usual; its attention output is zeros (see --fast-prefill)."""
    from infinitehip.attention.infinitehip.method import InfiniteHiPAttention

    def prefill(self, layer, q, seq, batch):
        self._update_saliency(layer, q, seq, batch)
        self._question_prefill(layer, q, seq, batch)  # question-time selection (if on) scans the store as usual
        return torch.zeros_like(q)

    InfiniteHiPAttention.prefill = prefill


def time_graph_replays() -> list:
    """From now on, every CUDA-graph replay is bracketed by CUDA events: [(start, end, graph key), ...] (GPU time
    per replay; the key (capacity bucket, method key) says e.g. which stages the step refreshed)."""
    events, current = [], [None]
    from infinitehip.engine.graph_decode import CudaGraphRecorder, GraphDecoder

    plain, plain_step = CudaGraphRecorder.replay, GraphDecoder.step

    def replay(self):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = plain(self)
        end.record()
        events.append((start, end, current[0]))
        return out

    def step(self, seq, token_id, key):
        current[0] = key
        return plain_step(self, seq, token_id, key)

    CudaGraphRecorder.replay, CudaGraphRecorder._plain_replay = replay, plain
    GraphDecoder.step, GraphDecoder._plain_step = step, plain_step
    return events


def untime_graph_replays() -> None:
    from infinitehip.engine.graph_decode import CudaGraphRecorder, GraphDecoder

    CudaGraphRecorder.replay = CudaGraphRecorder._plain_replay
    GraphDecoder.step = GraphDecoder._plain_step


@contextlib.contextmanager
def record_calls(module: Any, name: str):
    """Temporarily wrap module.name to record its (args, kwargs); yields (calls, original)."""
    original = getattr(module, name)
    calls: list[tuple[tuple, dict]] = []

    def recorder(*args, **kwargs):
        calls.append((args, kwargs))
        return original(*args, **kwargs)

    setattr(module, name, recorder)
    try:
        yield calls, original
    finally:
        setattr(module, name, original)


def time_calls(owner: Any, name: str, device: torch.device, seconds: list[float]) -> None:
    """From now on, append the synchronised wall time of every owner.name call to `seconds`."""
    inner = getattr(owner, name)

    def timed(*args, **kwargs):
        sync(device)
        start = time.perf_counter()
        out = inner(*args, **kwargs)
        sync(device)
        seconds.append(time.perf_counter() - start)
        return out

    setattr(owner, name, timed)

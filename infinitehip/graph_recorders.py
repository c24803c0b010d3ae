"""Recording a function into a CUDA graph, and its CPU stand-in for tests: what the engine's decode graphs
(engine/graph_decode.py) and the short prompt-ending chunk's graphs (attention/methods/infinitehip/short_chunk_graphs.py)
capture with. Below the attention methods and the engine, so both can use it."""

from __future__ import annotations

from typing import Callable

import torch


class CudaGraphRecorder:
    """Captures a step function into a CUDA graph; replay() re-launches it and returns its output buffer."""

    def __init__(self, pool):
        self.pool, self.graph, self.out = pool, None, None

    def capture(self, fn: Callable[[], torch.Tensor]) -> None:
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.pool):
            self.out = fn()

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.out


class ClosureRecorder:
    """CPU stand-in with a graph's semantics for tests: replay() re-runs the closure built at capture time, so
    any host value captured then (positions, page-table sizes, refresh pattern) is reused, as a graph would."""

    def __init__(self, pool=None):
        self.fn = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> None:
        self.fn = fn

    def replay(self) -> torch.Tensor:
        return self.fn()

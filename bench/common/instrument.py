"""Benchmark-only instrumentation of the engine, in one place: each wraps or replaces a product function for the
length of a run (the product has no hook for these; nothing in the package calls this module). Per-phase prefill
times, call counts and CUDA-graph replay times are the product's own (`infinitehip.profiling`), not patches.

- use_fast_prefill: the prefill's sparse attention output replaced by zeros, K/V and saliency written as usual
  (decode timing at contexts whose real prefill would take most of a device session; random weights only);
- record_calls: the arguments of a module function's calls (to time a kernel alone with its real inputs).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch



def use_fast_prefill() -> None:
    """Prefill writes K/V and saliency as usual; its attention output is zeros (see --fast-prefill)."""
    from infinitehip.attention.methods.infinitehip.method import InfiniteHiPAttention

    def prefill(self, layer, q, seq, batch):
        self._update_saliency(layer, q, seq, batch)
        self._question_prefill(layer, q, seq, batch)  # question-time selection (if on) scans the store as usual
        self.prompt_novel(seq, q.device)  # the repeat mask decode reads (hierarchy_repeat_span)
        return torch.zeros_like(q)

    InfiniteHiPAttention.prefill = prefill


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

"""Named phases of the forward pass (pruning stages, block-sparse attention, saliency, offload resolves...), timed
on request: `record_phases(device)` starts summing the synchronised wall time of every call of a function marked
`@phase("name")` into a dict, `stop_recording()` ends it. Off by default: a marked call then costs one
global lookup. Benchmarks read it for their per-phase breakdowns (bench/README.md); nothing in the package records.

Nested phases overlap (a stage's time is inside "prefill attention (all)"), and a phase run while a CUDA graph is
captured is not timed (a synchronisation would break the capture).
"""

from __future__ import annotations

import functools
import time
from typing import Callable, TypeVar

import torch

F = TypeVar("F", bound=Callable)


class _Recorder:
    def __init__(self, device: torch.device, seconds: dict[str, float]):
        self.device = device
        self.seconds = seconds

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


_recorder: _Recorder | None = None


def phase(name: str) -> Callable[[F], F]:
    """Mark a function (or method) as the phase `name`."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            rec = _recorder
            if rec is None or (rec.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
                return fn(*args, **kwargs)
            rec.sync()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                rec.sync()
                rec.seconds[name] = rec.seconds.get(name, 0.0) + time.perf_counter() - start

        return timed  # type: ignore[return-value]

    return decorate


def record_phases(device: torch.device, seconds: dict[str, float] | None = None) -> dict[str, float]:
    """Start timing every marked phase on `device` (synchronised), summed into `seconds` (name -> seconds; a new
    dict if None), which is returned."""
    global _recorder
    _recorder = _Recorder(torch.device(device), {} if seconds is None else seconds)
    return _recorder.seconds


def stop_recording() -> None:
    global _recorder
    _recorder = None

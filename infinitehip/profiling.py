"""Named phases of the forward pass (pruning stages, block-sparse attention, saliency, offload resolves...), timed
on request: `record_phases(device)` starts summing the synchronised wall time of every call of a function marked
`@phase("name")` into a dict, `stop_recording()` ends it. Off by default: a marked call then costs one
global lookup. Benchmarks read it for their per-phase breakdowns (bench/README.md); nothing in the package records.

Nested phases overlap (a stage's time is inside "prefill attention (all)"), and a phase run while a CUDA graph is
captured is not timed (a synchronisation would break the capture).

CUDA-graph replays (decode steps) are timed apart, without a host sync: `record_graph_replays()` starts logging a
`Replay` (CUDA events, or host clock readings on the CPU) with its graph key around every replay of the engine's
graph decoder (`graph_replay`), `stop_recording_graph_replays()` ends it; read `Replay.ms` after a synchronisation.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import torch

F = TypeVar("F", bound=Callable)


class _Recorder:
    def __init__(self, device: torch.device, seconds: dict[str, float], counts: dict[str, int] | None):
        self.device = device
        self.seconds, self.counts = seconds, counts

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
                if rec.counts is not None:
                    rec.counts[name] = rec.counts.get(name, 0) + 1

        return timed  # type: ignore[return-value]

    return decorate


def record_phases(device: torch.device, seconds: dict[str, float] | None = None,
                  counts: dict[str, int] | None = None) -> dict[str, float]:
    """Start timing every marked phase on `device` (synchronised), summed into `seconds` (name -> seconds; a new
    dict if None), which is returned; `counts` (if given) counts the calls (name -> calls)."""
    global _recorder
    _recorder = _Recorder(torch.device(device), {} if seconds is None else seconds, counts)
    return _recorder.seconds


def stop_recording() -> None:
    global _recorder
    _recorder = None


@dataclass
class Replay:
    """One CUDA-graph replay: its graph key (which decode step it was) and its bracketing CUDA events (host clock
    readings in seconds on the CPU)."""

    key: Any
    start: Any
    end: Any

    @property
    def ms(self) -> float:
        """GPU time of the replay in ms (synchronise first on CUDA)."""
        if isinstance(self.start, float):
            return 1000 * (self.end - self.start)
        return self.start.elapsed_time(self.end)


_replays: list[Replay] | None = None


@contextlib.contextmanager
def graph_replay(key: Any, device: torch.device):
    """Bracket one graph replay on `device` while `record_graph_replays` is on (no host sync)."""
    replays = _replays
    if replays is None:
        yield
        return
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
    else:
        start = time.perf_counter()
        yield
        end = time.perf_counter()
    replays.append(Replay(key, start, end))


def record_graph_replays() -> list[Replay]:
    """Start logging every graph replay; -> the list they are appended to."""
    global _replays
    _replays = []
    return _replays


def stop_recording_graph_replays() -> None:
    global _replays
    _replays = None

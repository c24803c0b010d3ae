"""Timing helpers of the suites: median-of-reps timers with an L2 flush (Timer), CUDA-graph replay timing
(time_graph, try_graph), device syncs, and the time to a request's first token through an engine."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable

import torch


def log(msg: str = "") -> None:
    print(msg, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def first_token_s(engine, ids: list[int], max_tokens: int):
    """Seconds from add_request to the first sampled token of prompt `ids` (synchronised), and the sequence, run
    to its end (untimed) for `max_tokens` tokens."""
    from infinitehip.config.sampling import SamplingParams

    device = engine.device
    sync(device)
    t0 = time.perf_counter()
    seq = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    while not seq.output_ids:
        engine.step()
    sync(device)
    elapsed = time.perf_counter() - t0
    while not seq.is_finished:
        engine.step()
    return elapsed, seq


class Timer:
    """Median latency (ms) of fn(): warm-up calls, then reps until min_reps and budget_s are reached."""

    def __init__(self, device: torch.device, warmup: int, min_reps: int, max_reps: int, budget_s: float,
                 flush_mb: int = 256):
        self.cuda = device.type == "cuda"
        self.warmup, self.min_reps, self.max_reps, self.budget_s = warmup, min_reps, max_reps, budget_s
        self.flush_buf = torch.empty(flush_mb << 20, dtype=torch.int8, device=device) if self.cuda and flush_mb else None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def once(self, fn: Callable[[], Any]) -> float:
        """One timed call (ms), cold L2, nothing queued before it."""
        if self.flush_buf is not None:
            self.flush_buf.zero_()
        self.sync()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def __call__(self, fn: Callable[[], Any], warmup: int | None = None) -> dict:
        warmup = self.warmup if warmup is None else warmup
        times: list[float] = []
        if warmup < 0:  # auto (CPU): a first call under 0.5 s is a warm-up, a slower one is the measurement
            first = self.once(fn)
            if first >= 500:
                times.append(first)
            warmup = 0
        for _ in range(warmup):
            fn()
        self.sync()
        while len(times) < self.max_reps and (len(times) < self.min_reps or sum(times) < self.budget_s * 1e3):
            times.append(self.once(fn))
        return {"ms": statistics.median(times), "min_ms": min(times), "reps": len(times)}


def time_graph(timer: Timer, fn: Callable[[], Any]) -> dict | None:
    """Median latency of fn captured in a CUDA graph (device time without eager host overhead)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile / allocate outside the capture
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    result = timer(graph.replay, warmup=2)
    del graph
    return result


def try_graph(timer: Timer, fn: Callable[[], Any] | None, what: str, errors: list[str]) -> dict | None:
    if fn is None:
        return {"ms": 0.0, "min_ms": 0.0, "reps": 0}  # nothing to run on the device
    try:
        return time_graph(timer, fn)
    except Exception as e:  # noqa: BLE001 - a failed capture must not end the benchmark
        errors.append(f"{what}: {type(e).__name__}: {e}")
        log(f"  [graph timing of {what} failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}]")
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        return None



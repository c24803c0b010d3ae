"""Ranks 1..N-1 of a tensor-parallel engine: build the rank's model, KV storage and method, then replay rank 0's
model calls (`step_sync.StepMirror`) until rank 0 broadcasts None (`launch.stop_ranks`)."""

from __future__ import annotations

import os

import torch

from infinitehip.config.engine import EngineConfig
from infinitehip.engine.prefix_pages import prefix_policy
from infinitehip.engine.rank import build_rank
from infinitehip.model.rank_weights import RankWeights
from infinitehip.distributed.state import ParallelState, init_parallel, shutdown_parallel
from infinitehip.engine.parallel.step_sync import StepMirror


def rank_device(config: EngineConfig, local_rank: int) -> torch.device:
    """The device of the rank with this index on its node: cuda:(base + local_rank) on GPU ("cuda:2" with 2 ranks:
    cuda:2 and cuda:3), the CPU otherwise."""
    base = config.torch_device()
    if base.type != "cuda":
        return base
    return torch.device("cuda", (base.index or 0) + local_rank)


def run_worker(parallel: ParallelState, config: EngineConfig, weights: RankWeights) -> None:
    """One engine on this rank: build its part, replay rank 0's calls until rank 0 closes the engine (None)."""
    dtype = config.torch_dtype()
    error = None
    try:
        loaded = weights.load(parallel, parallel.device, dtype)
        parts = build_rank(config, loaded, parallel.device, dtype, parallel, show=False)
    except Exception as e:  # e.g. the KV does not fit this rank's memory: every rank backs out (rank 0 raises)
        error = e
    if parallel.first_error(error) is not None:
        parallel.broadcast_object()  # rank 0 closes the engine (None)
        return
    prefix = prefix_policy(config.enable_prefix_caching, parts.method, parts.sliding is not None, config.page_size,
                           config.prefill_chunk_for(parallel.device))
    parts.runner.prefix = prefix
    mirror = StepMirror(parts.runner, parts.method, prefix)
    with torch.inference_mode():
        while (message := parallel.broadcast_object()) is not None:
            mirror.apply(message)
    mirror.release_all()


def serve(parallel: ParallelState) -> None:
    """Engines one after another (rank 0 broadcasts each one's (config, weights); the config nests the method's and the offload config),
    until rank 0 broadcasts None: the ranks outlive an engine, so a process that builds several (one per method,
    as `eval compare` does) starts its ranks once."""
    while (spec := parallel.broadcast_object()) is not None:
        run_worker(parallel, *spec)


def worker_main(rank: int, size: int, init_method: str, device: torch.device) -> None:
    """Entry point of a spawned rank (torch.multiprocessing, start method spawn)."""
    if device.type == "cpu":  # the ranks share the host's cores
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // size))
    parallel = init_parallel(rank, size, device, init_method)
    parallel.ranks_per_host = size  # spawned ranks share one host
    try:
        serve(parallel)
    finally:
        shutdown_parallel()

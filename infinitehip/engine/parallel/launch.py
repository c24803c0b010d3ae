"""Starting and stopping the ranks of a tensor-parallel engine.

Spawned (the default): `LLMEngine(config)` with tensor_parallel_size N, in one process, becomes rank 0 and starts
ranks 1..N-1 with torch.multiprocessing (start method spawn) on cuda:1..N-1 (CPU: gloo ranks on the host); they
meet over tcp://127.0.0.1 on a free port. The ranks outlive the engine: `LLMEngine.close()` returns them to
waiting, the next engine of the same size reuses them (one open engine at a time), and they end with the process.

torchrun (one node or several): every process runs the same command, e.g.

    torchrun --nproc-per-node 2 -m infinitehip.cli.main serve --model DIR --tensor-parallel-size 2
    torchrun --nnodes 2 --node-rank R --nproc-per-node 4 --master-addr HOST0 --master-port 29500 \\
        -m infinitehip.cli.main serve --model DIR --tensor-parallel-size 8

torchrun's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT (torch.distributed's own transport, not
engine settings) are read when WORLD_SIZE > 1: WORLD_SIZE must equal the size, each process uses cuda:LOCAL_RANK,
rank 0 (the node that serves) goes on as the engine, and the others enter the worker loop inside the engine's
constructor and exit when rank 0's process ends. Give an HF directory (or convert a GGUF once beforehand): every rank reads
the checkpoint itself. Across nodes the per-layer all-reduce runs over the network: keep a tensor-parallel group
within one NVLink node unless the model does not fit it.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
from pathlib import Path

import torch

from infinitehip.config.engine import EngineConfig
from infinitehip.model.loading import LoadedModel
from infinitehip.model.rank_weights import RankWeights
from infinitehip.distributed.shard import check_shardable
from infinitehip.distributed.state import ParallelState, init_parallel, shutdown_parallel
from infinitehip.engine.parallel.worker import rank_device, serve, worker_main


def rank_weights(config: EngineConfig, loaded: LoadedModel | RankWeights | None) -> RankWeights:
    if isinstance(loaded, RankWeights):
        return loaded
    if isinstance(loaded, LoadedModel):
        return RankWeights.from_loaded(loaded)
    from infinitehip.config.model import ModelConfig
    from infinitehip.model.gguf_convert import default_cache_root
    from infinitehip.model.loading import load_tokenizer, resolve_model_dir

    cache_root = Path(config.model_cache_dir) if config.model_cache_dir else default_cache_root()
    model_dir, source = resolve_model_dir(config.model, cache_root)  # a GGUF is converted here, once
    return RankWeights(ModelConfig.from_dir(model_dir), load_tokenizer(model_dir), source,
                       model_dir, checkpoint_dir=model_dir)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_GROUP: ParallelState | None = None  # this process's ranks (rank 0's view), kept from one engine to the next


def _join_group(config: EngineConfig) -> ParallelState:
    """This process's group of ranks: started once (spawned, or joined under torchrun), then reused."""
    global _GROUP
    size = config.tensor_parallel_size
    if _GROUP is not None:
        if _GROUP.busy:
            raise RuntimeError("a tensor-parallel engine is open in this process: close() it before building another")
        if _GROUP.size != size or _GROUP.device != rank_device(config, _GROUP.rank):
            raise RuntimeError(f"this process's ranks run tensor_parallel_size {_GROUP.size} on {_GROUP.device}; "
                               f"an engine of size {size} on {config.device} needs a new process")
        return _GROUP
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # torchrun
        if world != size:
            raise ValueError(f"torchrun started {world} processes for tensor_parallel_size {size}")
        parallel = init_parallel(int(os.environ["RANK"]), size, rank_device(config, int(os.environ["LOCAL_RANK"])),
                                 "env://")
        parallel.ranks_per_host = int(os.environ.get("LOCAL_WORLD_SIZE", size))
        if not parallel.is_driver:  # the other ranks serve rank 0's engines, then the process ends
            serve(parallel)
            shutdown_parallel()
            sys.exit(0)
    else:
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        context = torch.multiprocessing.get_context("spawn")
        processes = [context.Process(target=worker_main, daemon=True, name=f"infinitehip-tp-rank{rank}",
                                     args=(rank, size, init_method, rank_device(config, rank)))
                     for rank in range(1, size)]
        for p in processes:
            p.start()
        parallel = init_parallel(0, size, rank_device(config, 0), init_method)
        parallel.processes, parallel.ranks_per_host = processes, size
    atexit.register(_stop_group)
    _GROUP = parallel
    return parallel


def start_ranks(config: EngineConfig, loaded: LoadedModel | RankWeights | None) -> tuple[ParallelState, RankWeights]:
    """Start (or reuse, or under torchrun join) the ranks and hand them the engine: they load their weights and
    build their part. Rank 0 then does the same (`LLMEngine`) and every rank reports whether it succeeded
    (`ParallelState.first_error`)."""
    weights = rank_weights(config, loaded)
    check_shardable(weights.config, config.tensor_parallel_size)  # before any process starts
    parallel = _join_group(config)
    parallel.busy = True
    parallel.broadcast_object((config, weights))
    return parallel, weights


def stop_ranks(parallel: ParallelState) -> None:
    """Rank 0: close the engine on the other ranks (they wait for the next one). Idempotent."""
    if parallel.busy:
        parallel.busy = False
        parallel.broadcast_object(None)


def _stop_group(timeout_s: float = 60.0) -> None:
    """At exit: close any open engine, end the other ranks, leave the process group."""
    global _GROUP
    parallel, _GROUP = _GROUP, None
    if parallel is None:
        return
    try:
        stop_ranks(parallel)
        parallel.broadcast_object(None)
    finally:
        for p in parallel.processes:
            p.join(timeout_s)
            if p.is_alive():
                p.terminate()
        shutdown_parallel()

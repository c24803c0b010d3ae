"""One engine's tensor-parallel process group and the collectives the decoder and attention methods call.

Every rank runs the same code on its own heads; what must agree across ranks goes through these calls:
- `all_reduce`: sum of the row-parallel projections' partial outputs [T, hidden] (o_proj, down_proj);
- `all_reduce(op="max")` / `"sum"`: a method's head-aggregated selection scores (InfiniteHiP's chunk scores,
  TokenSelect's votes), so every rank selects what one process over all heads would;
- `all_gather_last`: the vocab-parallel logits [N, V / size] -> [N, V] on every rank;
- `broadcast_object`: rank 0's scheduled step (plain Python data) to the other ranks, over a gloo group so it
  never waits behind GPU work.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


@dataclass(eq=False)
class ParallelState:
    rank: int
    size: int
    device: torch.device
    group: object  # the collectives' group (NCCL on CUDA, gloo on CPU)
    cpu_group: object  # gloo group for the step broadcast (the same group on CPU)
    processes: list = field(default_factory=list)  # rank 0 of a spawned group: the other ranks' processes
    busy: bool = False  # rank 0: an engine is open on these ranks
    ranks_per_host: int = 1  # ranks sharing this host's memory (all of them when spawned; torchrun: per node)

    @property
    def is_driver(self) -> bool:
        """Rank 0 owns the scheduler, the tokenizer-facing API and sampling."""
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In-place reduction over the ranks of x (any shape; made contiguous first); returns the result."""
        x = x.contiguous()
        dist.all_reduce(x, op=_OPS[op], group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, P] from every rank -> [N, size * P], rank r's columns at [r * P, (r + 1) * P)."""
        x = x.contiguous()
        if self.device.type == "cuda":  # one NCCL call (capturable in a CUDA graph)
            out = torch.empty((self.size, *x.shape), dtype=x.dtype, device=x.device)
            dist.all_gather_into_tensor(out, x, group=self.group)
        else:  # gloo gathers into a list
            parts = [torch.empty_like(x) for _ in range(self.size)]
            dist.all_gather(parts, x, group=self.group)
            out = torch.stack(parts)
        return out.permute(1, 0, 2).reshape(x.shape[0], self.size * x.shape[1])

    def host_share(self, available: int) -> int:
        """Host memory this rank may plan its KV store in: the least any rank sees available, read by every rank
        before any allocates (this call is a collective), split among the ranks of one host."""
        least = torch.tensor([available], dtype=torch.int64)
        dist.all_reduce(least, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(least.item()) // self.ranks_per_host

    def first_error(self, error: BaseException | None) -> str | None:
        """Every rank's outcome of a step that may fail on some ranks only (building an engine): None when all
        succeeded, else the first failing rank's message, on every rank (so all of them back out together)."""
        errors: list = [None] * self.size
        dist.all_gather_object(errors, None if error is None else f"{type(error).__name__}: {error}",
                               group=self.cpu_group)
        return next((f"rank {r}: {e}" for r, e in enumerate(errors) if e is not None), None)

    def broadcast_object(self, obj: object = None) -> object:
        """Rank 0's obj on every rank (pickled; others pass None)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]


def init_parallel(rank: int, size: int, device: torch.device, init_method: str,
                  timeout_s: float = 1800.0) -> ParallelState:
    """Join the engine's process group: `init_method` is "env://" under torchrun (MASTER_ADDR / MASTER_PORT, its
    transport) or "tcp://127.0.0.1:PORT" for ranks the engine spawned. One engine per process."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size, timeout=timeout,
                            **({"device_id": device} if device.type == "cuda" else {}))
    group = dist.group.WORLD
    cpu_group = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else group
    return ParallelState(rank, size, device, group, cpu_group)


def shutdown_parallel() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()

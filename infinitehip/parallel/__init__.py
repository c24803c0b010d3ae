"""Tensor parallelism over torch.distributed (NCCL on GPU, gloo on CPU).

- `state.py`: the process group of one engine's ranks and the collectives the model and methods call.
- `shard.py`: which heads / MLP rows / vocabulary rows a rank holds, and checkpoint tensors sliced to them.
- `linear.py`: the row-parallel projections (local matmul + all-reduce) and the vocab-parallel logits.
- `step_sync.py`: rank 0 -> other ranks, each step's scheduled sequences as plain data (no tensors).
- `launch.py` / `worker.py`: ranks spawned by the engine (or started by torchrun) and their step loop.

Single-process engines (tensor_parallel_size 1) import none of this beyond the type names.
"""

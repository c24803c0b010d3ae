"""Tensor parallelism's primitives over torch.distributed (NCCL on GPU, gloo on CPU), below the model.

- `state.py`: the process group of one engine's ranks and the collectives the model and methods call.
- `shard.py`: which heads / MLP rows / vocabulary rows a rank holds, and checkpoint tensors sliced to them.
- `linear.py`: the row-parallel projections (local matmul + all-reduce) and the vocab-parallel logits.

The processes (spawning ranks, their step loop) belong to the engine: `engine/parallel/`.
"""

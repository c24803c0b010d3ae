"""Tensor parallelism's processes: the engine's ranks and how rank 0's steps reach them.

- `launch.py` / `worker.py`: ranks spawned by the engine (or started by torchrun) and their step loop.
- `step_sync.py`: rank 0 -> other ranks, each step's scheduled sequences as plain data (no tensors).

The sharding primitives the model is built from (process group and collectives, which part a rank holds, the
row- and vocab-parallel projections) sit below the model in `infinitehip/distributed/`; how a rank gets its part
of the weights is `model/rank_weights.py`. Single-process engines (tensor_parallel_size 1) import none of this.
"""

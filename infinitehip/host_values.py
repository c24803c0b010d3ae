"""Small host-known values (Python lists) as device tensors without a host sync.

`torch.tensor(values, device="cuda")` copies from pageable memory, which blocks the host until the copy -- and
so every kernel queued before it -- has finished: the host can no longer run ahead of the GPU. Staging the
values in pinned memory makes the copy asynchronous (PyTorch's pinned allocator keeps the staging buffer alive
until the copy has run). On CPU it is a plain tensor.
"""

from __future__ import annotations

from typing import Sequence

import torch


def device_tensor(values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """values [N] -> a tensor [N] of dtype on device, copied without blocking the host on CUDA."""
    return host_to_device(torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda"), device)


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on device, copied as `device_tensor` copies: staged in pinned memory on CUDA."""
    if device.type != "cuda":
        return t.to(device)
    return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)

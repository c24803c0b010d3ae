"""Rotation of queries or keys by RoPE angles gathered at given positions, as one op: eager reference and one
Triton kernel.

- reference: `rope.apply_rotary` on the gathered table rows (the oracle and the CPU path): two gathers, two casts,
  four products, a sum, a difference, a concatenation and a cast, ~12 launches a call.
- triton: one kernel per call, what CUDA tensors use. The pruning stages rotate each query block once per scored
  stage in prefill and at every decode refresh, so the eager form's launches were ~11 of a refresh's ~57 extra small
  kernels per layer. The kernel multiplies, subtracts and rounds in the reference's order with fused multiply-adds
  off, so on the GPU its output equals the reference's bit for bit.
"""

from __future__ import annotations

import torch

from infinitehip.config.impl import select_impl
from infinitehip.model.rope import apply_rotary


def rotate_at_reference(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The oracle: `apply_rotary` on the table rows gathered at positions."""
    return apply_rotary(x, cos[positions][..., None, :], sin[positions][..., None, :])


def rotate_at(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              impl: str | None = None) -> torch.Tensor:
    """x [*P, H, d] rotated at positions [*P] (ints) by the tables cos / sin [max_position, d/2] -> [*P, H, d] in
    x's dtype. impl None: the Triton kernel for CUDA tensors, the eager reference otherwise."""
    impl = impl or ("triton" if x.is_cuda else "reference")
    fn = select_impl(impl, rotate_at_reference, f"infinitehip.model.rotary.triton", "rotate_at_triton", "rotation")
    return fn(x, positions, cos, sin)


__all__ = ["rotate_at"]

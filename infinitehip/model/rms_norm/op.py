"""RMSNorm as the model families compute it, as one op: eager reference and one Triton kernel.

- `reference`: eager PyTorch, the oracle (and the CPU path): ~8 elementwise launches and a reduction per call.
- `triton`: one kernel per call (one program per row), what CUDA tensors use: a decode step runs two norms a layer
  (four in Gemma 3, plus per-head q/k norms), so the eager form's launches were ~16 of a layer's ~55 small kernels.
  `add_rms_norm` adds the residual stream in the same launch (the add a pre-norm block does before each norm).

Two roundings, as the reference implementations do them: Llama-family `w * (x / rms).to(dtype)` (cast before the
weight) and Gemma's `(x / rms * (1 + w)).to(dtype)` (`gemma=True`: cast after the weight). The kernel sums the
squares in another order than torch's mean, so its output may differ from the reference by one rounding step in rare
elements.
"""

from __future__ import annotations

import torch

from infinitehip.config.impl import select_impl
from infinitehip.model.rms_norm.reference import add_rms_norm_reference, rms_norm_reference


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool = False, impl: str | None = None) -> torch.Tensor:
    """x [..., D], weight [D] -> [..., D] in x's dtype. gemma: scale by (1 + weight), cast after it. impl None: the
    Triton kernel for CUDA tensors, the eager reference otherwise."""
    impl = impl or ("triton" if x.is_cuda else "reference")
    fn = select_impl(impl, rms_norm_reference, f"infinitehip.model.rms_norm.triton", "rms_norm_triton", "rms norm")
    return fn(x, weight, eps, gemma)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool = False,
                 impl: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [..., D] -> (rms_norm(x + residual), x + residual), the sum rounded to the activation dtype as
    torch's add rounds it; impl as `rms_norm` (the kernel: one launch for the add and the norm)."""
    impl = impl or ("triton" if x.is_cuda else "reference")
    fn = select_impl(impl, add_rms_norm_reference, f"infinitehip.model.rms_norm.triton", "add_rms_norm_triton", "rms norm")
    return fn(x, residual, weight, eps, gemma)


__all__ = ["add_rms_norm", "rms_norm"]

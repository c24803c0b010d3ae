"""Eager RMSNorm, Llama-family and Gemma roundings: the oracle of `triton.py` (the models' code before the kernel)."""

from __future__ import annotations

import torch


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if gemma:  # HF Gemma: scale by (1 + w) in fp32, then cast
        return (x32 * (1.0 + weight.float())).to(x.dtype)
    return weight * x32.to(x.dtype)  # HF Llama: cast back before the weight


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                           gemma: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): a pre-norm block's residual add and the next norm."""
    total = x + residual
    return rms_norm_reference(total, weight, eps, gemma), total

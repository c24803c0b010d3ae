"""The prefill's landmark saliency sums (saliency.py `KeySaliency.update`): for each key of a prefill chunk's reach,
the sum of the logits it receives from the chunk's queries in its window, per head.

- `reference`: eager PyTorch, every (query, key) pair in reach (the oracle);
- `cpu`: window sums of the queries as differences of a float64 prefix sum, one GEMV per key (linear in the chunk);
- `triton`: the same window sums built from blocks of rows in one kernel (a fraction of cpu.py's memory traffic).
Arguments: reference.py.
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.infinitehip.window_saliency.cpu import window_logit_sums_cpu
from infinitehip.attention.methods.infinitehip.window_saliency.reference import window_counts, window_logit_sums_reference
from infinitehip.config.impl import select_impl


def window_logit_sums(q_rot: torch.Tensor, k: torch.Tensor, first_key: int, window: int,
                      impl: str = "triton") -> torch.Tensor:
    """q_rot [n, H, d] and k [L, Hkv, d] fp32, rotated; key i at chunk position first_key + i -> [L, H] fp32."""
    fn = select_impl(impl, window_logit_sums_reference, "infinitehip.attention.methods.infinitehip.window_saliency.triton",
                     "window_logit_sums_triton", "prefill saliency", cpu=window_logit_sums_cpu)
    return fn(q_rot, k, first_key, window)


__all__ = ["window_counts", "window_logit_sums"]

"""Attention over sinks + sub-caches + stride that also accumulates each key's score (the EMA of the attention it
receives, reduced over its KV group's query heads), for the method's slot order.

The method's keys are its K slots in order and a chunk's n queries sit at the last n: query i at slot K - n + i
sees key j iff j <= K - n + i (kept slots are ranked below the kept count, the stride's positions are its slots).

- `reference`: eager PyTorch for any key positions (reference.py), the oracle: every probability materialized;
- `cpu`: torch's CPU flash kernel gives the output and each row's log-sum-exp (kept keys unmasked, the chunk's own
  keys causal, merged by log-sum-exp), then one pass of logits minus that log-sum-exp gives the probabilities the
  scores need (no softmax, no second product with V);
- `triton`: a flash-attention kernel that also writes each row's log-sum-exp, then a kernel per key tile that
  recomputes q.k minus it over the queries that see the tile (the probabilities) and sums them into the scores.

`attention_with_scores(..., impl=...)` dispatches; the Triton module is imported on first use.
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.cascade.scores.reference import attention_with_scores_reference
from infinitehip.config.impl import select_impl


def _reference(q, k, v, scores, scale, decay, reduction):
    K, n = k.shape[0], q.shape[0]
    k_pos = torch.arange(K, device=q.device)
    return attention_with_scores_reference(q, k, v, k_pos[K - n :], k_pos, scores, scale, decay, reduction)


def _cpu(q, k, v, scores, scale, decay, reduction):
    from infinitehip.attention.methods.cascade.scores.cpu import attention_with_scores_cpu

    return attention_with_scores_cpu(q, k, v, scores, scale, decay, reduction)


def attention_with_scores(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor, scale: float,
                          decay: float, reduction: str, impl: str = "reference") -> torch.Tensor:
    """q [n, H, d] of the last n of K slots, k/v [K, Hkv, d] (RoPE applied), scores [Hkv, K] fp32 (zero for the
    chunk's keys) updated in place -> out [n, H, d] in q's dtype."""
    if q.shape[0] > k.shape[0]:
        raise ValueError(f"{q.shape[0]} queries over {k.shape[0]} keys: the queries are the last slots")
    fn = select_impl(impl, _reference, "infinitehip.attention.methods.cascade.scores.triton",
                     "attention_with_scores_triton", "cascade attention", cpu=_cpu)
    return fn(q, k, v, scores, scale, decay, reduction)


__all__ = ["attention_with_scores"]

"""How the heads' chunk scores combine into the one score a query block ranks its chunks by.

The paper (Alg. 2 line 11) takes the max over heads of raw logits q . k_rep, so a head with a large logit
scale decides the ranking for every head. Alternatives work on per-head scores x [M, N, H] (max over the
block's queries of the head's logit against the chunk's representative):

  max      max_h x                                   (the paper; computed fused by the scoring kernels)
  softmax  sum_h softmax_N(x * sm_scale)             each head's estimated share of its attention over the
                                                     candidates, summed: every head votes with weight 1
  zscore   max_h (x - mean_N x) / std_N x            each head standardised over the block's chunks
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.infinitehip.config import HEAD_AGGREGATIONS  # noqa: F401  (one list of names)


def aggregate_heads(scores: torch.Tensor, chunk_lens: torch.Tensor, mode: str, sm_scale: float) -> torch.Tensor:
    """scores [M, N, H] fp32 per-head chunk scores, chunk_lens [M, N] (0 = padding) -> [M, N], -inf for padding."""
    pad = chunk_lens == 0  # [M, N]
    if mode == "max":
        out = scores.amax(-1)
    elif mode == "softmax":
        z = (scores.float() * sm_scale).masked_fill(pad[..., None], float("-inf"))
        out = torch.softmax(z, dim=1).nan_to_num(0.0).sum(-1)  # a block with no real chunk: all NaN -> 0
    elif mode == "zscore":
        real = (~pad)[..., None].float()  # [M, N, 1]
        n = real.sum(1, keepdim=True).clamp(min=1)
        x = scores.float().masked_fill(pad[..., None], 0.0)
        mean = (x * real).sum(1, keepdim=True) / n  # [M, 1, H]
        std = (((x - mean) * real) ** 2).sum(1, keepdim=True).div(n).sqrt().clamp(min=1e-6)
        out = ((x - mean) / std).amax(-1)
    else:
        raise ValueError(f"unknown head aggregation {mode!r}; expected one of {HEAD_AGGREGATIONS}")
    return out.masked_fill(pad, float("-inf"))

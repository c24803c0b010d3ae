"""The prefill's landmark saliency sums in time linear in the chunk (impl "cpu"): the logits a key t receives add up
to (the sum of the queries s in [t, t + window) of this chunk) . k_t, and those window sums are differences of a
float64 prefix sum of the queries (exact to fp32, and no [n, window] logits). Same arguments as reference.py."""

from __future__ import annotations

import torch


def prefix_sums(x: torch.Tensor, block: int = 64) -> torch.Tensor:
    """x [n, F] -> float64 [n + 1, F], row i = sum of x[:i]: cumulative sums inside blocks of rows, then the
    blocks' running totals added (torch's cumsum along a leading dim is several times slower on CPU)."""
    n, width = x.shape
    rows = -(-(n + 1) // block) * block
    sums = torch.zeros(rows, width, dtype=torch.float64, device=x.device)
    sums[1 : n + 1] = x
    sums = sums.view(rows // block, block, width).cumsum_(1)
    sums[1:] += sums[:-1, -1].cumsum(0)[:, None]
    return sums.view(rows, width)[: n + 1]


def window_logit_sums_cpu(q_rot: torch.Tensor, k: torch.Tensor, first_key: int, window: int) -> torch.Tensor:
    n, H, d = q_rot.shape
    L, Hkv, _ = k.shape
    prefix = prefix_sums(q_rot.reshape(n, H * d))  # [n + 1, H * d]: row i = sum of q_rot[:i]
    t = torch.arange(first_key, first_key + L, device=q_rot.device)  # key positions relative to the chunk
    first, end = t.clamp(min=0, max=n), (t + window).clamp(min=0, max=n)  # queries [first, end) reach key t
    window_q = prefix.index_select(0, end).sub_(prefix.index_select(0, first)).float()  # [L, H * d]
    # [L, Hkv, group, 1]: head h attends kv head h // group
    logits = torch.matmul(window_q.view(L, Hkv, H // Hkv, d), k[..., None])
    return logits.view(L, H)

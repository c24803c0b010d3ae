"""The decode steps' landmark saliency (saliency.py `update_decode`): the queued queries' logits added to the keys of
their windows, applied at a mask refresh. Sync-free, static shapes.

- `reference`: eager PyTorch, the oracle (~50 small launches: gathers of the RoPE tables, two rotations, the
  masked logits, the resets and scatter-adds).
- `triton`: one Triton kernel (imported on first use), one program per key of the windows' union (and sequence).

`add_decode_logits_batched`: the sequences of a decode batch in one call, each one's queued queries a row of a pool
(decode_pool.py); the same sums as one call per sequence.
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.infinitehip.decode_saliency.reference import (
    add_decode_logits_batched_reference, add_decode_logits_reference,
)
from infinitehip.config.impl import select_impl


def add_decode_logits(q: torch.Tensor, positions: torch.Tensor, key_pos: torch.Tensor, slots: torch.Tensor,
                      keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, total: torch.Tensor, count: torch.Tensor,
                      window: int, impl: str = "triton") -> None:
    """See `reference.py` for the arguments; updates total / count in place."""
    fn = select_impl(impl, add_decode_logits_reference, f"infinitehip.attention.methods.infinitehip.decode_saliency.triton", "add_decode_logits_triton",
                     "decode saliency")
    fn(q, positions, key_pos, slots, keys, cos, sin, total, count, window)


def add_decode_logits_batched(q: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None, key_pos: torch.Tensor,
                              slots: torch.Tensor, keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                              total: torch.Tensor, count: torch.Tensor, window: int, impl: str = "triton") -> None:
    """Sequence g of G: its queued queries q[rows[g]] [P, H, d] at positions[rows[g]] [P] (q [R, P, H, d], positions
    [R, P]; rows None: row g) and its union key_pos[g], slots[g] [Wp], keys[g] [Wp, Hkv, d], as `add_decode_logits`.
    The sequences' slots are distinct (each its own tokens), so the order of the sequences does not matter."""
    fn = select_impl(impl, add_decode_logits_batched_reference, "infinitehip.attention.methods.infinitehip.decode_saliency.triton",
                     "add_decode_logits_batched_triton", "decode saliency")
    fn(q, positions, rows, key_pos, slots, keys, cos, sin, total, count, window)


__all__ = ["add_decode_logits", "add_decode_logits_batched"]

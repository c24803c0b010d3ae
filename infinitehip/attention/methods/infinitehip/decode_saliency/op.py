"""The decode steps' landmark saliency (saliency.py `update_decode`): the queued queries' logits added to the keys of
their windows, applied at a mask refresh. Sync-free, static shapes.

- `reference`: eager PyTorch, the oracle (~50 small launches: gathers of the RoPE tables, two rotations, the
  masked logits, the resets and scatter-adds).
- `triton`: one Triton kernel (imported on first use), one program per key of the windows' union.
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.infinitehip.decode_saliency.reference import add_decode_logits_reference
from infinitehip.config.impl import select_impl


def add_decode_logits(q: torch.Tensor, positions: torch.Tensor, key_pos: torch.Tensor, slots: torch.Tensor,
                      keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, total: torch.Tensor, count: torch.Tensor,
                      window: int, impl: str = "triton") -> None:
    """See `reference.py` for the arguments; updates total / count in place."""
    fn = select_impl(impl, add_decode_logits_reference, f"infinitehip.attention.methods.infinitehip.decode_saliency.triton", "add_decode_logits_triton",
                     "decode saliency")
    fn(q, positions, key_pos, slots, keys, cos, sin, total, count, window)


__all__ = ["add_decode_logits"]

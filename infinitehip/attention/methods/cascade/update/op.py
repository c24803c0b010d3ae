"""Pushing a stride's tokens through the sub-caches (schedule.py's plan), every layer and KV head at once.

- `reference`: eager PyTorch, the oracle: the plan runs push by push on slot indices and scores per layer and
  head ([L, Hkv] tensors), then one gather moves every kept slot's k/v to where its token ended up;
- `cpu`: eager PyTorch one sub-cache at a time (`batched.py`): all of a stride's arrivals at a sub-cache in a few
  gathers and `where`s, then the written slots' k/v moved;
- `triton`: one program per layer and KV head walks the plan over the circular buffers in place (a pass swaps the
  carried token's row with the slot's, a compare writes the carried row only where its score wins), imported on
  first use.

`cascade_update(..., impl=...)` dispatches; see `reference.py` for the arguments.
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.cascade.update.batched import cascade_update_batched
from infinitehip.attention.methods.cascade.update.reference import cascade_update_reference
from infinitehip.config.impl import select_impl


def cascade_update(k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor, flat_slots: torch.Tensor,
                   ops: torch.Tensor, slots: torch.Tensor, first: int, impl: str = "reference") -> None:
    fn = select_impl(impl, cascade_update_reference, "infinitehip.attention.methods.cascade.update.triton",
                     "cascade_update_triton", "cascade update", cpu=cascade_update_batched)
    fn(k, v, scores, flat_slots, ops, slots, first)


__all__ = ["cascade_update"]

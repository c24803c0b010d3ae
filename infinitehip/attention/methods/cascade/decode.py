"""The cascade's decode step in static shapes: a decode query attends every slot a sequence may hold (the
config's limit_tokens: sinks, sub-caches, stride), masked to the ones holding a token at or before its own slot.
It reads only device tensors (the step's positions and page tables from the ForwardBatch, the buffers below), so
a step replays from a CUDA graph at any position (graph_hooks.py), and eager steps compute the same.

Per sequence, `DecodeKeys` holds what a decode step needs of the schedule (host bookkeeping, schedule.py), as device
buffers written after each push (which runs after a step, outside any graph), never reallocated (a graph keeps
their pointers):
  held      [limit] bool   kept slots that hold a token (schedule.held_slots; all of them before the first push),
                           and every stride slot;
  positions [limit] int64  each slot's RoPE position (schedule.positions for the kept slots, the stride at its slot).
A step's query sits at slot p = decode_positions[b]: slot j is visible iff held[j] and j <= p, so the keys are
those the prefill path lists (method.py `_keys`), in slot order, with the slots it skips masked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infinitehip.attention.base import ForwardBatch
from infinitehip.attention.methods.cascade.schedule import CascadeSchedule
from infinitehip.host_values import host_to_device


@dataclass
class DecodeKeys:
    held: torch.Tensor  # [limit] bool
    positions: torch.Tensor  # [limit] int64

    @classmethod
    def allocate(cls, limit: int, device: torch.device) -> "DecodeKeys":
        """Before the first push: every slot holds the prompt's token of its position."""
        return cls(torch.ones(limit, dtype=torch.bool, device=device), torch.arange(limit, device=device))

    def refresh(self, schedule: CascadeSchedule) -> None:
        """After a push: the schedule's held slots and positions, copied in place (host values, no sync)."""
        limit, kept = self.held.numel(), schedule.kept
        held = torch.ones(limit, dtype=torch.bool)
        slots = schedule.held_slots()
        if slots is not None:  # filling: a sub-cache's slots past its count hold no token of it
            held[:kept] = False
            held[slots] = True
        positions = torch.arange(limit, dtype=torch.long)
        positions[:kept] = schedule.positions()
        self.held.copy_(host_to_device(held, self.held.device))
        self.positions.copy_(host_to_device(positions, self.positions.device))


@dataclass
class StepKeys:
    """The decode sequences' keys of one step, for every layer: flat cache slots [B, limit] int64 of their slots,
    visible [B, limit] bool, positions [B, limit] int64."""

    flat: torch.Tensor
    visible: torch.Tensor
    positions: torch.Tensor


def step_keys(batch: ForwardBatch, keys: list[DecodeKeys]) -> StepKeys:
    """Computed at the step's first layer and kept on the batch (each step, eager or replayed, has its own)."""
    cached = batch.__dict__.get("cascade_step_keys")
    if cached is not None:
        return cached
    ps = batch.cache.page_size
    tables = batch.decode_page_tables.long()  # [B, P]: P * ps covers every context (a graph's: its bucket)
    slot = torch.arange(keys[0].held.numel(), device=tables.device)  # [limit]
    # A slot past the table's pages lies past the context: it reads some page of the table, masked below
    page = (slot // ps).clamp_(max=tables.shape[1] - 1)
    flat = tables[:, page] * ps + slot % ps  # [B, limit]
    held = torch.stack([k.held for k in keys])  # [B, limit]
    visible = held & (slot[None, :] <= batch.decode_positions[:, None])
    step = StepKeys(flat, visible, torch.stack([k.positions for k in keys]))
    batch.__dict__["cascade_step_keys"] = step
    return step

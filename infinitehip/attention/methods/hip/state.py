"""HiP's per-sequence decode state: each layer's kept selection on the device (updated in place, so a CUDA graph
that refreshes it writes where later graphs read) and the host bookkeeping that says which steps refresh."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class HiPState:
    """Per sequence. Host lists are per layer (the first `dense_layers` are never touched: they keep no mask)."""

    decode_steps: list[int]  # decode steps run
    refreshes: list[int]  # decode steps that recomputed the selection
    ends: list[int | None]  # candidates' end of the kept selection (None: none kept yet)
    sparse: list[bool]  # whether the kept selection selects (False: every key attended)
    position: int | None = None  # the last decode step's query position
    # Device buffers, allocated by the first decode step: starts / lens [L, K] int64 of the kept blocks (lens 0:
    # every key attended) and the kept candidates' end [L] int64.
    starts: torch.Tensor | None = None
    lens: torch.Tensor | None = None
    end: torch.Tensor | None = None

    @classmethod
    def empty(cls, num_layers: int) -> "HiPState":
        L = num_layers
        return cls(decode_steps=[0] * L, refreshes=[0] * L, ends=[None] * L, sparse=[False] * L)

    def allocate(self, num_layers: int, top_k_blocks: int, device: torch.device) -> None:
        if self.starts is None:
            self.starts = torch.zeros(num_layers, top_k_blocks, dtype=torch.long, device=device)
            self.lens = torch.zeros_like(self.starts)
            self.end = torch.zeros(num_layers, dtype=torch.long, device=device)

    def counters(self) -> tuple:
        """A copy of the host bookkeeping a decode step advances."""
        return list(self.decode_steps), list(self.refreshes), list(self.ends), list(self.sparse), self.position

    def set_counters(self, counters: tuple) -> None:
        steps, refreshes, ends, sparse, self.position = counters
        self.decode_steps[:], self.refreshes[:], self.ends[:], self.sparse[:] = steps, refreshes, ends, sparse

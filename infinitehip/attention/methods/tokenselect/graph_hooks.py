"""TokenSelect's CUDA-graph decode hooks (attention/capabilities.GraphDecode) and the decode state a graph reads. A
mixin of `TokenSelectAttention` (it provides config).

Every decode step launches the same work: it scores a new selection for every sequence and keeps the old one where
the Selection Cache hits (on the device), its shapes follow the capacity bucket and the config, and its state is
the sequences' fixed rows (selection_rows.py), hits and misses counted there. So one key serves every step, and
sequences of any lengths share one graph; no host counter is advanced by hand (the defaults).
"""

from __future__ import annotations

from typing import Any

import torch

from infinitehip.attention.base import SequenceSlice
from infinitehip.attention.capabilities import GraphDecode
from infinitehip.attention.methods.tokenselect.selection_rows import RowLayout, SelectionRows

GRAPH_KEY = ("tokenselect",)


class TokenSelectGraphHooks(GraphDecode):
    def graph_capturable(self) -> bool:
        """On CUDA "auto" is Triton (vote and attention launch without a host read); the eager vote and the
        reference attention read counts back."""
        return self.config.impl in ("auto", "triton")

    def graph_key(self, seq: SequenceSlice) -> tuple | None:
        if seq.probe is not None or not self.graph_capturable():  # a probe records on the host: eager
            return None
        if seq.state.rows is None:  # the first decode step allocates the rows: it runs eagerly
            return None
        return GRAPH_KEY

    def decode_rope_positions(self, capacity: int) -> int:
        # keys and the query numbered below the capacity; candidates scored local_tokens before the query
        return max(capacity, self.config.local_tokens + 1)

    def decode_rows(self, state: Any, q: torch.Tensor) -> SelectionRows:
        """The sequence's Selection Cache rows (state: TokenSelectState), allocated at its first decode step with
        the prefill's question-time selections; q [B, H, d] gives the query width and the device."""
        if state.rows is None:
            c = self.config
            layout = RowLayout(c.select_tokens, c.question_select_tokens if c.question_tokens else 0)
            state.rows = SelectionRows.allocate(layout, state.question, q.shape[1] * q.shape[2], q.device)
        return state.rows

    @staticmethod
    def eager_all_reuse(reuse: torch.Tensor) -> bool:
        """Whether an eager step may skip scoring the new selections: every sequence keeps its own (reuse [B] bool),
        so torch.where would drop them. A host read: never while a CUDA graph captures (a graph scores always)."""
        return not (reuse.is_cuda and torch.cuda.is_current_stream_capturing()) and bool(reuse.all())

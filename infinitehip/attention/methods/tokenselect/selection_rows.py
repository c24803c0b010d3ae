"""TokenSelect's Selection Cache (App. C, Alg. 1) in fixed device rows: what a decode step reads and updates in place,
so a CUDA graph captured over them (it holds their pointers) replays any later step.

Per sequence, allocated at its first decode step and never moved, one row per layer of
  ints  [L, k + Q + 6] int64: the last selection's tokens (k, sorted, then padding), the question-time selection
        (Q = question_select_tokens, sorted, then padding; copied once from the prefill's), then the counts of
        both, the selection's window start (its candidates were [sink, window start)), whether a selection was
        made, and the layer's hits and misses;
  query [L, H * d] fp32: the pre-RoPE query of the last selection (C_Q).
Hits and misses are counted on the device: reading them (`counts`) is the only sync, outside the decode step.
Sequences decoding together read their rows stacked ([B, ...]) and write them back in one multi-tensor copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowLayout:
    """Columns of an ints row: k selected tokens, then q question tokens, then the scalars."""

    k: int
    q: int

    @property
    def selected(self) -> slice:
        return slice(0, self.k)

    @property
    def question(self) -> slice:
        return slice(self.k, self.k + self.q)

    @property
    def num_selected(self) -> int:
        return self.k + self.q

    @property
    def num_question(self) -> int:
        return self.k + self.q + 1

    @property
    def window_start(self) -> int:
        return self.k + self.q + 2

    @property
    def made(self) -> int:  # 1 once a selection is kept for reuse (never with the cache off)
        return self.k + self.q + 3

    @property
    def hits(self) -> int:
        return self.k + self.q + 4

    @property
    def misses(self) -> int:
        return self.k + self.q + 5

    @property
    def width(self) -> int:
        return self.k + self.q + 6


@dataclass
class SelectionRows:
    """One sequence's rows (module doc)."""

    layout: RowLayout
    ints: torch.Tensor  # [L, layout.width] int64
    query: torch.Tensor  # [L, H * d] fp32

    @classmethod
    def allocate(cls, layout: RowLayout, questions: list[torch.Tensor | None], query_dim: int,
                 device: torch.device) -> "SelectionRows":
        """Empty selections; questions[l]: layer l's question-time selection (sorted, <= layout.q tokens) or None."""
        ints = torch.zeros(len(questions), layout.width, dtype=torch.int64, device=device)
        for layer, question in enumerate(questions):
            if question is not None and layout.q:
                ints[layer, layout.question][: question.numel()] = question
                ints[layer, layout.num_question] = question.numel()
        return cls(layout, ints, torch.zeros(len(questions), query_dim, dtype=torch.float32, device=device))

    def counts(self) -> tuple[list[int], list[int]]:
        """Per layer (hits, misses) of the decode steps so far (a host read)."""
        return self.ints[:, self.layout.hits].tolist(), self.ints[:, self.layout.misses].tolist()


def read_rows(rows: list[SelectionRows], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer `layer` of B sequences' rows -> ints [B, width], query [B, H * d] (one sequence: views of its rows)."""
    if len(rows) == 1:
        return rows[0].ints[layer : layer + 1], rows[0].query[layer : layer + 1]
    return torch.stack([r.ints[layer] for r in rows]), torch.stack([r.query[layer] for r in rows])


def write_rows(rows: list[SelectionRows], layer: int, ints: torch.Tensor, query: torch.Tensor) -> None:
    """Write ints [B, width] and query [B, H * d] back into layer `layer` of each sequence's rows, in place."""
    if len(rows) == 1:
        rows[0].ints[layer].copy_(ints[0])
        rows[0].query[layer].copy_(query[0])
        return
    torch._foreach_copy_([r.ints[layer] for r in rows] + [r.query[layer] for r in rows],
                         list(ints.unbind(0)) + list(query.unbind(0)))


def updated_rows(layout: RowLayout, ints: torch.Tensor, reuse: torch.Tensor, selected: torch.Tensor,
                 num_selected: torch.Tensor, window_start: torch.Tensor, keep: bool) -> torch.Tensor:
    """The rows after a step: ints [B, width] as read, reuse [B] bool (the old selection kept), the step's
    selection selected [B, k] / num_selected [B] / window_start [B] (the old one where reused); keep: the cache is
    on (a selection is kept for the next step). -> ints [B, width]; hits and misses counted."""
    hits = ints[:, layout.hits] + reuse.long()
    misses = ints[:, layout.misses] + (~reuse).long()
    made = torch.full_like(hits, int(keep))
    scalars = torch.stack([num_selected, ints[:, layout.num_question], window_start, made, hits, misses], 1)
    return torch.cat([selected, ints[:, layout.question], scalars], 1)


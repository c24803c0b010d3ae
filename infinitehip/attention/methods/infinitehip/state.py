"""InfiniteHiP's per-sequence state: what each layer's decode keeps between steps (stage caches, counters, the
question's selection, the offloaded rows kept for reuse)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from infinitehip.attention.methods.infinitehip.decode import StageCache
from infinitehip.attention.methods.infinitehip.decode_pool import Pool
from infinitehip.attention.methods.infinitehip.decode_rows import DecodeRows
from infinitehip.attention.methods.infinitehip.mask_rows import MaskRows


@dataclass
class InfiniteHiPState:
    """Per sequence: each layer's cached stage outputs (allocated at the first decode step) and step counter."""

    stage_cache: list[list[StageCache] | None]
    decode_steps: list[int]
    # Landmark saliency of decode queries is applied at the next refresh (deferred_saliency.py): per layer, the queries
    # not applied yet [P, H, d] and their positions [P] (-1: empty), P = min(refresh_intervals): views of the
    # sequence's row `pool_row` (pool, row) of pooled queues (decode_pool.py), taken at its first decode step.
    pending_q: list[torch.Tensor | None] = field(default_factory=list)
    pending_pos: list[torch.Tensor | None] = field(default_factory=list)
    pool_row: tuple[Pool, int] | None = None
    refreshes: list[int] = field(default_factory=list)  # stage recomputations in decode, per stage
    # Question-time selection per layer (question_tokens > 0): final-stage chunks (starts [E], lens [E]) the
    # answer attends, and the last question_tokens pre-RoPE prefill queries [<= question_tokens, H, d].
    question: list[tuple[torch.Tensor, torch.Tensor] | None] = field(default_factory=list)
    recent_q: list[torch.Tensor | None] = field(default_factory=list)
    # The last stage's chunks joined with the question's (starts, lens [C + E]), updated in place when the last
    # stage refreshes: the join then runs once per refresh, not at every decode step.
    question_merged: list[tuple[torch.Tensor, torch.Tensor] | None] = field(default_factory=list)
    # Offloaded KV: the attention-bank rows of each layer's last key list, reused by steps that refresh no stage
    # (decode_rows.py); None until the first decode step, False when the cache cannot keep them.
    decode_rows: DecodeRows | bool | None = None
    mask_rows: MaskRows | bool | None = None  # the same for the last stage's mask-bank rows (mask_rows.py)
    # hierarchy_repeat_span > 0 (repeated_chunks.py): the prompt's stage-1 chunks of new text [N] bool, and per
    # decode stage-1 candidate count that mask cut or padded to it.
    novel: torch.Tensor | None = None
    novel_by_width: dict[int, torch.Tensor] = field(default_factory=dict)

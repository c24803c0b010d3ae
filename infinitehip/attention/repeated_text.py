"""Repeated prompt text: which prompt tokens repeat a stretch of text that came earlier in the same prompt.

Why: a long input may hold the same passage several times (a document pasted twice, boilerplate, a corpus
cycled to fill a context, as RULER's essay haystack is at 1M tokens). The question-time vote scores every
copy of a passage alike (keys are scored position-free), so its budget fills with c copies of the same few
passages, and the answer then attends each of them c times: c times the attention mass of a passage that
occurs once, such as the fact asked about. With `repeat_span` set, a method's question-time selection leaves
out every copy but the first (question_selection.py; infinitehip keeps no chunk that is all repeated text, so
filler that repeats leaves its budget unused); text that never repeats is selected as before.

A token counts as repeated when it lies inside a window of `span` consecutive tokens equal to a window that
starts earlier in the prompt. Windows are compared by a 64-bit hash, so copies need not be aligned to any grid
(a corpus whose length is no multiple of a chunk size repeats at a shifting offset).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

# Fixed odd multipliers of the window hash: the same prompt gives the same mask in every process.
_MULTIPLIERS = np.random.default_rng(0x5EED).integers(1, 2**63, size=4096, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def window_hashes(ids: np.ndarray, span: int) -> np.ndarray:
    """ids [T] -> [T - span + 1] uint64: a hash of each window ids[s : s + span] (sum of id x multiplier, mod 2^64)."""
    n = ids.size - span + 1
    x = ids.astype(np.uint64)
    h = np.zeros(n, dtype=np.uint64)
    for k in range(span):  # span vector ops over T tokens: ~30 ms at 1M tokens and span 32
        h += x[k : k + n] * _MULTIPLIERS[k]
    return h


def repeated_tokens(ids: Sequence[int] | np.ndarray, span: int) -> np.ndarray:
    """[T] bool: token t lies inside a window of `span` tokens whose text also starts at an earlier position."""
    if not 1 <= span <= _MULTIPLIERS.size:
        raise ValueError(f"span must be in [1, {_MULTIPLIERS.size}], got {span}")
    ids = np.asarray(ids, dtype=np.int64)
    T = ids.size
    out = np.zeros(T, dtype=bool)
    if T < span + 1:
        return out
    h = window_hashes(ids, span)
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    starts = np.flatnonzero(first[inverse] < np.arange(h.size))  # windows seen before
    if starts.size:
        cover = np.zeros(T + 1, dtype=np.int64)  # +1 where a repeated window starts, -1 past its end
        np.add.at(cover, starts, 1)
        np.add.at(cover, starts + span, -1)
        out = np.cumsum(cover[:T]) > 0
    return out


class PromptText:
    """A prompt's token ids as the attention methods see them at the prompt's last chunk (SequenceSlice.text); the
    repeat mask of each span is computed once per step and device, whichever layer asks first."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = ids
        self._masks: dict[tuple[int, str], torch.Tensor] = {}

    def repeated(self, span: int, device: torch.device) -> torch.Tensor:
        """[T] bool on device (repeated_tokens)."""
        key = (span, str(device))
        if key not in self._masks:
            self._masks[key] = torch.from_numpy(repeated_tokens(self.ids, span)).to(device)
        return self._masks[key]


def repeated_candidates(text: PromptText | None, span: int, start: int, end: int,
                        device: torch.device) -> torch.Tensor | None:
    """[end - start] bool: which candidate tokens [start, end) repeat earlier text (cache slot = prompt position:
    methods that never compact their cache); None when off (span 0) or when the caller has no prompt ids (the
    transformers integration)."""
    if span == 0 or text is None:
        return None
    if end > len(text.ids):
        raise ValueError(f"candidates up to {end} lie past the prompt's {len(text.ids)} tokens")
    return text.repeated(span, device)[start:max(start, end)]

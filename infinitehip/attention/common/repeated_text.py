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

from infinitehip.host_values import host_to_device

# Fixed odd multipliers of the window hash: the same prompt gives the same mask in every process. Stored as int64:
# products and sums wrap mod 2^64 alike on the CPU and on CUDA.
_MULTIPLIERS = torch.from_numpy(
    (np.random.default_rng(0x5EED).integers(1, 2**63, size=4096, dtype=np.uint64) * np.uint64(2) + np.uint64(1))
    .view(np.int64))


def window_hashes(ids: torch.Tensor, span: int) -> torch.Tensor:
    """ids [T] int64 -> [T - span + 1] int64: a hash of each window ids[s : s + span] (sum of id x multiplier,
    mod 2^64)."""
    n = ids.numel() - span + 1
    mult = _MULTIPLIERS[:span].tolist()
    h = ids[:n] * mult[0]
    for k in range(1, span):  # span vector ops over T tokens
        h += ids[k : k + n] * mult[k]
    return h


def repeated_tokens(ids: torch.Tensor, span: int) -> torch.Tensor:
    """ids [T] int64 -> [T] bool on ids' device: token t lies inside a window of `span` tokens whose text also starts
    at an earlier position. Sort-based and free of host syncs (one stable sort of the window hashes)."""
    if not 1 <= span <= _MULTIPLIERS.numel():
        raise ValueError(f"span must be in [1, {_MULTIPLIERS.numel()}], got {span}")
    T = ids.numel()
    if T < span + 1:
        return torch.zeros(T, dtype=torch.bool, device=ids.device)
    h = window_hashes(ids.long(), span)
    n = h.numel()
    # A stable sort keeps equal hashes in position order: every window but the first of its hash is a repeat.
    sorted_h, order = torch.sort(h, stable=True)
    seen_before = torch.zeros(n, dtype=torch.bool, device=ids.device)
    seen_before.scatter_(0, order[1:], sorted_h[1:] == sorted_h[:-1])
    # Cover each repeated window's span tokens: +1 where it starts, -1 past its end, running sum > 0.
    step = seen_before.to(torch.int32)
    cover = torch.zeros(T + 1, dtype=torch.int32, device=ids.device)
    cover[:n] += step
    cover[span : span + n] -= step
    return torch.cumsum(cover[:T], 0) > 0


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
            ids = torch.as_tensor(np.asarray(self.ids, dtype=np.int64))  # [T]; the engine's ids are a list
            self._masks[key] = repeated_tokens(host_to_device(ids, device), span)
        return self._masks[key]


def repeated_candidates(text: PromptText | None, span: int, start: int, end: int,
                        device: torch.device) -> torch.Tensor | None:
    """[end - start] bool: which candidate tokens [start, end) repeat earlier text (cache slot = prompt position:
    methods that never compact their cache); None when off (span 0) or when the caller has no prompt ids (a
    transformers forward from inputs_embeds)."""
    if span == 0 or text is None:
        return None
    if end <= start:  # no candidates: a prompt that ends inside the sink and stream
        return torch.zeros(0, dtype=torch.bool, device=device)
    if end > len(text.ids):
        raise ValueError(f"candidates up to {end} lie past the prompt's {len(text.ids)} tokens")
    return text.repeated(span, device)[start:end]

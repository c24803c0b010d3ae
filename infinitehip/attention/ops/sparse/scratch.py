"""Work buffers reused across calls (the CPU sparse attention's gathered keys and values).

On CPU a fresh tensor of tens of MB costs a page fault per 4 KiB page on first touch (glibc hands large
blocks back to the OS when they are freed), which is slower than the gather that fills it; a buffer kept
between calls is already mapped. Each name holds one flat buffer, grown when a call needs more. A tensor
taken from it is valid until the next `take` of the same name: callers never return one.
"""

from __future__ import annotations

import math

import torch


class ScratchBuffers:
    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised tensor of `shape` backed by the buffer `name` (contiguous)."""
        numel = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
            with torch.inference_mode(False):  # a normal tensor: usable (in place) inside and outside inference mode
                buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf[:numel].view(shape)

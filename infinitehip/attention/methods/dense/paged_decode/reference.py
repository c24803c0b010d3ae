"""The eager oracle of the paged dense decode (and the CPU path): gather every page, rotate, masked softmax.

One batched pass for all sequences: each sequence's tokens are gathered from its page table up to the padded
width P * page_size, keys rotated at their positions (cache index = position), and keys past the sequence's
length (or before its sliding window) masked out of one batched attention (`softcap.attend`, SDPA when no cap).
"""

from __future__ import annotations

import torch

from infinitehip.attention.common.softcap import attend
from infinitehip.model.rope import apply_rotary


def paged_decode_reference(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, page_tables: torch.Tensor,
                           lengths: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scale: float | None = None,
                           window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """q [B, H, d] (rotated at position lengths - 1); k/v pages [num_pages, page_size, Hkv, d] (keys without RoPE);
    page_tables [B, P] (zero-padded); lengths [B] tokens per sequence (>= 1, <= P * page_size); cos/sin
    [positions, d/2] fp32 RoPE tables; scale None: d ** -0.5; window: only the last `window` keys; softcap: Gemma 2's
    tanh cap on the scaled scores -> [B, H, d] in q's dtype."""
    B, H, d = q.shape
    page_size = k_pages.shape[1]
    width = page_tables.shape[1] * page_size  # static: no host read of the lengths
    tokens = torch.arange(width, device=q.device)
    slots = (page_tables.long()[:, tokens // page_size] * page_size + tokens % page_size)  # [B, width]
    lengths = lengths.long()[:, None]
    visible = tokens[None, :] < lengths  # [B, width]
    if window is not None:
        visible &= tokens[None, :] >= lengths - window
    # Slots past a sequence's end were never written (uninitialised memory, NaN possible): zeroed, since a masked
    # score still multiplies its value (0 * NaN = NaN).
    written = (tokens[None, :] < lengths)[..., None, None]
    k = torch.where(written, k_pages.flatten(0, 1)[slots].to(q.dtype), 0)  # [B, width, Hkv, d]
    v = torch.where(written, v_pages.flatten(0, 1)[slots].to(q.dtype), 0)
    rows = tokens.clamp(max=cos.shape[0] - 1)  # rows past the table are masked keys' only
    k = apply_rotary(k, cos[rows][:, None], sin[rows][:, None])
    if scale is not None:  # attend scales by d ** -0.5: fold the rest into q (exact for powers of two only)
        q = q * (scale * d ** 0.5)
    out = attend(q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), visible[:, None, None], softcap)
    return out[:, :, 0]  # [B, H, d]

"""The paged dense decode op: q [B, H, d] of one new token per sequence over each sequence's paged cache of one layer.

Keys sit in the cache without RoPE and are rotated at their positions (cache index) when read; GQA (H a multiple of
Hkv); optionally only the last `window` keys (sliding-window layers) and Gemma 2's logit soft-capping.

- reference (`reference.py`): gathers every page of every sequence, rotates, one masked batched attention; the
  oracle, and the path of CPU tensors.
- triton (`triton.py`): split-K flash decoding, each page read once per step; the path of CUDA tensors.
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.dense.paged_decode.reference import paged_decode_reference
from infinitehip.config.impl import select_impl


def paged_decode(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, page_tables: torch.Tensor,
                 lengths: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scale: float | None = None,
                 window: int | None = None, softcap: float | None = None, impl: str | None = None) -> torch.Tensor:
    """q [B, H, d] rotated at position lengths - 1; k/v pages [num_pages, page_size, Hkv, d]; page_tables [B, P]
    (zero-padded, int); lengths [B] (device tensor, 1 <= length <= P * page_size); cos/sin [positions, d/2] fp32
    (or fp16) tables covering every key position; scale None: d ** -0.5 -> [B, H, d] in q's dtype.
    impl None: "triton" for CUDA tensors, "reference" otherwise."""
    impl = impl or ("triton" if q.is_cuda else "reference")
    fn = select_impl(impl, paged_decode_reference, "infinitehip.attention.methods.dense.paged_decode.triton",
                     "paged_decode_triton", "paged dense decode")
    return fn(q, k_pages, v_pages, page_tables, lengths, cos, sin, scale=scale, window=window, softcap=softcap)

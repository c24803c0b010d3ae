"""The decode step's key list: sink + the last stage's chunks (below the window) + the window, with RoPE positions.

- `reference`: eager PyTorch, the oracle.
- `triton`: one Triton kernel (one program per sequence), imported on first use.

`decode_key_list(..., impl=...)` dispatches; see `reference.py` for the arguments.
"""

from __future__ import annotations

import torch

from infinitehip.attention.methods.infinitehip.keylist.reference import decode_key_list_reference, key_list_width
from infinitehip.config.impl import select_impl


def decode_key_list(
    starts: torch.Tensor, lens: torch.Tensor, chunk_size: int, limits: torch.Tensor, positions: torch.Tensor,
    sink: int, window: int, style: str, group: int, impl: str = "triton",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (key_tokens [B, K] int32, key_counts [B] int32, key_rope_pos [B, K] int32, query_rope_pos [B] int32)."""
    fn = select_impl(impl, decode_key_list_reference, f"infinitehip.attention.methods.infinitehip.keylist.triton", "decode_key_list_triton", "key list")
    return fn(starts, lens, chunk_size, limits, positions, sink, window, style, group)


__all__ = ["decode_key_list", "key_list_width"]

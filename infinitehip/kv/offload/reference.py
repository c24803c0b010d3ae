"""Row copy between flat slot tensors, eager PyTorch: the oracle for `triton.py` beside it.

copy_rows(src, src_rows, dst, dst_rows): for every i with src_rows[i] >= 0 and dst_rows[i] >= 0,
dst[dst_rows[i]] = src[src_rows[i]]. src and dst are [rows, ...] with the same row shape and may live
on different devices (the host store and a GPU bank); active dst rows must be distinct. Equal dtypes copy
bit-exactly; a store in another float dtype (FP8, BF16) is converted to the destination's (a bank in the
model's dtype). This path selects the active rows with a boolean mask and moves indices between devices, so on CUDA it syncs
with the host: it is the reference, not the decode path.
"""

from __future__ import annotations

import torch


def copy_rows_reference(src: torch.Tensor, src_rows: torch.Tensor, dst: torch.Tensor, dst_rows: torch.Tensor) -> None:
    active = (src_rows >= 0) & (dst_rows >= 0)
    s = src_rows[active].to(src.device)
    d = dst_rows[active].to(dst.device)
    # As raw bytes: bit-exact for every storage dtype (torch has no index_copy_ / index_select for FP8 on CPU).
    rows = src.view(torch.uint8).index_select(0, s).to(dst.device)
    if src.dtype == dst.dtype:
        dst.view(torch.uint8).index_copy_(0, d, rows)
    else:
        dst.index_copy_(0, d, rows.view(src.dtype).to(dst.dtype))

"""Row copy between flat slot tensors, one Triton kernel; same semantics as `reference.py` (the oracle).

The rows are moved as raw words (int32 when a row's bytes allow it, else int16 / uint8), so every storage
dtype (fp32, bf16, fp16, fp8) is copied bit-exactly by one kernel. Grid: (rows, row tiles); a program
whose source or destination row is negative loads and stores nothing (masked), so a resolve call with 90%
hits reads only the missed rows from host memory. On CUDA either side may be pinned host memory: with
unified virtual addressing its pointer is valid in kernels, so the copy needs no host sync and no
cudaMemcpy, and it can be captured in a CUDA graph. Under TRITON_INTERPRET=1 both sides are CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.attention.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def _copy_rows_kernel(Src, SrcRows, Dst, DstRows, row_words, stride_src, stride_dst, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    tile = tl.program_id(1)
    s = tl.load(SrcRows + r).to(tl.int64)
    d = tl.load(DstRows + r).to(tl.int64)
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    ok = (offs < row_words) & (s >= 0) & (d >= 0)
    x = tl.load(Src + s * stride_src + offs, mask=ok, other=0)
    tl.store(Dst + d * stride_dst + offs, x, mask=ok)


def _as_words(t: torch.Tensor) -> torch.Tensor:
    """[rows, ...] -> a [rows, words] view of the same memory (never a copy: the kernel writes through it)."""
    rows = t.view(t.shape[0], -1) if t.dim() > 1 else t.view(-1, 1)
    if rows.stride(-1) != 1:
        raise ValueError("copy_rows needs rows that are contiguous in memory")
    raw = rows.view(torch.uint8)
    for word in (torch.int32, torch.int16):
        if raw.shape[1] % word.itemsize == 0:
            return raw.view(word)
    return raw


def copy_rows_triton(src: torch.Tensor, src_rows: torch.Tensor, dst: torch.Tensor, dst_rows: torch.Tensor) -> None:
    if src.dtype != dst.dtype or src.shape[1:] != dst.shape[1:]:
        raise ValueError(f"copy_rows: src {src.dtype} {tuple(src.shape[1:])} and dst {dst.dtype} {tuple(dst.shape[1:])} rows differ")
    n = src_rows.numel()
    if n != dst_rows.numel():
        raise ValueError(f"copy_rows: {n} source rows but {dst_rows.numel()} destination rows")
    if n == 0:
        return
    s, d = _as_words(src), _as_words(dst)
    row_words = s.shape[1]
    block = min(1024, triton.next_power_of_2(row_words))
    grid = (n, triton.cdiv(row_words, block))
    _copy_rows_kernel[grid](s, src_rows, d, dst_rows, row_words, s.stride(0), d.stride(0), BLOCK=block)

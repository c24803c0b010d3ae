"""Split-K (flash-decoding) partials and their merge, shared by the decode kernels that split a query's keys over
programs (this package's sparse decode, dense's paged decode): each split writes its normalized partial output and
its log2-sum-exp, and one program per (sequence, head) row merges them.

`dot_precision` is the dots' precision of these kernels: IEEE fp32 for fp32 inputs (so they match the fp32 oracles),
tensor cores of the input dtype otherwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def combine_splits_kernel(
    PartOut, PartLse, Out, num_heads, num_splits, stride_ob, stride_oh,
    D: tl.constexpr, D_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    row = tl.program_id(0)  # b * num_heads + h
    b = row // num_heads
    h = row % num_heads
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, D_PAD)
    s_ok = offs_s < num_splits
    base = row.to(tl.int64) * num_splits
    lse = tl.load(PartLse + base + offs_s, mask=s_ok, other=float("-inf"))
    part = tl.load(PartOut + (base + offs_s)[:, None] * D + offs_d[None, :],
                   mask=s_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    denom = tl.sum(w, 0)
    out = tl.sum(w[:, None] * part, 0) / tl.where(denom > 0.0, denom, 1.0)
    tl.store(Out + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d, out.to(Out.dtype.element_ty),
             mask=offs_d < D)


def dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # tf32 is ignored for 16-bit inputs


def split_partials(out: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A split-K launch's partial outputs [B, H, num_splits, d] and log2-sum-exps [B, H, num_splits] (fp32) for
    `out` [B, H, d]; with one split the kernel writes `out` itself and both are `out` (unused)."""
    if num_splits == 1:
        return out, out
    B, H, d = out.shape
    return (torch.empty(B, H, num_splits, d, dtype=torch.float32, device=out.device),
            torch.empty(B, H, num_splits, dtype=torch.float32, device=out.device))


def merge_splits(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """Write into `out` [B, H, d] the merge of a split-K launch's partials (`split_partials`), one program per row."""
    B, H, d = out.shape
    num_splits = part_lse.shape[-1]
    combine_splits_kernel[(B * H,)](
        part_out, part_lse, out, H, num_splits, out.stride(0), out.stride(1),
        D=d, D_PAD=triton.next_power_of_2(d), SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
        num_warps=4 if d >= 128 else 2,
    )

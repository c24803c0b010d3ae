"""rotate_at as one Triton kernel: the table rows gathered by position, the pair rotation in fp32 in the reference's
order (x1 cos - x2 sin, x2 cos + x1 sin, each product rounded: fused multiply-adds off), rounded to x's dtype.

One program per position: its H heads x d/2 pairs in one block (at most 16,384 pairs: 128 heads of d 256)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def _rotate_at_kernel(X, Pos, Cos, Sin, Out, H, HALF, stride_xn, stride_xh, stride_t,
                      BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    p = tl.load(Pos + n).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    h = tl.arange(0, BLOCK_H)
    d_ok = d < HALF
    ok = (h[:, None] < H) & d_ok[None, :]
    c = tl.load(Cos + p * stride_t + d, mask=d_ok, other=0.0)[None, :]
    s = tl.load(Sin + p * stride_t + d, mask=d_ok, other=0.0)[None, :]
    src = X + n * stride_xn + h[:, None] * stride_xh + d[None, :]
    x1 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=ok, other=0.0).to(tl.float32)
    dst = Out + n * H * 2 * HALF + h[:, None] * 2 * HALF + d[None, :]
    tl.store(dst, (x1 * c - x2 * s).to(Out.dtype.element_ty), mask=ok)
    tl.store(dst + HALF, (x2 * c + x1 * s).to(Out.dtype.element_ty), mask=ok)


def rotate_at_triton(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    *lead, H, d = x.shape
    if tuple(positions.shape) != tuple(lead) or d % 2 or cos.shape != sin.shape or cos.shape[-1] != d // 2:
        raise ValueError(f"x [*P, H, d] with positions [*P] and tables [*, d/2] expected, got x {tuple(x.shape)}, "
                         f"positions {tuple(positions.shape)}, tables {tuple(cos.shape)}")
    block_h, block_d = triton.next_power_of_2(H), triton.next_power_of_2(d // 2)
    if block_h * block_d > 16384 or cos.dtype != torch.float32 or cos.stride(-1) != 1 or sin.stride() != cos.stride():
        raise ValueError(f"at most 16,384 pairs a position and fp32 tables of one layout, got H {H}, d {d}, {cos.dtype}")
    rows = x.reshape(-1, H, d)  # a view where the layout allows
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        _rotate_at_kernel[(rows.shape[0],)](rows, positions.reshape(-1), cos, sin, out, H, d // 2, rows.stride(0),
                                            rows.stride(1), cos.stride(0), BLOCK_H=block_h, BLOCK_D=block_d,
                                            enable_fp_fusion=False)
    return out.view(x.shape)

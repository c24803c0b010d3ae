"""rms_norm as one Triton kernel (same roundings as `reference.py`; the sum of squares in another order).

One program per row of D values (D <= 16384 fits one block): load, fp32 sum of squares, rsqrt, scale, round as the
family does, store."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def _rms_norm_kernel(X, W, Out, D, eps, stride_x, GEMMA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < D
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    y = x * rstd
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    if GEMMA:
        out = y * (1.0 + w)
    else:  # round to the activation dtype first, then the weight's product rounds again on the store
        out = y.to(X.dtype.element_ty).to(tl.float32) * w
    tl.store(Out + row * D + cols, out.to(Out.dtype.element_ty), mask=ok)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    D = x.shape[-1]
    if weight.shape != (D,) or D > 16384:
        raise ValueError(f"weight [{D}] expected (rows of at most 16384), got {tuple(weight.shape)}")
    rows = x.reshape(-1, D)  # a view where the layout allows (q / k heads split from the fused projection do not)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    # The Llama rounding multiplies two values of x's dtype; its product's dtype is what torch gives the two.
    dtype = x.dtype if gemma else torch.promote_types(x.dtype, weight.dtype)
    out = torch.empty(rows.shape, dtype=dtype, device=x.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(D)
        _rms_norm_kernel[(rows.shape[0],)](rows, weight, out, D, eps, rows.stride(0), GEMMA=gemma, BLOCK=block,
                                           num_warps=8 if block >= 4096 else 4)
    return out.view(x.shape)

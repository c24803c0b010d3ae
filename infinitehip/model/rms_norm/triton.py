"""rms_norm as one Triton kernel (same roundings as `reference.py`; the sum of squares in another order).

One program per row of D values (D <= 16384 fits one block): load, fp32 sum of squares, rsqrt, scale, round as the
family does, store. With a residual the kernel first adds it (fp32 sum rounded to the activation dtype, as torch's
add does), stores that sum (the residual stream) and normalises it: the same values as the add then the plain
kernel, in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def _rms_norm_kernel(X, R, W, Out, Sum, D, eps, stride_x, stride_r, GEMMA: tl.constexpr, RESIDUAL: tl.constexpr,
                     BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < D
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if RESIDUAL:  # x + r rounded as torch rounds it; the norm reads the rounded sum
        r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
        s = (x + r).to(Sum.dtype.element_ty)
        tl.store(Sum + row * D + cols, s, mask=ok)
        x = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    y = x * rstd
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    if GEMMA:
        out = y * (1.0 + w)
    else:  # round to the activation dtype first, then the weight's product rounds again on the store
        out = y.to(X.dtype.element_ty).to(tl.float32) * w
    tl.store(Out + row * D + cols, out.to(Out.dtype.element_ty), mask=ok)


def _rows(x: torch.Tensor, D: int) -> torch.Tensor:
    rows = x.reshape(-1, D)  # a view where the layout allows (q / k heads split from the fused projection do not)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, gemma: bool):
    D = x.shape[-1]
    if weight.shape != (D,) or D > 16384:
        raise ValueError(f"weight [{D}] expected (rows of at most 16384), got {tuple(weight.shape)}")
    rows = _rows(x, D)
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"residual {tuple(residual.shape)} and x {tuple(x.shape)} differ")
        res = _rows(residual, D)
        total = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, residual.dtype), device=x.device)
    else:
        res = total = rows  # unused: RESIDUAL is off
    normed_dtype = total.dtype if residual is not None else x.dtype
    # The Llama rounding multiplies two values of the activation dtype; its product's dtype is what torch gives them.
    dtype = normed_dtype if gemma else torch.promote_types(normed_dtype, weight.dtype)
    out = torch.empty(rows.shape, dtype=dtype, device=x.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(D)
        _rms_norm_kernel[(rows.shape[0],)](rows, res, weight, out, total, D, eps, rows.stride(0), res.stride(0),
                                           GEMMA=gemma, RESIDUAL=residual is not None, BLOCK=block,
                                           num_warps=8 if block >= 4096 else 4)
    return out.view(x.shape), total.view(x.shape)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    return _launch(x, None, weight, eps, gemma)[0]


def add_rms_norm_triton(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                        gemma: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(x, residual, weight, eps, gemma)

"""FP8 (e4m3) checkpoints: weights dequantized with their scales while loading, to the model's dtype.

Two layouts, both `weight * scale`: `quant_method: fp8` checkpoints (DeepSeek-V3, Qwen3-FP8) store
`<name>.weight_scale_inv` per [128 x 128] block (config `weight_block_size`); per-tensor / per-channel ones
store `<name>.weight_scale` (a scalar, [out] or [out, 1]). Activation scales (`input_scale`) are dropped:
activations stay in the model's dtype.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

import torch

SCALE_SUFFIXES = (".weight_scale_inv", ".weight_scale")
_DROPPED_SUFFIXES = (".input_scale", ".activation_scale")
FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, n))


def dequantize(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, ...] = ()) -> torch.Tensor:
    """weight [out, in] fp8, scale scalar / [out] / [out, 1] / [ceil(out / bo), ceil(in / bi)] with block (bo, bi)
    (the config's weight_block_size: edge blocks are partial) -> float32 [out, in]."""
    w, s = weight.float(), scale.float()
    if s.dim() == 2 and s.shape[1] > 1:  # block scales: expand each to its block, cut at the matrix's edge
        bo, bi = block or (-(-w.shape[0] // s.shape[0]), -(-w.shape[1] // s.shape[1]))
        s = s.repeat_interleave(bo, 0)[: w.shape[0]].repeat_interleave(bi, 1)[:, : w.shape[1]]
    elif s.dim() == 1 and s.numel() > 1:
        s = s[:, None]
    return w * s


def dequantize_fp8(tensors: Iterable[tuple[str, torch.Tensor]], scale_of: Callable[[str], torch.Tensor | None],
                   block: tuple[int, ...] = ()) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with fp8 weights dequantized; scale_of(name) reads a scale tensor (any file)."""
    for name, tensor in tensors:
        if name.endswith(SCALE_SUFFIXES + _DROPPED_SUFFIXES):
            continue
        if tensor.dtype in FP8_DTYPES:
            base = name.removesuffix(".weight")
            scale = next((s for s in (scale_of(base + suffix) for suffix in SCALE_SUFFIXES) if s is not None), None)
            if scale is None:
                raise ValueError(f"fp8 tensor {name!r} has no {base}.weight_scale_inv / .weight_scale in the checkpoint")
            tensor = dequantize(tensor, scale, block)
        yield name, tensor

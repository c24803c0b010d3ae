"""A GGUF file's metadata as Hugging Face config fields (gguf_convert.py writes the rest): what llama.cpp stores
under its own keys, or not at all (Llama 3's rope scaling as a tensor of factors, Gemma 3's layer pattern, softcaps
and query scale), read back the way transformers' GGUF loader and llama.cpp mean it; and one tensor's float32 values.
"""

from __future__ import annotations

import math
from typing import Any

import gguf
import numpy as np


def meta(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.get_field(key)
    return default if field is None else field.contents()


def dequantize(tensor: Any) -> np.ndarray:
    """float32 values of one GGUF tensor in numpy (row-major, Hugging Face) dimension order."""
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists the fastest dimension first
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False).reshape(shape)


def llama3_rope_from_factors(factors: np.ndarray, theta: float, head_dim: int) -> dict | None:
    """Recover llama3 rope_scaling from the rope_freqs tensor llama.cpp writes instead of metadata.

    llama.cpp stores 1 (high freq), `factor` (low freq) or 1/((1-s)/factor + s) in between, where
    s = (orig_ctx / wavelen - low) / (high - low) is affine in the frequency. Only the ratios of
    (orig_ctx, low, high) are determined by the tensor, and only they matter to the rotary math, so we
    anchor orig_ctx at Llama 3's 8192 and fit low/high from the smoothed band."""
    factors = factors.astype(np.float64).ravel()
    factor = float(factors.max())
    if factor <= 1.0 + 1e-6:
        return None
    orig_ctx, low, high = 8192, 1.0, 4.0  # Llama 3.x values, used when the band is too narrow to fit
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    mid = (factors > 1.0 + 1e-6) & (factors < factor - 1e-6)
    if mid.sum() >= 2:
        smooth = (1.0 / factors[mid] - 1.0 / factor) / (1.0 - 1.0 / factor)
        slope, intercept = np.polyfit(freqs[mid], smooth, 1)
        span = orig_ctx / (2 * math.pi * slope)  # = high - low
        low, high = -intercept * span, (1 - intercept) * span
    def r(x: float) -> float:  # drop float32 fitting noise: 1.0000003 -> 1.0
        return float(f"{x:.6g}")

    return {"rope_type": "llama3", "factor": r(factor), "low_freq_factor": r(low), "high_freq_factor": r(high),
            "original_max_position_embeddings": orig_ctx}


def rope_scaling(reader: gguf.GGUFReader, arch: str, theta: float, head_dim: int) -> dict | None:
    kind = meta(reader, f"{arch}.rope.scaling.type")
    factor = meta(reader, f"{arch}.rope.scaling.factor")
    if kind in ("linear", "yarn") and factor is not None:
        scaling: dict[str, Any] = {"rope_type": kind, "factor": float(factor)}
        extra = {"original_context_length": ("original_max_position_embeddings", int),
                 "yarn_beta_fast": ("beta_fast", float), "yarn_beta_slow": ("beta_slow", float),
                 "yarn_attn_factor": ("attention_factor", float)}
        for gguf_key, (hf_key, cast) in extra.items():
            value = meta(reader, f"{arch}.rope.scaling.{gguf_key}")
            if value is not None:
                scaling[hf_key] = cast(value)
        return scaling
    tensor = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if arch == "llama" and tensor is not None:
        return llama3_rope_from_factors(dequantize(tensor), theta, head_dim)
    return None


def layer_types(reader: gguf.GGUFReader, arch: str, n_layer: int) -> list[str]:
    """Gemma 3's per-layer attention kind, with llama.cpp's meaning of `attention.sliding_window_pattern`:
    a bool per layer (true: sliding window) or a period n (every n-th layer global; 0: all sliding).
    Without it, llama.cpp's gemma3 default: period 6, i.e. layer i is global iff (i + 1) % 6 == 0."""
    pattern = meta(reader, f"{arch}.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise ValueError(f"sliding_window_pattern has {len(pattern)} entries for {n_layer} layers")
        sliding = [bool(p) for p in pattern]
    else:
        period = int(pattern)
        sliding = [period == 0 or (i + 1) % period != 0 for i in range(n_layer)]
    return ["sliding_attention" if s else "full_attention" for s in sliding]


def gemma3_config(reader: gguf.GGUFReader, arch: str, base: dict) -> dict:
    """Gemma3TextConfig fields on top of the common ones (the same meaning as transformers' GGUF loader,
    plus what llama.cpp hard-codes for gemma3 instead of storing it)."""
    n_layer, head_dim = base["num_hidden_layers"], base["head_dim"]
    window = meta(reader, f"{arch}.attention.sliding_window")
    # llama.cpp scales queries by 1/sqrt(head_dim), except for the 27B (62 layers): 1/sqrt(hidden / heads).
    scalar = base["hidden_size"] // base["num_attention_heads"] if n_layer == 62 else head_dim
    final_cap = meta(reader, f"{arch}.final_logit_softcapping")
    attn_cap = meta(reader, f"{arch}.attn_logit_softcapping")
    return {
        **base,
        "hidden_activation": "gelu_pytorch_tanh",
        # rope_theta/rope_scaling are the global layers'; the local layers have their own base, which
        # gemma3 GGUFs usually omit (llama.cpp then uses 10000) and never scale.
        "rope_local_base_freq": float(meta(reader, f"{arch}.rope.freq_base_swa", 10000.0)),
        "sliding_window": int(window) if window else None,
        "layer_types": layer_types(reader, arch, n_layer),
        "query_pre_attn_scalar": scalar,
        "final_logit_softcapping": None if final_cap is None else float(final_cap),
        "attn_logit_softcapping": None if attn_cap is None else float(attn_cap),
    }

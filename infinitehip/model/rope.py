"""Rotary position embeddings: frequency tables computed once, applied at any position.

Keys live in the KV cache without RoPE, so attention methods rotate with whatever positions they choose
(original, chunk-indexed, streaming-style, ...): `apply_range` for consecutive positions, or `apply_rotary`
with rows of the `cos`/`sin` tables. Layout is Hugging Face's
"rotate half" convention: the pair of dimension i is (i, i + head_dim / 2).
"""

from __future__ import annotations

import math

import torch

from infinitehip.config.model import ModelConfig, RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """[head_dim / 2] float64 inverse frequencies, with linear, llama3, yarn or longrope scaling applied.

    yarn / longrope also scale q.k by `scaling.attention_factor` squared: the decoder folds that into q."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling.kind == "yarn":
        return _yarn(inv_freq, head_dim, theta, scaling)
    if scaling.kind == "longrope":
        # The long factors at every length: keys are rotated when read, so one table serves the whole context.
        # transformers switches to them only once a forward's positions pass original_max_position (below that
        # its short factors give slightly different logits; past it, and for every key it re-reads, ours agree).
        factors = torch.tensor(scaling.long_factor, dtype=torch.float64)
        if factors.numel() != inv_freq.numel():
            raise ValueError(f"longrope long_factor has {factors.numel()} entries, head_dim / 2 is {inv_freq.numel()}")
        return inv_freq / factors
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "llama3":
        # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, a smooth ramp between.
        low_wavelen = scaling.original_max_position / scaling.low_freq_factor
        high_wavelen = scaling.original_max_position / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
        is_medium = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
        return torch.where(is_medium, blended, scaled)
    return inv_freq


def _yarn(inv_freq: torch.Tensor, head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """YaRN (NTK-by-parts): dimensions rotating fewer than beta_slow times over the original context are
    interpolated (divided by factor), those rotating more than beta_fast times kept, a linear ramp between."""

    def dim_of(rotations: float) -> float:  # the dimension whose wavelength fits `rotations` times
        return head_dim * math.log(scaling.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(scaling.beta_fast), dim_of(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (original frequency), 0: interpolate
    return inv_freq / scaling.factor * (1 - keep) + inv_freq * keep


class RotaryEmbedding:
    """cos/sin tables [max_positions, head_dim / 2] in float32, grown (by doubling) on demand; cos16/sin16 the same in
    float16 (what a decode kernel reads beside every cached key: half the bytes, the rotation itself in float32)."""

    def __init__(self, config: ModelConfig, max_positions: int, device: torch.device | str = "cpu"):
        self.inv_freq = inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
        self.device = torch.device(device)
        self.cos = torch.empty(0, config.head_dim // 2, device=self.device)
        self.sin = torch.empty_like(self.cos)
        self._build(max_positions)

    @property
    def max_positions(self) -> int:
        return self.cos.shape[0]

    def _build(self, n: int) -> None:
        # float64 angles: position * inv_freq loses precision in float32 beyond ~1M positions.
        angles = torch.outer(torch.arange(n, dtype=torch.float64), self.inv_freq)
        self.cos = angles.cos().to(self.device, torch.float32)
        self.sin = angles.sin().to(self.device, torch.float32)
        self.cos16, self.sin16 = self.cos.half(), self.sin.half()

    def decode_tables(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables a decode kernel reads beside each cached key of a `dtype` cache: fp16 for 16-bit caches (half
        the bytes; their error is below the keys' own rounding), fp32 for fp32."""
        return (self.cos, self.sin) if dtype == torch.float32 else (self.cos16, self.sin16)

    def ensure(self, n: int) -> None:
        if n > self.max_positions:
            self._build(max(n, 2 * self.max_positions))

    def apply_range(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """x: [T, heads, head_dim] at consecutive positions start..start+T-1 (table slices, no gather)."""
        end = start + x.shape[0]
        self.ensure(end)
        return apply_rotary(x, self.cos[start:end].unsqueeze(1), self.sin[start:end].unsqueeze(1))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + d/2) of x [..., d] by angles whose cos/sin are [..., d/2] (broadcast)."""
    half = x.shape[-1] // 2
    x1 = x[..., :half].float()
    x2 = x[..., half:].float()
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


def apply_rotary_fused(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`apply_rotary` for fp32 x in three passes (fewer, larger ops: the CPU paths' choice), equal up to fp32
    rounding: x * (cos | cos) + (x2 | x1) * (-sin | sin), the tables widened to [..., d] first."""
    half = x.shape[-1] // 2
    out = torch.cat([x[..., half:], x[..., :half]], dim=-1)
    return out.mul_(torch.cat([-sin, sin], -1)).addcmul_(x, torch.cat([cos, cos], -1))


def rotary_at(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [N, head_dim / 2] float32 at positions [N] computed on the fly (float64 angles, as the tables):
    for callers that must not hold a table as long as the context (sliding-window layers at 1M tokens)."""
    angles = positions.to(torch.float64)[:, None] * inv_freq.to(positions.device)[None, :]
    return angles.cos().float(), angles.sin().float()

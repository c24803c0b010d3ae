"""Architecture description of a Llama-family decoder, read from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# Hugging Face `model_type` -> what differs from plain Llama.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedArchitectureError(ValueError):
    pass


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. `kind` is "default" (none), "linear" or "llama3"."""

    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ("default", "linear", "llama3"):
            raise UnsupportedArchitectureError(
                f"rope_scaling type {self.kind!r} is not supported; supported: default, linear, llama3"
            )
        if self.factor <= 0:
            raise ValueError(f"rope_scaling.factor must be > 0, got {self.factor}")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projection bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @classmethod
    def from_hf_dict(cls, hf: dict) -> "ModelConfig":
        model_type = hf.get("model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            archs = hf.get("architectures") or [model_type]
            raise UnsupportedArchitectureError(
                f"unsupported architecture {archs[0]!r} (model_type {model_type!r}); "
                f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)} "
                "(Llama 2/3/3.1/3.2, Mistral, Qwen2/2.5, Qwen3, SmolLM2)"
            )
        if model_type == "mistral" and hf.get("sliding_window") not in (None, 0):
            # Sliding-window Mistral (v0.1) would silently differ from the trained model under full attention.
            if hf["sliding_window"] < hf.get("max_position_embeddings", 0):
                raise UnsupportedArchitectureError(
                    f"Mistral with sliding_window={hf['sliding_window']} is not supported "
                    "(only full-attention Mistral, v0.2 and later)"
                )
        num_heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(hf),
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type == "qwen3",
            rope_scaling=_rope_scaling(hf),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in model directory {model_dir}")
        return cls.from_hf_dict(json.loads(path.read_text()))


def _rope_params(hf: dict) -> dict:
    # transformers 5 moved theta/scaling into `rope_parameters`; older configs keep `rope_scaling`.
    return hf.get("rope_parameters") or hf.get("rope_scaling") or {}


def _rope_theta(hf: dict) -> float:
    return float(_rope_params(hf).get("rope_theta", hf.get("rope_theta", 10000.0)))


def _rope_scaling(hf: dict) -> RopeScaling:
    params = _rope_params(hf)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return RopeScaling()
    return RopeScaling(
        kind=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
    )

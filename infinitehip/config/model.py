"""Architecture description of a supported decoder (Llama family, Phi-3, Gemma 2/3), read from a Hugging Face config.json."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

# Hugging Face `model_type` -> what differs from plain Llama.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text")
GEMMA_TYPES = ("gemma2", "gemma3_text")  # Gemma norms, sandwich layers, GeGLU, scaled embeddings
FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"  # transformers' layer_types values


class UnsupportedArchitectureError(ValueError):
    pass


ROPE_KINDS = ("default", "linear", "llama3", "yarn", "longrope")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling, as transformers' rope_parameters define it (model/rope.py computes it)."""

    kind: str = "default"  # one of ROPE_KINDS
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position: int = 8192  # llama3, yarn, longrope: the pretraining context
    beta_fast: float = 32.0  # yarn: rotations bounding the extrapolated (unscaled) dimensions
    beta_slow: float = 1.0  # yarn: rotations bounding the interpolated (scaled by 1 / factor) dimensions
    truncate: bool = True  # yarn: round the correction range to whole dimensions
    short_factor: tuple[float, ...] = ()  # longrope: per-frequency divisors within original_max_position
    long_factor: tuple[float, ...] = ()  # longrope: per-frequency divisors beyond it
    # yarn / longrope: q.k is scaled by this squared (transformers multiplies cos and sin by it); 1.0 otherwise
    attention_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ROPE_KINDS:
            raise UnsupportedArchitectureError(
                f"rope_scaling type {self.kind!r} is not supported; supported: {', '.join(ROPE_KINDS)}"
            )
        if self.factor <= 0:
            raise ValueError(f"rope_scaling.factor must be > 0, got {self.factor}")
        if self.kind == "longrope" and not (self.short_factor and self.long_factor):
            raise ValueError("longrope rope_scaling needs short_factor and long_factor")


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
    # Gemma 3: hybrid layers and its norm / MLP / scaling conventions (defaults are Llama's).
    layer_types: tuple[str, ...] = ()  # per layer FULL_ATTENTION or SLIDING_ATTENTION; empty: all full
    sliding_window: int | None = None  # keys a sliding layer's query sees, itself included (kv > q - window)
    sliding_rope_theta: float | None = None  # RoPE base of the sliding layers (None: rope_theta)
    query_pre_attn_scalar: float | None = None  # scores scaled by this ** -0.5 instead of head_dim ** -0.5
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None  # Gemma 2: scores -> tanh(s / cap) * cap before the softmax
    fp8_weights: bool = False  # an FP8 (e4m3) checkpoint: weights dequantized with their scales while loading
    fp8_weight_block: tuple[int, ...] = ()  # its [rows, cols] per block scale (weight_block_size); () per-tensor/channel

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.layer_types:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
            unknown = set(self.layer_types) - {FULL_ATTENTION, SLIDING_ATTENTION}
            if unknown:
                raise UnsupportedArchitectureError(f"layer types {sorted(unknown)} are not supported")
            if SLIDING_ATTENTION in self.layer_types and not (self.sliding_window and self.sliding_window > 0):
                raise ValueError("sliding-window layers need a positive sliding_window")
            if FULL_ATTENTION not in self.layer_types:
                raise UnsupportedArchitectureError("a model without any full-attention layer has no long context "
                                                   "for an attention method to govern")

    @property
    def is_gemma(self) -> bool:
        return self.model_type in GEMMA_TYPES

    @property
    def full_layers(self) -> tuple[int, ...]:
        """Indices of the layers that attend the whole context: the ones the attention method governs."""
        return tuple(i for i in range(self.num_layers) if not self.layer_types or self.layer_types[i] == FULL_ATTENTION)

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        """Indices of the sliding-window layers (exact local attention over a ring buffer of the window)."""
        return tuple(i for i in range(self.num_layers) if self.layer_types and self.layer_types[i] == SLIDING_ATTENTION)

    def method_view(self) -> "ModelConfig":
        """The model as an attention method and its KV cache see it: only the full-attention layers, renumbered
        0..n-1 in order (the same config when every layer is full)."""
        if not self.sliding_layers:
            return self
        return dataclasses.replace(self, num_layers=len(self.full_layers), layer_types=())

    def sliding_view(self) -> "ModelConfig":
        """A config whose RoPE is the sliding layers' (their own base frequency, no scaling)."""
        return dataclasses.replace(self, rope_theta=self.sliding_rope_theta or self.rope_theta,
                                   rope_scaling=RopeScaling(), num_layers=len(self.sliding_layers), layer_types=())

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
        fp8 = _check_quantization(hf)  # before any weight is read
        _check_uniform_sliding_window(hf)
        if model_type in GEMMA_TYPES and hf.get("use_bidirectional_attention"):
            raise UnsupportedArchitectureError("Gemma with bidirectional attention is not supported")
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
            rope_theta=_rope_theta(hf, "full_attention"),
            max_position_embeddings=_trained_positions(hf),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", model_type in GEMMA_TYPES)),
            attention_bias=bool(hf.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type in ("qwen3", "gemma3_text"),
            rope_scaling=_rope_scaling(hf),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            fp8_weights=fp8,
            fp8_weight_block=tuple((hf.get("quantization_config") or {}).get("weight_block_size") or ()) if fp8 else (),
            **(_gemma_fields(hf) if model_type in GEMMA_TYPES else {}),
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in model directory {model_dir}")
        return cls.from_hf_dict(json.loads(path.read_text()))


def _rope_params(hf: dict, layer_type: str = FULL_ATTENTION) -> dict:
    # transformers 5 moved theta/scaling into `rope_parameters` (per layer type for hybrid models such as
    # Gemma 3); older configs keep `rope_scaling`.
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if layer_type in params or FULL_ATTENTION in params or SLIDING_ATTENTION in params:
        params = params.get(layer_type) or {}
    return params


def _rope_theta(hf: dict, layer_type: str = FULL_ATTENTION) -> float:
    default = 1_000_000.0 if hf.get("model_type") == "gemma3_text" else 10000.0
    return float(_rope_params(hf, layer_type).get("rope_theta", hf.get("rope_theta", default)))


def _gemma_fields(hf: dict) -> dict:
    """Gemma 2 / 3's hybrid layers, as transformers' Gemma2Config / Gemma3TextConfig derive them."""
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise UnsupportedArchitectureError(f"Gemma with hidden_activation {act!r} is not supported")
    layers = hf["num_hidden_layers"]
    gemma2 = hf["model_type"] == "gemma2"
    # Gemma 2 alternates sliding / full; older Gemma 3 configs: every pattern-th layer is global.
    pattern = 2 if gemma2 else hf.get("sliding_window_pattern", 6)
    types = hf.get("layer_types") or [SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(layers)]
    sliding = _rope_params(hf, SLIDING_ATTENTION)
    local_theta = sliding.get("rope_theta", hf.get("rope_local_base_freq", _rope_theta(hf) if gemma2 else 10000.0))
    return dict(
        layer_types=tuple(types),
        sliding_window=hf.get("sliding_window", 4096),
        sliding_rope_theta=float(local_theta),
        query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
        final_logit_softcapping=hf.get("final_logit_softcapping"),
        attn_logit_softcapping=hf.get("attn_logit_softcapping"),
    )


def _check_quantization(hf: dict) -> bool:
    """True for an FP8 e4m3 checkpoint (dequantized while loading: model/fp8.py); any other quantization_config
    (AWQ, GPTQ, bitsandbytes, ...) is refused here, from config.json alone, before a weight is read."""
    q = hf.get("quantization_config")
    if not q:
        return False
    method = str(q.get("quant_method", "unknown")).lower()
    if method == "fp8" and str(q.get("fmt", "e4m3")).lower() == "e4m3":
        return True
    bits = q.get("bits") or q.get("w_bit")
    raise UnsupportedArchitectureError(
        f"quantized checkpoint: quantization_config.quant_method={method!r}"
        f"{f' ({bits}-bit)' if bits else ''} is not supported (its weights are {method} codes the decoder cannot "
        "use); load the unquantized model, or its GGUF (converted to bfloat16). Supported quantized format: FP8 "
        "e4m3 (quant_method 'fp8'), dequantized while loading")


def _check_uniform_sliding_window(hf: dict) -> None:
    """Mistral v0.1, Phi-3-mini-4k, Qwen2 with use_sliding_window: every layer attends a sliding window. Run
    with full attention they would silently differ from the trained model, and with every layer local there is
    no long-context layer for a method to govern: refused, naming the setting."""
    model_type, window = hf.get("model_type"), hf.get("sliding_window")
    if model_type == "qwen2" and not hf.get("use_sliding_window"):
        return  # Qwen2 configs carry a window they do not use
    if model_type in ("mistral", "phi3", "qwen2") and window not in (None, 0):
        if window < hf.get("max_position_embeddings", 0):
            raise UnsupportedArchitectureError(
                f"{model_type} with sliding_window={window} on every layer (max_position_embeddings="
                f"{hf.get('max_position_embeddings')}) is not supported: full attention would differ from the trained "
                "model, and no layer attends the long context (supported: full-attention Mistral v0.2+, "
                "Phi-3 128k, Qwen2 without use_sliding_window)")


def _trained_positions(hf: dict) -> int:
    """The context the model's dense attention is valid for. Qwen2.5-1M's dual chunk attention (DCA), which
    reaches 1M positions by re-indexing them in chunks, is not implemented: its own trained length
    (dual_chunk_attention_config.original_max_position_embeddings, 256K) bounds dense attention, and our sparse
    methods (whose own position schemes stay inside it) take over past it. Said once, never silently."""
    max_pos = hf.get("max_position_embeddings", 4096)
    dca = hf.get("dual_chunk_attention_config")
    if dca:
        trained = int(dca.get("original_max_position_embeddings") or max_pos)
        logger.warning("dual_chunk_attention_config is not implemented: dense attention is limited to the model's "
                       "%d trained positions (max_position_embeddings %d needs DCA); use a sparse method "
                       "(infinitehip, tokenselect) past it", trained, max_pos)
        return min(max_pos, trained)
    return max_pos


def _rope_scaling(hf: dict) -> RopeScaling:
    params = _rope_params(hf)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "su" or (kind == "yarn" and hf.get("model_type") == "phi3"):  # as transformers' Phi3Config reads them
        kind = "longrope"
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedArchitectureError(f"partial_rotary_factor={partial} (RoPE on part of each head) is not supported")
    if kind == "default":
        return RopeScaling()
    max_pos = hf.get("max_position_embeddings", 4096)
    original = int(params.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings")
                   or (8192 if kind == "llama3" else max_pos))
    factor = params.get("factor")
    if factor is None:  # yarn / longrope without one: the context extension itself (as transformers derives it)
        factor = max_pos / original if kind in ("yarn", "longrope") else 1.0
    factor = float(factor)
    fields = dict(kind=kind, factor=factor, original_max_position=original,
                  low_freq_factor=float(params.get("low_freq_factor", 1.0)),
                  high_freq_factor=float(params.get("high_freq_factor", 4.0)))
    attention_factor = params.get("attention_factor")
    if kind == "yarn":
        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if attention_factor is None:
            m, m_all = params.get("mscale"), params.get("mscale_all_dim")
            attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
        fields.update(beta_fast=float(params.get("beta_fast") or 32), beta_slow=float(params.get("beta_slow") or 1),
                      truncate=bool(params.get("truncate", True)))
    elif kind == "longrope":
        if attention_factor is None:
            attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        fields.update(short_factor=tuple(float(x) for x in params["short_factor"]),
                      long_factor=tuple(float(x) for x in params["long_factor"]))
    return RopeScaling(attention_factor=float(attention_factor or 1.0), **fields)

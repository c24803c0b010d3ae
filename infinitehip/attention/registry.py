"""The method switch: attention method name -> implementation, its config type and named presets.

A new method registers one `MethodSpec` here; the CLI derives its flags from the config dataclass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from infinitehip.attention.base import AttentionMethod
from infinitehip.attention.dense.method import DenseAttention
from infinitehip.attention.infinipot.config import InfiniPotConfig
from infinitehip.attention.infinipot.config import PRESETS as INFINIPOT_PRESETS
from infinitehip.attention.infinipot.method import InfiniPotAttention
from infinitehip.attention.infinitehip.config import InfiniteHiPConfig
from infinitehip.attention.infinitehip.config import PRESETS as INFINITEHIP_PRESETS
from infinitehip.attention.infinitehip.method import InfiniteHiPAttention
from infinitehip.attention.streaming.config import StreamingConfig
from infinitehip.attention.streaming.method import StreamingAttention
from infinitehip.attention.tokenselect.config import PRESETS as TOKENSELECT_PRESETS
from infinitehip.attention.tokenselect.config import TokenSelectConfig
from infinitehip.attention.tokenselect.method import TokenSelectAttention
from infinitehip.attention.truncate.config import TruncateConfig
from infinitehip.attention.truncate.method import TruncateAttention
from infinitehip.config.model import ModelConfig


@dataclass(frozen=True)
class MethodSpec:
    cls: type[AttentionMethod]
    config_cls: type | None = None  # None: the method has no settings
    presets: dict[str, Any] = field(default_factory=dict)  # name -> config instance
    default_preset: str | None = None

    def config(self, preset: str | None = None, **overrides: Any) -> Any:
        """The method's config: a preset (or the default one, or the dataclass defaults) with fields replaced."""
        if self.config_cls is None:
            if preset is not None or overrides:
                raise ValueError(f"method {self.cls.name!r} has no settings")
            return None
        name = preset or self.default_preset
        if name is not None and name not in self.presets:
            raise ValueError(f"unknown {self.cls.name} preset {name!r}; available: {', '.join(self.presets) or 'none'}")
        base = self.presets[name] if name is not None else self.config_cls()
        return dataclasses.replace(base, **overrides)


METHODS: dict[str, MethodSpec] = {
    DenseAttention.name: MethodSpec(DenseAttention),
    InfiniteHiPAttention.name: MethodSpec(InfiniteHiPAttention, InfiniteHiPConfig, dict(INFINITEHIP_PRESETS), "default"),
    InfiniPotAttention.name: MethodSpec(InfiniPotAttention, InfiniPotConfig, dict(INFINIPOT_PRESETS), "default"),
    TokenSelectAttention.name: MethodSpec(TokenSelectAttention, TokenSelectConfig, dict(TOKENSELECT_PRESETS), "default"),
    StreamingAttention.name: MethodSpec(StreamingAttention, StreamingConfig),
    TruncateAttention.name: MethodSpec(TruncateAttention, TruncateConfig),
}


def method_spec(name: str) -> MethodSpec:
    if name not in METHODS:
        raise ValueError(f"unknown attention method {name!r}; available: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def create_method(name: str, model_config: ModelConfig, method_config: object | None = None) -> AttentionMethod:
    spec = method_spec(name)
    if model_config.attn_logit_softcapping is not None and not spec.cls.supports_attn_softcapping:
        capable = ", ".join(n for n, s in METHODS.items() if s.cls.supports_attn_softcapping)
        raise ValueError(f"method {name!r} does not apply attention logit soft-capping (attn_logit_softcapping="
                         f"{model_config.attn_logit_softcapping}, Gemma 2), which would change the model's outputs; "
                         f"methods that do: {capable}")
    if spec.config_cls is None:
        if method_config is not None:
            raise ValueError(f"method {name!r} takes no configuration, got {type(method_config).__name__}")
        return spec.cls(model_config)
    if method_config is None:
        method_config = spec.config()
    if not isinstance(method_config, spec.config_cls):
        raise ValueError(f"method {name!r} expects a {spec.config_cls.__name__}, got {type(method_config).__name__}")
    return spec.cls(model_config, method_config)

"""The method switch: attention method name -> implementation and its config type."""

from __future__ import annotations

from infinitehip.attention.base import AttentionMethod
from infinitehip.attention.dense import DenseAttention
from infinitehip.attention.infinitehip.method import InfiniteHiPAttention
from infinitehip.config.infinitehip import InfiniteHiPConfig
from infinitehip.config.model import ModelConfig

# name -> (implementation, config dataclass or None when the method has no settings)
METHODS: dict[str, tuple[type[AttentionMethod], type | None]] = {
    DenseAttention.name: (DenseAttention, None),
    InfiniteHiPAttention.name: (InfiniteHiPAttention, InfiniteHiPConfig),
}


def create_method(name: str, model_config: ModelConfig, method_config: object | None = None) -> AttentionMethod:
    if name not in METHODS:
        raise ValueError(f"unknown attention method {name!r}; available: {', '.join(sorted(METHODS))}")
    cls, config_cls = METHODS[name]
    if config_cls is None:
        if method_config is not None:
            raise ValueError(f"method {name!r} takes no configuration, got {type(method_config).__name__}")
        return cls(model_config)
    if method_config is not None and not isinstance(method_config, config_cls):
        raise ValueError(f"method {name!r} expects a {config_cls.__name__}, got {type(method_config).__name__}")
    return cls(model_config, method_config)

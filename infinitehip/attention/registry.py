"""The method switch: attention method name -> implementation."""

from __future__ import annotations

from infinitehip.attention.base import AttentionMethod
from infinitehip.attention.dense import DenseAttention
from infinitehip.config.model import ModelConfig

METHODS: dict[str, type[AttentionMethod]] = {
    DenseAttention.name: DenseAttention,
}


def create_method(name: str, model_config: ModelConfig) -> AttentionMethod:
    if name not in METHODS:
        raise ValueError(f"unknown attention method {name!r}; available: {', '.join(sorted(METHODS))}")
    return METHODS[name](model_config)

"""Building an attention method by name: its implementation class, loaded from the import path that the
method's `MethodSpec` names (config/methods.py, the one place a method is registered), checked against the model
and its config."""

from __future__ import annotations

import logging

from infinitehip.attention.base import AttentionMethod
from infinitehip.config.methods import METHODS, method_spec
from infinitehip.config.model import ModelConfig

logger = logging.getLogger(__name__)


def method_class(name: str) -> type[AttentionMethod]:
    """The AttentionMethod subclass registered as name (unknown name -> ValueError naming the registered ones)."""
    return method_spec(name).method_class()


def effective_method(name: str, model_config: ModelConfig) -> str:
    """The method that runs for `name` on this model: `auto` is dense on a model that soft-caps attention logits
    (Gemma 2: only dense applies the cap), refusing past the trained length there; any other name as given."""
    return "dense" if name == "auto" and model_config.attn_logit_softcapping is not None else name


def create_method(name: str, model_config: ModelConfig, method_config: object | None = None) -> AttentionMethod:
    if effective_method(name, model_config) != name:
        logger.warning("method auto: this model soft-caps attention logits (Gemma 2), which only dense applies; "
                       "running dense (prompts past the trained length are refused)")
        name, method_config = "dense", None
    spec = method_spec(name)
    cls = spec.method_class()
    if model_config.attn_logit_softcapping is not None and not cls.supports_attn_softcapping:
        capable = ", ".join(n for n in METHODS if method_class(n).supports_attn_softcapping)
        raise ValueError(f"method {name!r} does not apply attention logit soft-capping (attn_logit_softcapping="
                         f"{model_config.attn_logit_softcapping}, Gemma 2), which would change the model's outputs; "
                         f"methods that do: {capable}")
    if spec.config_cls is None:
        if method_config is not None:
            raise ValueError(f"method {name!r} takes no configuration, got {type(method_config).__name__}")
        return cls(model_config)
    if method_config is None:
        method_config = spec.config()
    if not isinstance(method_config, spec.config_cls):
        raise ValueError(f"method {name!r} expects a {spec.config_cls.__name__}, got {type(method_config).__name__}")
    return cls(model_config, method_config)

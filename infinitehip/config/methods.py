"""The method switch: attention method name -> its config class, named presets and implementation, by import path.

A new method registers one `MethodSpec` in `METHODS`: `"module:Name"` of its config dataclass (None: no
settings), of the module-level dict of its presets and of its `AttentionMethod` subclass. Nothing here imports
a method: a config class and its presets load on first use (dataclasses beside the method, importing only
config/), the implementation only when a method is built (`attention/registry.py`, `MethodSpec.method_class`).
The CLI derives each method's flags from its config dataclass.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass
from typing import Any


def load_path(path: str) -> Any:
    """`"package.module:Name"` -> that module's attribute Name (imported on first use)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class MethodSpec:
    name: str
    method_path: str  # "module:Class" of the AttentionMethod subclass
    config_path: str | None = None  # "module:Class" of its config dataclass; None: the method has no settings
    presets_path: str | None = None  # "module:DICT" of its presets: name -> config instance
    default_preset: str | None = None

    @property
    def config_cls(self) -> type | None:
        return _load(self.config_path)

    @property
    def presets(self) -> dict[str, Any]:
        return dict(_load(self.presets_path) or {})

    def method_class(self) -> type:
        """The implementation class (importing the method's package: attention layer and below)."""
        return _load(self.method_path)

    def config(self, preset: str | None = None, **overrides: Any) -> Any:
        """The method's config: a preset (or the default one, or the dataclass defaults) with fields replaced."""
        if self.config_cls is None:
            if preset is not None or overrides:
                raise ValueError(f"method {self.name!r} has no settings")
            return None
        name = preset or self.default_preset
        presets = self.presets
        if name is not None and name not in presets:
            raise ValueError(f"unknown {self.name} preset {name!r}; available: {', '.join(presets) or 'none'}")
        base = presets[name] if name is not None else self.config_cls()
        return dataclasses.replace(base, **overrides)


@functools.cache
def _load(path: str | None) -> Any:
    return None if path is None else load_path(path)


METHODS: dict[str, MethodSpec] = {
    # what a user who names no method gets: dense within the trained length, InfiniteHiP beyond it
    "auto": MethodSpec("auto", "infinitehip.attention.methods.auto.method:AutoAttention",
                       "infinitehip.attention.methods.infinitehip.config:InfiniteHiPConfig",
                       "infinitehip.attention.methods.auto.presets:PRESETS", "default"),
    "dense": MethodSpec("dense", "infinitehip.attention.methods.dense.method:DenseAttention"),
    "infinitehip": MethodSpec("infinitehip", "infinitehip.attention.methods.infinitehip.method:InfiniteHiPAttention",
                              "infinitehip.attention.methods.infinitehip.config:InfiniteHiPConfig",
                              "infinitehip.attention.methods.infinitehip.config:PRESETS", "default"),
    "infinipot": MethodSpec("infinipot", "infinitehip.attention.methods.infinipot.method:InfiniPotAttention",
                            "infinitehip.attention.methods.infinipot.config:InfiniPotConfig",
                            "infinitehip.attention.methods.infinipot.config:PRESETS", "default"),
    "tokenselect": MethodSpec("tokenselect", "infinitehip.attention.methods.tokenselect.method:TokenSelectAttention",
                              "infinitehip.attention.methods.tokenselect.config:TokenSelectConfig",
                              "infinitehip.attention.methods.tokenselect.config:PRESETS", "default"),
    "streaming": MethodSpec("streaming", "infinitehip.attention.methods.streaming.method:StreamingAttention",
                            "infinitehip.attention.methods.streaming.config:StreamingConfig"),
    "truncate": MethodSpec("truncate", "infinitehip.attention.methods.truncate.method:TruncateAttention",
                           "infinitehip.attention.methods.truncate.config:TruncateConfig"),
    "cascade": MethodSpec("cascade", "infinitehip.attention.methods.cascade.method:CascadeAttention",
                          "infinitehip.attention.methods.cascade.config:CascadeConfig",
                          "infinitehip.attention.methods.cascade.config:PRESETS", "default"),
    "hip": MethodSpec("hip", "infinitehip.attention.methods.hip.method:HiPAttention",
                      "infinitehip.attention.methods.hip.config:HiPConfig",
                      "infinitehip.attention.methods.hip.config:PRESETS", "default"),
}


def method_spec(name: str) -> MethodSpec:
    if name not in METHODS:
        raise ValueError(f"unknown attention method {name!r}; available: {', '.join(sorted(METHODS))}")
    return METHODS[name]

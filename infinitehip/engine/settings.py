"""Settings by name: engine, method and offload fields routed to the config that has them, over a method preset.

    LLM(method="infinitehip", preset="3k-fast", max_context_tokens=1 << 20, stream_tokens=2048, offload_enabled=True)

max_context_tokens is an EngineConfig field, stream_tokens one of InfiniteHiPConfig (the chosen method's config),
offload_enabled one of OffloadConfig. The CLI builds its configs through the same function, so a name means the
same in Python, on the command line and in a --config file. A name no config has, a field of another method than
the chosen one, or a name two configs share is an error, never guessed.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infinitehip.attention.registry import METHODS, method_spec
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig


@dataclass(frozen=True)
class Settings:
    engine: EngineConfig
    method: Any  # the chosen method's config; None: its default preset
    offload: OffloadConfig | None  # None: no KV offloading


def field_names(cls: type | None) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} if cls is not None else set()


def all_setting_names() -> set[str]:
    """Every name resolve_settings routes: engine, offload and every method's fields."""
    names = field_names(EngineConfig) | field_names(OffloadConfig)
    return names.union(*(field_names(spec.config_cls) for spec in METHODS.values()))


def resolve_settings(config: EngineConfig | None = None, method_config: Any = None,
                     offload_config: OffloadConfig | None = None, preset: str | None = None,
                     **fields: Any) -> Settings:
    """The three configs from base objects (each optional) and fields by name, which replace the bases' fields.

    `method_config` is the method's config object, or a mapping of its fields (applied over `preset`, under
    `fields`); `preset` names a preset of the chosen method (`config.method`, or the `method` field)."""
    engine_names = field_names(EngineConfig)
    engine = dataclasses.replace(config or EngineConfig(), **{k: v for k, v in fields.items() if k in engine_names})
    spec = method_spec(engine.method)
    method_names, offload_names = field_names(spec.config_cls), field_names(OffloadConfig)
    for name in fields:
        _check_name(name, engine.method, engine_names, method_names, offload_names)
    method_fields = {k: v for k, v in fields.items() if k in method_names}
    offload_fields = {k: v for k, v in fields.items() if k in offload_names}
    return Settings(engine, _method_config(spec, engine.method, method_config, preset, method_fields),
                    _offload_config(offload_config, offload_fields))


def _check_name(name: str, method: str, engine: set[str], own: set[str], offload: set[str]) -> None:
    owners = [label for label, names in (("EngineConfig", engine), (f"the {method} config", own),
                                         ("OffloadConfig", offload)) if name in names]
    if len(owners) > 1:
        raise ValueError(f"{name!r} is a field of both {' and '.join(owners)}: give it inside config=, "
                         "method_config= or offload_config=")
    if owners:
        return
    others = sorted(m for m, spec in METHODS.items() if name in field_names(spec.config_cls))
    if others:
        raise ValueError(f"{name}: not a setting of method {method!r} (a setting of {', '.join(others)}); "
                         f"{_settings_of(method)}")
    close = difflib.get_close_matches(name, all_setting_names(), n=3)
    raise ValueError(f"unknown setting {name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))


def _settings_of(method: str) -> str:
    names = sorted(field_names(method_spec(method).config_cls))
    return f"its settings: {', '.join(names)}" if names else "it has no such settings"


def _method_config(spec, method: str, base: Any, preset: str | None, fields: dict[str, Any]) -> Any:
    if isinstance(base, Mapping):  # fields by name, checked against the chosen method's config
        for name in base:
            if name not in field_names(spec.config_cls):
                raise ValueError(f"method_config: {name}: not a setting of method {method!r}; {_settings_of(method)}")
        fields = {**base, **fields}
        base = None
    if base is not None:
        if preset is not None:
            raise ValueError("give either a preset or a method_config object, not both")
        if spec.config_cls is None or not isinstance(base, spec.config_cls):
            expected = spec.config_cls.__name__ if spec.config_cls else "no configuration"
            raise ValueError(f"method {method!r} takes {expected}, got {type(base).__name__}")
        return dataclasses.replace(base, **fields)
    if preset is None and not fields:
        return None  # the engine builds the method's default preset
    if spec.config_cls is None:
        raise ValueError(f"preset {preset!r}: method {method!r} has no presets; it has no such settings")
    return spec.config(preset, **{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def _offload_config(base: OffloadConfig | None, fields: dict[str, Any]) -> OffloadConfig | None:
    if base is None:
        return OffloadConfig(**fields) if fields else None
    return dataclasses.replace(base, **fields)

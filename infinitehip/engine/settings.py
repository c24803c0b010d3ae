"""Settings by name: engine, method and offload fields routed to the config that has them, over a method preset.

    LLM(method="infinitehip", preset="3k-fast", max_context_tokens=1 << 20, stream_tokens=2048, offload_enabled=True)

max_context_tokens is an EngineConfig field, stream_tokens one of InfiniteHiPConfig (the chosen method's config,
EngineConfig.method_config), offload_enabled one of OffloadConfig (EngineConfig.offload). The result is one
EngineConfig with both nested. The CLI builds its config through the same function, so a name means the same in
Python, on the command line and in a --config file. A name no config has, a field of another method than the
chosen one, or a name two configs share is an error, never guessed.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

from infinitehip.config.methods import METHODS, MethodSpec, method_spec
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig


def field_names(cls: type | None) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} if cls is not None else set()


def all_setting_names() -> set[str]:
    """Every name resolve_settings routes: engine (method_config and offload included), offload and every method's
    fields."""
    names = field_names(EngineConfig) | field_names(OffloadConfig)
    return names.union(*(field_names(spec.config_cls) for spec in METHODS.values()))


def resolve_settings(config: EngineConfig | None = None, preset: str | None = None, **fields: Any) -> EngineConfig:
    """One EngineConfig from a base (optional) and fields by name, which replace the base's fields.

    `fields`: any field of EngineConfig, of the chosen method's config or of OffloadConfig. Among them
    `method_config` is the method's config object or a mapping of its fields (applied over `preset`, under the
    method's fields given by name), and `offload` an OffloadConfig or a mapping of its fields (under its fields
    given by name). `preset` names a preset of the chosen method (`config.method`, or the `method` field). The
    base's method_config is kept when the method stays the same and neither a preset nor a method_config is given."""
    base = config or EngineConfig()
    nested = set(EngineConfig.NESTED_FIELDS)
    engine_names = field_names(EngineConfig) - nested
    method = fields.get("method", base.method)
    spec = method_spec(method)
    method_names, offload_names = field_names(spec.config_cls), field_names(OffloadConfig)
    for name in fields:
        if name not in nested:
            _check_name(name, method, engine_names, method_names, offload_names)
    given = fields.get("method_config")
    if given is None and preset is None and method == base.method:
        given = base.method_config
    method_config = _method_config(spec, method, given, preset, {k: v for k, v in fields.items() if k in method_names})
    offload = _offload_config(fields.get("offload", base.offload), {k: v for k, v in fields.items() if k in offload_names})
    engine_fields = {k: v for k, v in fields.items() if k in engine_names}
    return dataclasses.replace(base, **engine_fields, method_config=method_config, offload=offload)


def _check_name(name: str, method: str, engine: set[str], own: set[str], offload: set[str]) -> None:
    owners = [label for label, names in (("EngineConfig", engine), (f"the {method} config", own),
                                         ("OffloadConfig", offload)) if name in names]
    if len(owners) > 1:
        raise ValueError(f"{name!r} is a field of both {' and '.join(owners)}: give it inside config=, "
                         "method_config= or offload=")
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


def _method_config(spec: MethodSpec, method: str, base: Any, preset: str | None, fields: dict[str, Any]) -> Any:
    """The chosen method's config: `base` (an object or a mapping of fields) or `preset`, with `fields` replaced."""
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
    if spec.config_cls is None:
        if preset is not None:
            raise ValueError(f"preset {preset!r}: method {method!r} has no presets; it has no such settings")
        return None
    return spec.config(preset, **{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def _offload_config(base: OffloadConfig | Mapping | None, fields: dict[str, Any]) -> OffloadConfig:
    if isinstance(base, Mapping):
        for name in base:
            if name not in field_names(OffloadConfig):
                raise ValueError(f"offload: {name}: not a field of OffloadConfig")
        return OffloadConfig(**{**base, **fields})
    if base is None:
        return OffloadConfig(**fields)
    if not isinstance(base, OffloadConfig):
        raise ValueError(f"offload must be an OffloadConfig (or a mapping of its fields), got {type(base).__name__}")
    return dataclasses.replace(base, **fields)


def engine_preset(llm) -> str | None:
    """Name of the method preset the engine runs: the preset whose settings equal the method's config."""
    preset = getattr(llm.config, "preset", None)
    if preset:
        return preset
    method_config = getattr(llm.method, "config", None)
    if method_config is None:
        return None
    presets = method_spec(llm.method.name).presets
    return next((name for name, cfg in presets.items() if cfg == method_config), None)

"""Method settings on the command line: --preset plus one flag per field of every method's config.

A flag shared by several methods (--sink-tokens, say) is one flag; it applies to the method chosen with
--method, and a flag the chosen method does not have is an error, not silently ignored.
"""

from __future__ import annotations

import argparse
import dataclasses

from infinitehip.attention.registry import METHODS, method_spec
from infinitehip.cli.options import add_dataclass_flags
from infinitehip.config.engine import EngineConfig


def _config_classes() -> list[type]:
    seen: list[type] = []
    for spec in METHODS.values():
        if spec.config_cls is not None and spec.config_cls not in seen:
            seen.append(spec.config_cls)
    return seen


def add_method_flags(parser: argparse.ArgumentParser) -> None:
    presets = [f"{name}: {', '.join(spec.presets)}" for name, spec in METHODS.items() if spec.presets]
    parser.add_argument("--preset", help=f"method preset ({'; '.join(presets)}); field flags override it")
    added: set[str] = set()
    for cls in _config_classes():
        fields = {f.name for f in dataclasses.fields(cls)}
        add_dataclass_flags(parser, cls, exclude=tuple(added))
        added |= fields


def method_config_from_args(engine_config: EngineConfig, args: argparse.Namespace) -> object | None:
    """The chosen method's config from --preset and field flags; None (the method's default) when none was given."""
    all_fields = {f.name for cls in _config_classes() for f in dataclasses.fields(cls)}
    given = {k: v for k, v in vars(args).items() if k in all_fields}
    preset = getattr(args, "preset", None)
    if preset is None and not given:
        return None
    spec = method_spec(engine_config.method)
    own = {f.name for f in dataclasses.fields(spec.config_cls)} if spec.config_cls else set()
    foreign = ["--preset"] * (preset is not None and not spec.presets) + ["--" + k.replace("_", "-") for k in given if k not in own]
    if foreign:
        raise ValueError(f"{', '.join(foreign)}: not a setting of method {engine_config.method!r}; it has no such settings")
    overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
    return spec.config(preset, **overrides)

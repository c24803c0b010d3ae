"""Method settings on the command line: --preset plus one flag per field of every method's config.

A flag shared by several methods (--sink-tokens, say) is one flag; it applies to the method chosen with
--method, and a flag the chosen method does not have is an error, not silently ignored. The field flags are
left out of --help (the presets are what a user picks); --help-all lists them per method, with each
method's own defaults and its study knobs apart. --method-config '{"head_aggregation": "softmax"}' gives
fields as one JSON object (from scripts, or to keep a study's settings together); field flags override it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap

from infinitehip.config.methods import METHODS
from infinitehip.cli.options import add_dataclass_flags
from infinitehip.cli.parser import CommandParser
from infinitehip.config.engine import EngineConfig
from infinitehip.engine.settings import all_setting_names, resolve_settings


def _config_classes() -> list[type]:
    seen: list[type] = []
    for spec in METHODS.values():
        if spec.config_cls is not None and spec.config_cls not in seen:
            seen.append(spec.config_cls)
    return seen


def _presets_text() -> str:
    return "; ".join(f"{name}: {', '.join(spec.presets)}" for name, spec in METHODS.items() if spec.presets)


def add_method_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("attention method settings")
    group.add_argument("--preset", help=f"named settings of the method ({_presets_text()}); default: the method's "
                                        "`default`; field flags (--help-all) override it")
    group.add_argument("--method-config", type=parse_json_object, metavar="JSON",
                       help="the method's fields as a JSON object, e.g. '{\"stream_tokens\": 2048, \"chunk_sizes\": "
                            "[256, 32, 8]}' (any field --help-all lists); over the preset, under field flags")
    # One flag per field name; a name several methods share accepts the allowed values of each.
    choices: dict[str, tuple] = {}
    for cls in _config_classes():
        for name, values in getattr(cls, "CHOICES", {}).items():
            choices[name] = tuple(dict.fromkeys(choices.get(name, ()) + tuple(values)))
    added: set[str] = set()
    for cls in _config_classes():
        add_dataclass_flags(parser, cls, exclude=tuple(added), choices=choices, hidden=True)
        added |= {f.name for f in dataclasses.fields(cls)}
    if isinstance(parser, CommandParser):
        parser.help_all_sections.append(lambda: method_fields_listing(parser))


def method_fields_listing(parser: argparse.ArgumentParser) -> str:
    """Each method's fields as flags, with that method's defaults: the part of --help-all after the flags."""
    parts = ["\n" + textwrap.fill("Each method's own settings, with its defaults (flags of another method than "
                                  "--method's are an error; a preset sets several at once):", 80)]
    for name, spec in METHODS.items():
        if spec.config_cls is not None:  # one parser per method: methods share flag names
            listing = argparse.ArgumentParser(prog=parser.prog, usage=argparse.SUPPRESS, add_help=False,
                                              formatter_class=parser.formatter_class)
            add_dataclass_flags(listing, spec.config_cls, title=f"--method {name} ({spec.config_cls.__name__})")
            parts.append(listing.format_help())
    return "\n".join(parts)


def parse_json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of field names to values, got {text!r}")
    return {key.replace("-", "_"): value for key, value in value.items()}


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The run's EngineConfig (its method config and offload config nested) from the flags given (and --config's
    values), built as LLM(...) builds it from keywords: --preset, then --method-config, then field flags."""
    names = all_setting_names()
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items() if k in names}
    return resolve_settings(preset=getattr(args, "preset", None), **fields)


def method_config_from_args(engine_config: EngineConfig, args: argparse.Namespace) -> object | None:
    """The chosen method's config alone (--preset, --method-config, its field flags), for an engine config built
    elsewhere; None for a method without settings."""
    names = {f.name for cls in _config_classes() for f in dataclasses.fields(cls)} | {"method_config"}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items() if k in names}
    return resolve_settings(engine_config, preset=getattr(args, "preset", None), **fields).method_config

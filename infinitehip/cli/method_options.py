"""Method settings on the command line: --preset plus one flag per InfiniteHiPConfig field."""

from __future__ import annotations

import argparse
import dataclasses

from infinitehip.cli.options import add_dataclass_flags
from infinitehip.config.engine import EngineConfig
from infinitehip.config.infinitehip import PRESETS, InfiniteHiPConfig, infinitehip_preset


def add_method_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", help=f"InfiniteHiP preset: {', '.join(PRESETS)} (default 3k); fields below override it")
    add_dataclass_flags(parser, InfiniteHiPConfig)


def method_config_from_args(engine_config: EngineConfig, args: argparse.Namespace) -> object | None:
    """The method's config from --preset and field flags; None (the method's default) when none was given."""
    names = {f.name for f in dataclasses.fields(InfiniteHiPConfig)}
    overrides = {k: v for k, v in vars(args).items() if k in names}
    preset = getattr(args, "preset", None)
    if preset is None and not overrides:
        return None
    if engine_config.method != "infinitehip":
        given = ["--preset"] * (preset is not None) + ["--" + k.replace("_", "-") for k in overrides]
        raise ValueError(f"{', '.join(given)}: only for --method infinitehip; method {engine_config.method!r} has no such settings")
    return infinitehip_preset(preset or "3k", **overrides)

"""`--print-config` of the commands that build an engine: the values it would run with (engine/resolve.py), then
exit. Reads the model's config.json and tokenizer (a GGUF is converted once, as loading does), not its weights."""

from __future__ import annotations

import argparse

from infinitehip.config.engine import EngineConfig

FLAG_HELP = ("print the engine's resolved settings (device, dtype, context, KV tokens and pages, banks, the method's "
             "config) and exit, without loading the weights")


def add_print_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--print-config", action="store_true", help=FLAG_HELP)


def print_resolved(engine_config: EngineConfig) -> int:
    from infinitehip.engine.resolve import resolve_for_model  # heavy: only once the flags are valid

    print(resolve_for_model(engine_config).describe())
    return 0

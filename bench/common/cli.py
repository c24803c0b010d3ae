"""Flags the suites share, built from the package's own CLI machinery (infinitehip/cli/): the attention method's
settings (--preset, --method-config, one flag per field: cli/method_options.py) and the KV offload settings (one
flag per OffloadConfig field: cli/options.py), resolved as `infinitehip` commands resolve them
(engine/settings.py). Model flags: common/models.py; --output and the meta block: bench/cli.py, common/meta.py.
"""

from __future__ import annotations

import argparse
import dataclasses

from infinitehip.config.methods import method_spec
from infinitehip.cli import method_options
from infinitehip.cli.options import add_dataclass_flags, parse_int
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig


def add_method_flags(parser: argparse.ArgumentParser, preset: str | None = None) -> None:
    """--preset (default `preset`; None: the method's default), --method-config JSON, and every method field's flag
    (listed by --help-all)."""
    method_options.add_method_flags(parser)
    if preset is not None:
        parser.set_defaults(preset=preset)


def method_config(args: argparse.Namespace, method: str = "infinitehip"):
    """The method's config from --preset, --method-config and field flags (the product's resolution order)."""
    config = method_options.method_config_from_args(EngineConfig(method=method), args)
    return config if config is not None else method_spec(method).config(None)


def add_offload_flags(parser: argparse.ArgumentParser) -> None:
    """OffloadConfig's fields as flags; the bank sizes default to what one resolve call needs at the context."""
    add_dataclass_flags(parser, OffloadConfig, exclude=("offload_enabled",),
                        title="KV offloading (OffloadConfig; bank sizes default to the worst case at the context)")
    parser.add_argument("--min-attention-bank", type=parse_int, default=65536,
                        help="smallest attention bank when its size is not given (default: 65536)")


def banks_for(method, context: int, num_heads: int, args: argparse.Namespace) -> OffloadConfig:
    """Offloading on, with the flags given; mask bank: the largest stage's representatives at `context` (one group
    per stage); attention bank: max(the worst case of one call, --min-attention-bank)."""
    from infinitehip.attention.methods.infinitehip.offload_access import check_offload

    need = check_offload(method, OffloadConfig(mask_bank_tokens=1 << 40, attention_bank_tokens=1 << 40), context,
                         num_heads, 1)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(OffloadConfig) if hasattr(args, f.name)}
    given.setdefault("mask_bank_tokens", need.mask_stage_tokens)
    given.setdefault("attention_bank_tokens", max(need.attention_tokens, args.min_attention_bank))
    return OffloadConfig(**{**given, "offload_enabled": True})


def add_smoke_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--smoke", action="store_true", help=f"CPU check in seconds: {what}")

"""CLI flags derived from config dataclasses: every field becomes --kebab-case-name with its type."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from infinitehip.cli.field_docs import field_docs


def _scalar_type(tp: Any) -> tuple[Any, bool]:
    """(base type, optional?) of a field annotation like `int | None`."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return inner, True
    return tp, False


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


_SUFFIXES = {"k": 1 << 10, "m": 1 << 20}  # token counts: 128K = 131,072, 1M = 1,048,576 (as the docs count them)


def _parse_int(text: str) -> int:
    """An int, optionally with a K/M suffix (binary: 1M = 1,048,576) or underscores: 32768, 128K, 1M, 1_000_000."""
    clean = text.strip().replace("_", "").lower()
    scale = _SUFFIXES.get(clean[-1:], 1)
    number = clean[:-1] if scale != 1 else clean
    try:
        return int(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer such as 32768, 128K or 1M, got {text!r}") from None


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, exclude: tuple[str, ...] = ()) -> None:
    """Add one flag per field of `cls`; an unset flag keeps the dataclass default (argparse.SUPPRESS)."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        tp, optional = _scalar_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        doc = field_docs(cls).get(f.name)
        help_text = f"{doc} (default: {default})" if doc else f"(default: {default})"
        help_text = help_text.replace("%", "%%")  # argparse %-formats help texts
        if typing.get_origin(tp) is tuple:
            group.add_argument(flag, dest=f.name, nargs="*", default=argparse.SUPPRESS, help=help_text)
        elif tp is bool:
            group.add_argument(flag, dest=f.name, type=_parse_bool, default=argparse.SUPPRESS, metavar="BOOL", help=help_text)
        elif tp is int:
            group.add_argument(flag, dest=f.name, type=_parse_int, default=argparse.SUPPRESS, metavar="INT", help=help_text)
        else:
            group.add_argument(flag, dest=f.name, type=tp, default=argparse.SUPPRESS, help=help_text)


def dataclass_from_args(cls: type, args: argparse.Namespace, **extra: Any):
    """Build `cls` from the flags the user gave (plus `extra`); the dataclass validates the values."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(args).items() if k in names}
    if any(typing.get_origin(_scalar_type(typing.get_type_hints(cls)[k])[0]) is tuple for k in values):
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**{**values, **extra})

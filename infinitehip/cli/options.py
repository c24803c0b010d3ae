"""CLI flags derived from config dataclasses: every field becomes --kebab-case-name with its type and help text.

What a config class declares for the CLI, beside its fields (all optional):
- each field's comment: its help text (cli/field_docs.py);
- HELP_FIELDS: the fields `--help` lists; the others are hidden until `--help-all` (cli/parser.py).
  Without it every field is listed (the small configs of a command's own, such as EvalConfig);
- STUDY_FIELDS: knobs of the studies in docs/ (ablations, kernel choices), listed apart in `--help-all`;
- CHOICES: the allowed values of choice-like string fields, shown in the help and checked by argparse;
- NESTED_FIELDS: fields holding another config (EngineConfig.method_config, .offload): no flag of their own, the
  nested config's fields are flags of their own (cli/method_options.py, OffloadConfig's).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from infinitehip.cli.field_docs import field_docs
from infinitehip.cli.parser import CommandParser


def _scalar_type(tp: Any) -> tuple[Any, bool]:
    """(base type, optional?) of a field annotation like `int | None`."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return inner, True
    return tp, False


def parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


_SUFFIXES = {"k": 1 << 10, "m": 1 << 20}  # token counts: 128K = 131,072, 1M = 1,048,576 (as the docs count them)


def parse_int(text: str) -> int:
    """An int, optionally with a K/M suffix (binary: 1M = 1,048,576) or underscores: 32768, 128K, 1M, 1_000_000."""
    clean = text.strip().replace("_", "").lower()
    scale = _SUFFIXES.get(clean[-1:], 1)
    number = clean[:-1] if scale != 1 else clean
    try:
        return int(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer such as 32768, 128K or 1M, got {text!r}") from None


_PARSERS = {int: (parse_int, "INT"), float: (float, "FLOAT"), bool: (parse_bool, "BOOL")}


def _shown_default(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return " ".join(map(str, value)) if value else "none"
    if isinstance(value, str) and (not value or value != value.strip() or "\n" in value):
        return repr(value)
    return str(value)


def help_text(cls: type, field: dataclasses.Field) -> str:
    """The field's comment and its default, %-escaped for argparse."""
    default = field.default if field.default is not dataclasses.MISSING else None
    doc = field_docs(cls).get(field.name)
    text = f"{doc} (default: {_shown_default(default)})" if doc else f"(default: {_shown_default(default)})"
    return text.replace("%", "%%")  # argparse %-formats help texts


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, exclude: tuple[str, ...] = (),
                        title: str | None = None, choices: dict[str, tuple] | None = None,
                        hidden: bool = False) -> argparse._ArgumentGroup:
    """Add one flag per field of `cls`; an unset flag keeps the dataclass default (argparse.SUPPRESS).

    `title`: the help group's heading; `choices`: allowed values beside the class's CHOICES; `hidden`: every
    flag out of --help and --help-all (listed elsewhere). On a plain ArgumentParser nothing is hidden.
    Returns the help group, for a command's own flags of the same kind."""
    hints = typing.get_type_hints(cls)
    shown = getattr(cls, "HELP_FIELDS", None)
    study = set(getattr(cls, "STUDY_FIELDS", ()))
    all_choices = {**getattr(cls, "CHOICES", {}), **(choices or {})}
    title = title or cls.__name__
    groups = {False: parser.add_argument_group(title), True: parser.add_argument_group(f"{title}: study knobs")}
    exclude = (*exclude, *getattr(cls, "NESTED_FIELDS", ()))
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        tp, optional = _scalar_type(hints[f.name])
        many = typing.get_origin(tp) is tuple
        element = typing.get_args(tp)[0] if many else tp
        convert, metavar = _PARSERS.get(element, (element, None))
        kwargs: dict[str, Any] = dict(dest=f.name, type=convert, default=argparse.SUPPRESS, help=help_text(cls, f))
        if f.name in all_choices:
            kwargs["choices"] = all_choices[f.name]
        elif metavar:
            kwargs["metavar"] = metavar
        if many:
            kwargs["nargs"] = "*"
        elif element is bool:  # `--offload-enabled` alone means true
            kwargs.update(nargs="?", const=True)
        action = groups[f.name in study].add_argument("--" + f.name.replace("_", "-"), **kwargs)
        if not isinstance(parser, CommandParser):
            continue
        if optional:
            parser.nullable.add(f.name)
        if hidden:
            action.help = argparse.SUPPRESS
        elif shown is not None and f.name not in shown:
            parser.hide(action, action.help)
    return groups[False]


def dataclass_from_args(cls: type, args: argparse.Namespace, **extra: Any):
    """Build `cls` from the flags the user gave (plus `extra`); the dataclass validates the values. Nested configs
    (NESTED_FIELDS) come from `extra` only."""
    names = {f.name for f in dataclasses.fields(cls)} - set(getattr(cls, "NESTED_FIELDS", ()))
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items() if k in names}
    return cls(**{**values, **extra})

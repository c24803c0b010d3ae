"""`--config FILE`: a command's settings from a YAML (or JSON) file, keys named as its flags; flags override it.

    # run.yaml, for `infinitehip generate --config run.yaml --prompt-file book.txt`
    model: gemma3-270m
    method: infinitehip
    preset: 3k-fast
    max_context_tokens: 1M        # sizes as on the command line
    temperature: 0
    head_aggregation: softmax     # a method's field: --head-aggregation
    # or its fields together: method_config: {head_aggregation: softmax}

A key is a flag's name without the dashes (max_context_tokens or max-context-tokens), any flag of the command,
those --help-all lists too. The file's values become the command's defaults, so a flag given on the command line
wins; its values go through the flags' own parsing (1M, true/false, the allowed values); a key that is not a
flag of the command is an error that names the key and the file. JSON is YAML, so a .json file reads the same.
"""

from __future__ import annotations

import argparse
import difflib
import json
from pathlib import Path
from typing import Any

import yaml

NOT_SETTINGS = ("help", "config")  # flags a file cannot set


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="read settings from this YAML or JSON file, keys named as the flags "
                             "(max_context_tokens: 1M); flags on the command line override it")


def load_settings(path: Path) -> dict[str, Any]:
    """The file's mapping of settings (an empty file: none)."""
    if not path.is_file():
        raise FileNotFoundError(f"no such config file: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML/JSON: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ValueError(f"{path}: expected a mapping of setting names to values (max_context_tokens: 1M), "
                         f"got {type(data).__name__}")
    return data


def apply_config_file(parser: argparse.ArgumentParser, path: Path) -> None:
    """Make the file's values the defaults of `parser`'s flags (validated and converted as the flags are)."""
    settings = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in NOT_SETTINGS}
    nullable = getattr(parser, "nullable", set())
    defaults = {}
    for key, value in load_settings(path).items():
        dest = key.replace("-", "_")
        if dest not in settings:
            close = difflib.get_close_matches(dest, settings, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; `{parser.prog} --help-all` lists them"
            raise ValueError(f"{path}: unknown key {key!r}: not a setting of `{parser.prog}`{hint}")
        try:
            defaults[dest] = _convert(settings[dest], value, dest in nullable)
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {key}: {exc}") from None
    parser.set_defaults(**defaults)


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse `argv`; with --config, parse again over the file's values (the command line overrides them)."""
    args = parser.parse_args(argv)
    if getattr(args, "config", None) is None:
        return args
    apply_config_file(args.command_parser, args.config)
    return parser.parse_args(argv)


def _convert(action: argparse.Action, value: Any, nullable: bool) -> Any:
    if value is None:
        if nullable or action.default is None:
            return None
        raise ValueError("null is not a value of this setting")
    if action.nargs == 0:  # a switch such as --chat
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if action.nargs in ("*", "+"):
        return [_scalar(action, v) for v in (value if isinstance(value, list) else [value])]
    return _scalar(action, value)


def _scalar(action: argparse.Action, value: Any) -> Any:
    """`value` as the command line would give it, through the flag's own type and choices."""
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, (dict, list)):
        text = json.dumps(value)
    else:
        text = str(value)
    result = action.type(text) if action.type is not None else text
    if action.choices is not None and result not in action.choices:
        raise ValueError(f"{result!r} is not one of {', '.join(map(str, action.choices))}")
    return result

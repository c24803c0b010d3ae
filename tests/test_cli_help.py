"""Every flag of every command has a help text: dataclass-derived flags carry their field's comment
(cli/field_docs.py), not only their default."""

from __future__ import annotations

import argparse

from infinitehip.cli.field_docs import field_docs
from infinitehip.cli.main import build_parser


def _parsers(parser: argparse.ArgumentParser, path: str = "infinitehip"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_flag_has_a_help_text():
    bare = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            text = (action.help or "").strip()
            if not text or text.startswith("(default"):
                bare.append(f"{path} {action.option_strings[0]}")
        parser.format_help()  # a help text that breaks argparse's %-formatting fails here
    assert not bare, bare


def test_field_docs_read_trailing_and_preceding_comments():
    from dataclasses import dataclass

    @dataclass
    class Example:
        # explained above,
        # over two lines
        a: int = 1
        b: str = "x"  # explained on its line
        c: float = 0.5

        def method(self) -> None:
            d: int = 2  # not a field  # noqa: F841

    assert field_docs(Example) == {"a": "explained above, over two lines", "b": "explained on its line"}

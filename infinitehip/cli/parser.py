"""Command parsers with two help levels: `--help` lists the flags a user needs, `--help-all` every setting.

A command has dozens of settings (engine, sampling, offload, each method's own fields), most of them for
tuning or for the studies in docs/. They stay flags, hidden from `--help`: the parser keeps their help
texts and `--help-all` shows them, followed by extra listings (each method's fields, cli/method_options.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from infinitehip.cli.config_file import add_config_flag

HELP_ALL = "--help-all"


class CommandParser(argparse.ArgumentParser):
    """argparse.ArgumentParser with flags hidden from --help and listed by --help-all."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)  # descriptions keep their lines
        super().__init__(*args, **kwargs)
        self.hidden_help: dict[argparse.Action, str] = {}  # hidden flag -> its help text in --help-all
        self.help_all_sections: list[Callable[[], str]] = []  # listings appended to --help-all
        self.nullable: set[str] = set()  # dests that accept None (a config file's `null`): Optional fields

    def hide(self, action: argparse.Action, text: str) -> None:
        """Keep `action` out of --help; --help-all shows it with `text`."""
        self.hidden_help[action] = text
        action.help = argparse.SUPPRESS

    def format_full_help(self) -> str:
        saved_usage = self.usage
        self.usage = self.format_usage().removeprefix("usage: ").rstrip().replace("%", "%%")  # --help's short one
        for action, text in self.hidden_help.items():
            action.help = text
        try:
            text = self.format_help()
        finally:
            self.usage = saved_usage
            for action in self.hidden_help:
                action.help = argparse.SUPPRESS
        return text + "".join(section() for section in self.help_all_sections)


class _HelpAllAction(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.write(parser.format_full_help())
        parser.exit()


def add_command(subparsers, name: str, help: str, description: str | None = None) -> CommandParser:
    """A command's parser, with --help-all and --config (cli/config_file.py), and itself in the parsed namespace
    (`args.command_parser`: where a config file's values go)."""
    parser = subparsers.add_parser(name, help=help, description=description or help)
    parser.add_argument(HELP_ALL, action=_HelpAllAction, help="show every setting (tuning and study knobs too) and exit")
    add_config_flag(parser)
    parser.set_defaults(command_parser=parser)
    return parser

"""`infinitehip` command line: generate, eval, serve.

`infinitehip COMMAND --help` lists the flags a user needs, `--help-all` every setting; `--config FILE.yaml` reads
settings named as the flags."""

from __future__ import annotations

import importlib
import sys

from infinitehip import __version__
from infinitehip.cli.config_file import parse_args
from infinitehip.cli.parser import CommandParser
from infinitehip.cli.startup import announce_start, configure_logging

# Subcommand modules; each exposes register(subparsers) and sets `func` on its parser.
SUBCOMMANDS = ("infinitehip.cli.generate", "infinitehip.cli.eval", "infinitehip.cli.serve")


def build_parser() -> CommandParser:
    parser = CommandParser(prog="infinitehip", description=__doc__)
    parser.add_argument("--version", action="version", version=f"infinitehip {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    announce_start(argv)  # before the imports below, which take seconds
    configure_logging()
    try:
        args = parse_args(build_parser(), argv)  # argparse exits on bad flags; a bad config file raises
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""What the command line says around its heavy work: one status line before torch is imported (that import and
a model load take seconds, a first GGUF conversion longer), and the library's warnings on stderr, one line each.

The phases after it print their own lines where they run (EngineConfig.show_progress): the model's load and
first conversion (engine/llm_engine.py, model/gguf_convert.py), the prefill's progress bar (engine/llm.py)."""

from __future__ import annotations

import logging
import sys

# Commands that load a model; `eval ruler-report` only reads result files.
_LOADING_COMMANDS = ("generate", "serve", "eval")
_NOT_LOADING = ("ruler-report",)
_EXITING_FLAGS = ("-h", "--help", "--help-all", "--version", "--print-config")  # no model loaded


def _quiet(argv: list[str]) -> bool:
    """--show-progress false (or =false) on the command line."""
    for i, word in enumerate(argv):
        value = word.partition("=")[2] if word.startswith("--show-progress=") else (
            argv[i + 1] if word == "--show-progress" and i + 1 < len(argv) else None)
        if value is not None and value.lower() in ("0", "false", "no", "off"):
            return True
    return False


def announce_start(argv: list[str]) -> None:
    """`infinitehip COMMAND: starting ...` on stderr, for a command that will load a model; read from the raw
    arguments, before the parser (whose config classes import torch) exists."""
    if not argv or argv[0] not in _LOADING_COMMANDS or any(a in _EXITING_FLAGS for a in argv) or _quiet(argv):
        return
    command = argv[0]
    if command == "eval":
        if len(argv) < 2 or argv[1] in _NOT_LOADING or argv[1].startswith("-"):
            return
        command = f"eval {argv[1]}"
    print(f"infinitehip {command}: starting (importing torch, then loading the model)", file=sys.stderr, flush=True)


class _WarningsHandler(logging.StreamHandler):
    """The handler configure_logging adds (found again, never added twice, when main() runs more than once); it
    writes to the sys.stderr of the moment, which a caller (or a test's capture) may have replaced since."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging() -> None:
    """The `infinitehip` loggers' warnings and errors on stderr as `WARNING: message`."""
    logger = logging.getLogger("infinitehip")
    if any(isinstance(h, _WarningsHandler) for h in logger.handlers):
        return
    handler = _WarningsHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    logger.addHandler(handler)

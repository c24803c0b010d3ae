"""`infinitehip generate`: one completion from a prompt, a prompt file, or as a chat message, streamed to stdout
as it is generated."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from infinitehip.cli.method_options import add_method_flags, engine_config_from_args
from infinitehip.cli.options import add_dataclass_flags, dataclass_from_args
from infinitehip.cli.parser import add_command
from infinitehip.cli.print_config import add_print_config_flag, print_resolved
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.llm import LLM

# vLLM's SamplingParams default (its offline LLM, whose API ours follows): a command that ends soon. llama.cpp's CLI
# generates until end-of-sequence or a full context (-n -1), which with an 8K context is minutes of silence on a CPU.
DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_HELP = (f"most tokens to generate (default: {DEFAULT_MAX_TOKENS}, vLLM's default, so that a command ends "
                   "soon; raise it for longer answers; `max_tokens: null` in a --config file: up to the context limit)")


def register(subparsers) -> None:
    p = add_command(subparsers, "generate", help="generate a completion", description=__doc__)
    prompt = p.add_argument_group("prompt")
    source = prompt.add_mutually_exclusive_group()  # required, but may come from --config: checked in run()
    source.add_argument("--prompt", metavar="TEXT", help="prompt text")
    source.add_argument("--prompt-file", type=Path, metavar="FILE", help="read the prompt from this file")
    prompt.add_argument("--chat", action="store_true",
                        help="send the prompt as a user message through the model's chat template")
    add_dataclass_flags(p, EngineConfig, title="engine (EngineConfig)")
    add_method_flags(p)
    add_dataclass_flags(p, SamplingParams, title="sampling (SamplingParams)")
    p._option_string_actions["--max-tokens"].help = MAX_TOKENS_HELP
    add_dataclass_flags(p, OffloadConfig, title="KV offloading (OffloadConfig)")
    add_print_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.print_config:
        return print_resolved(engine_config_from_args(args))
    if (args.prompt is None) == (args.prompt_file is None):
        raise ValueError("give one of --prompt and --prompt-file (on the command line or in the --config file)")
    prompt = args.prompt if args.prompt is not None else _read_prompt(args.prompt_file)
    bound = {} if "max_tokens" in vars(args) else {"max_tokens": DEFAULT_MAX_TOKENS}
    params = dataclass_from_args(SamplingParams, args, **bound)
    llm = LLM(config=engine_config_from_args(args))
    for piece in llm.stream([{"role": "user", "content": prompt}] if args.chat else prompt, params):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def _read_prompt(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"prompt file {path}: {exc}") from None

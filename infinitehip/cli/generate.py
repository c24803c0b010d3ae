"""`infinitehip generate`: one completion from a prompt, a prompt file, or as a chat message."""

from __future__ import annotations

import argparse
from pathlib import Path

from infinitehip.cli.method_options import add_method_flags, engine_config_from_args
from infinitehip.cli.options import add_dataclass_flags, dataclass_from_args
from infinitehip.cli.parser import add_command
from infinitehip.cli.print_config import add_print_config_flag, print_resolved
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.llm import LLM


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
    add_dataclass_flags(p, OffloadConfig, title="KV offloading (OffloadConfig)")
    add_print_config_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.print_config:
        return print_resolved(engine_config_from_args(args))
    if (args.prompt is None) == (args.prompt_file is None):
        raise ValueError("give one of --prompt and --prompt-file (on the command line or in the --config file)")
    prompt = args.prompt if args.prompt is not None else args.prompt_file.read_text()
    params = dataclass_from_args(SamplingParams, args)
    llm = LLM(config=engine_config_from_args(args))
    if args.chat:
        (out,) = llm.chat([{"role": "user", "content": prompt}], params)
    else:
        (out,) = llm.generate(prompt, params)
    print(out.text)
    return 0

"""`infinitehip eval passkey|niah`: accuracy over a length x depth sweep with any attention method;
`infinitehip eval compare`: several methods side by side (cli/eval_compare.py);
`infinitehip eval ruler` / `ruler-report`: RULER-style tasks over real prose (cli/eval_ruler.py)."""

from __future__ import annotations

import argparse
import dataclasses

from infinitehip.cli import eval_compare, eval_ruler
from infinitehip.cli.method_options import add_method_flags, engine_config_from_args
from infinitehip.cli.options import add_dataclass_flags, dataclass_from_args
from infinitehip.cli.parser import add_command
from infinitehip.cli.print_config import add_print_config_flag, print_resolved
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.engine.llm import LLM
from infinitehip.eval.runner import TASKS, EvalConfig, context_tokens_needed, run_eval


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="run an evaluation task")
    tasks = p.add_subparsers(dest="task", required=True)
    for task in TASKS:
        t = add_command(tasks, task, help=f"{task} retrieval accuracy over a length x depth sweep")
        add_dataclass_flags(t, EvalConfig, title="evaluation (EvalConfig)")
        add_dataclass_flags(t, EngineConfig, title="engine (EngineConfig)")
        add_method_flags(t)
        add_dataclass_flags(t, OffloadConfig, title="KV offloading (OffloadConfig)")
        add_print_config_flag(t)
        t.set_defaults(func=run)
    eval_compare.register(tasks)
    eval_ruler.register(tasks)


def run(args: argparse.Namespace) -> int:
    eval_config = dataclass_from_args(EvalConfig, args)
    engine_config = engine_config_from_args(args)
    if engine_config.max_context_tokens is None:
        needed = context_tokens_needed(args.task, eval_config.lengths)  # the user may still set it
        engine_config = dataclasses.replace(engine_config, max_context_tokens=needed)
    if args.print_config:
        return print_resolved(engine_config)
    llm = LLM(config=engine_config)
    run_eval(llm, args.task, eval_config)
    return 0

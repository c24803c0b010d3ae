"""`infinitehip eval ruler`: RULER-style retrieval tasks over real-prose haystacks, one attention method;
`infinitehip eval ruler-report FILES... --output docs/x.md`: markdown tables from result files.

Calibration is the same sweep with `--method dense --lengths 4096 7000`; the report marks tasks that dense
gets below 90% right there as "not counted".
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from infinitehip.cli.method_options import add_method_flags, engine_config_from_args
from infinitehip.cli.options import add_dataclass_flags, dataclass_from_args
from infinitehip.cli.parser import add_command
from infinitehip.cli.print_config import add_print_config_flag, print_resolved
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.eval.ruler.report import load_runs, markdown_report
from infinitehip.eval.ruler.runner import RulerConfig, context_tokens_needed


@dataclasses.dataclass(frozen=True)
class RulerReportConfig:
    output: str | None = None  # markdown path; None: print only
    title: str = "RULER results"  # heading of the report


def add_ruler_flags(p: argparse.ArgumentParser) -> None:
    """The flags `run` reads; `python -m bench ruler` takes the same ones."""
    add_dataclass_flags(p, RulerConfig, title="RULER sweep (RulerConfig)")
    add_dataclass_flags(p, EngineConfig, title="engine (EngineConfig)")
    add_method_flags(p)
    add_dataclass_flags(p, OffloadConfig, title="KV offloading (OffloadConfig)")
    add_print_config_flag(p)


def register(tasks) -> None:
    p = add_command(tasks, "ruler", help="RULER-style NIAH tasks over real prose", description=__doc__)
    add_ruler_flags(p)
    p.set_defaults(func=run)
    r = add_command(tasks, "ruler-report", help="markdown tables from `eval ruler` result files")
    r.add_argument("files", nargs="+", help="result JSON files of `infinitehip eval ruler`")
    add_dataclass_flags(r, RulerReportConfig, title="report")
    r.set_defaults(func=report)


def run(args: argparse.Namespace) -> int:
    from infinitehip.engine.llm import LLM  # heavy: only once the flags are valid
    from infinitehip.eval.ruler.runner import run_ruler

    config = dataclass_from_args(RulerConfig, args)
    engine_config = engine_config_from_args(args)
    if engine_config.max_context_tokens is None:
        engine_config = dataclasses.replace(engine_config, max_context_tokens=context_tokens_needed(config))
    if args.print_config:
        return print_resolved(engine_config)
    llm = LLM(config=engine_config)
    run_ruler(llm, config)
    return 0


def report(args: argparse.Namespace) -> int:
    config = dataclass_from_args(RulerReportConfig, args)
    for f in args.files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"no such results file: {f}")
    text = markdown_report(load_runs(args.files), config.title)
    if config.output:
        Path(config.output).parent.mkdir(parents=True, exist_ok=True)
        Path(config.output).write_text(text + "\n")
        print(f"wrote {config.output}")
    else:
        print(text)
    return 0

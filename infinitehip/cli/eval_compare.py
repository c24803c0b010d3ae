"""`infinitehip eval compare`: several attention methods on passkey / NIAH over lengths and depths.

Methods are registered names with their default config, or `name:preset` (e.g. infinitehip:3k-fast).
Writes compare.md (table), compare.json (every sample) and compare.png (accuracy vs length) to --output-dir.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from infinitehip.cli.options import add_dataclass_flags, dataclass_from_args
from infinitehip.cli.parser import add_command
from infinitehip.config.engine import EngineConfig
from infinitehip.engine.llm_engine import load_engine_model
from infinitehip.eval.compare import CompareConfig, run_compare
from infinitehip.eval.compare_report import write_reports

# Chosen per method by the comparison itself (--methods, --max-context).
ENGINE_FIELDS_SET_BY_COMPARE = ("method", "max_context_tokens")


def register(tasks) -> None:
    p = add_command(tasks, "compare", help="compare attention methods on passkey / NIAH", description=__doc__)
    add_dataclass_flags(p, CompareConfig, title="comparison (CompareConfig)")
    add_dataclass_flags(p, EngineConfig, title="engine (EngineConfig)", exclude=ENGINE_FIELDS_SET_BY_COMPARE)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = dataclass_from_args(CompareConfig, args)
    engine_config = dataclass_from_args(EngineConfig, args)
    console = Console()
    loaded = load_engine_model(engine_config)
    resolved: dict = {}  # each method's engine settings (config/resolved.py)
    records = run_compare(config, engine_config, loaded=loaded, console=console, resolved=resolved)
    meta = {"model": loaded.source, "device": str(engine_config.torch_device()), "dtype": str(engine_config.torch_dtype()),
            "page_size": engine_config.page_size,
            "prefill_chunk_size": engine_config.prefill_chunk_for(engine_config.torch_device()),
            "resolved_configs": resolved}
    paths = write_reports(records, config, meta, config.output_dir)
    console.print(paths["markdown"].read_text())
    console.print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0

"""Passkey / NIAH accuracy over lengths x depths with one loaded model (`infinitehip eval passkey|niah`'s sweep and
flags), the result file rewritten after every length; stops starting new lengths once --budget-s is spent, so a
time-boxed GPU run still returns what it did.

    python -m bench accuracy --method infinitehip --lengths 65536 131072 --depths 0.1 0.5 0.9 --output out.json
    python -m bench accuracy --model smol.gguf --method tokenselect --selection-cache false --lengths 65536 ...
    ... --offload-enabled --mask-bank-tokens 36864 --attention-bank-tokens 65536     # KV in host memory, GPU banks
    python -m bench accuracy --smoke                                   # CPU, embedded model, one 1K-token prompt

Method settings: --preset, --method-config JSON and each field's flag (--help-all), as `infinitehip eval`.
"""

from __future__ import annotations

import dataclasses
import time

from bench.common.cli import add_smoke_flag
from bench.common.meta import record_engine
from infinitehip.cli.method_options import add_method_flags, engine_config_from_args
from infinitehip.cli.options import add_dataclass_flags, dataclass_from_args
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.eval.runner import TASKS, EvalConfig, context_tokens_needed, run_eval


def add_arguments(p) -> None:
    p.add_argument("--task", default="passkey", choices=tuple(TASKS))
    p.add_argument("--budget-s", type=float, default=1e9, help="start no new length after this many seconds")
    add_smoke_flag(p, "embedded model, passkey at 1,024 tokens, one depth, method dense unless given")
    add_dataclass_flags(p, EvalConfig, exclude=("output",), title="evaluation (EvalConfig)")
    add_dataclass_flags(p, EngineConfig, title="engine (EngineConfig)")
    add_method_flags(p)
    add_dataclass_flags(p, OffloadConfig, title="KV offloading (OffloadConfig)")
    p.set_defaults(prefill_chunk_size=32768, show_progress=False)


def run(args, out) -> dict:
    from infinitehip import LLM

    if args.smoke:
        args.lengths, args.depths, args.device = [1024], [0.5], "cpu"
        if not hasattr(args, "method"):
            args.method = "dense"  # the sweep's path in seconds; --method M --smoke runs M
        out.meta["device"] = "cpu"
    eval_config = dataclass_from_args(EvalConfig, args)
    engine = engine_config_from_args(args)
    if engine.max_context_tokens is None:
        engine = dataclasses.replace(engine, max_context_tokens=context_tokens_needed(args.task, eval_config.lengths))
    llm = LLM(config=engine)
    record_engine(llm.engine)
    body = dict(task=args.task, method=engine.method, preset=getattr(args, "preset", None),
                method_config=dataclasses.asdict(engine.method_config) if engine.method_config is not None else None,
                seed=eval_config.seed,
                offload=dataclasses.asdict(engine.offload) if engine.offload != OffloadConfig() else None,
                engine_device=str(llm.engine.device), results=[])
    start = time.time()
    for length in eval_config.lengths:
        if time.time() - start > args.budget_s:
            print(f"budget spent: skipping length {length} and longer", flush=True)
            break
        one = dataclasses.replace(eval_config, lengths=(length,))
        body["results"] += [dataclasses.asdict(r) for r in run_eval(llm, args.task, one)]
        out.write(body)
    print(f"{'length':>8} {'correct':>8} {'mean s':>8}")
    for length in sorted({r["length"] for r in body["results"]}):
        rows = [r for r in body["results"] if r["length"] == length]
        print(f"{length:>8} {sum(r['correct'] for r in rows):>4}/{len(rows):<3} "
              f"{sum(r['seconds'] for r in rows) / len(rows):>8.1f}")
    return body

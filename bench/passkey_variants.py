"""Screen InfiniteHiP config variants on chosen (length, depth) passkey cases, one model load per variant.

Each variant is NAME=JSON (InfiniteHiPConfig overrides on top of --preset); '{}' is the preset itself.
Prints one table row per variant and writes every output to --output.

    python bench/passkey_variants.py --cases 65536:0.5 262144:0.3 --variant base='{}' \
        --variant c16='{"chunk_sizes":[256,32,16]}' --output out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import time
from pathlib import Path

import torch

from infinitehip import LLM, EngineConfig
from infinitehip.config.infinitehip import infinitehip_preset
from infinitehip.eval.runner import EvalConfig, context_tokens_needed, run_eval


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", nargs="+", required=True, metavar="LENGTH:DEPTH")
    p.add_argument("--variant", action="append", required=True, metavar="NAME=JSON")
    p.add_argument("--preset", default="3k")
    p.add_argument("--model", default=None)
    p.add_argument("--model-cache-dir", default=None)
    p.add_argument("--prefill-chunk-size", type=int, default=32768)
    p.add_argument("--output", required=True)
    args = p.parse_args()

    cases = [(int(c.split(":")[0]), float(c.split(":")[1])) for c in args.cases]
    variants = [(v.split("=", 1)[0], json.loads(v.split("=", 1)[1])) for v in args.variant]
    engine = EngineConfig(model=args.model, model_cache_dir=args.model_cache_dir, method="infinitehip",
                          max_context_tokens=context_tokens_needed("passkey", tuple(length for length, _ in cases)),
                          prefill_chunk_size=args.prefill_chunk_size, show_progress=False)
    report: dict[str, list] = {}
    for name, overrides in variants:
        llm = LLM(config=engine, method_config=infinitehip_preset(args.preset, **overrides))
        rows = []
        for length, depth in cases:
            start = time.time()
            rows += [dataclasses.asdict(r) for r in run_eval(llm, "passkey", EvalConfig(lengths=(length,), depths=(depth,)))]
            print(f"{name} {length}:{depth} -> {rows[-1]['output']!r} ({rows[-1]['correct']}, {time.time() - start:.1f} s)",
                  flush=True)
        report[name] = rows
        Path(args.output).write_text(json.dumps({"preset": args.preset, "variants": dict(variants), "results": report}, indent=1))
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(f"{'variant':<12} {'correct':>8}  outputs")
    for name, rows in report.items():
        print(f"{name:<12} {sum(r['correct'] for r in rows):>4}/{len(rows):<3}  " + " | ".join(r["output"][:24] for r in rows))


if __name__ == "__main__":
    main()

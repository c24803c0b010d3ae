"""Passkey / NIAH sweep over lengths with one loaded model, results written after every length.

Stops starting new lengths once --budget-s is spent, so a time-boxed GPU run still returns what it did.

    python bench/passkey_sweep.py --method infinitehip --lengths 65536 131072 --depths 0.1 0.5 0.9 --output out.json
    ... --offload-enabled --mask-bank-tokens 36864 --attention-bank-tokens 65536     # KV in host memory, GPU banks
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from infinitehip import LLM, EngineConfig
from infinitehip.attention.registry import method_spec
from infinitehip.config.offload import OffloadConfig
from infinitehip.eval.runner import EvalConfig, context_tokens_needed, run_eval


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--task", default="passkey")
    p.add_argument("--method", default="infinitehip")
    p.add_argument("--preset", default=None, help="the method's named preset (default: the method's default)")
    p.add_argument("--lengths", type=int, nargs="+", required=True)
    p.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    p.add_argument("--seed", type=int, default=0, help="base seed: another value gives other pass keys (same filler)")
    p.add_argument("--model", default=None)
    p.add_argument("--model-cache-dir", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--prefill-chunk-size", type=int, default=32768)
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=JSON",
                   help="overrides of the method's config, e.g. refresh_intervals=[1,1,1] (infinitehip), "
                        "selection_cache=false (tokenselect), 'catalyst_question=\"What is the pass key?\"' (infinipot)")
    p.add_argument("--budget-s", type=float, default=1e9)
    p.add_argument("--offload-enabled", action="store_true", help="every token's K/V in host memory behind GPU banks")
    p.add_argument("--mask-bank-tokens", type=int, default=OffloadConfig.mask_bank_tokens)
    p.add_argument("--attention-bank-tokens", type=int, default=OffloadConfig.attention_bank_tokens)
    p.add_argument("--output", required=True)
    args = p.parse_args()

    engine = EngineConfig(model=args.model, model_cache_dir=args.model_cache_dir, method=args.method, device=args.device,
                          max_context_tokens=context_tokens_needed(args.task, tuple(args.lengths)), prefill_chunk_size=args.prefill_chunk_size,
                          show_progress=False)
    overrides = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    method_config = method_spec(args.method).config(args.preset, **overrides)
    offload = OffloadConfig(offload_enabled=True, mask_bank_tokens=args.mask_bank_tokens,
                            attention_bank_tokens=args.attention_bank_tokens) if args.offload_enabled else None
    llm = LLM(config=engine, method_config=method_config, offload_config=offload)
    start, results = time.time(), []
    for length in args.lengths:
        if time.time() - start > args.budget_s:
            print(f"budget spent: skipping length {length} and longer", flush=True)
            break
        results += [dataclasses.asdict(r) for r in run_eval(llm, args.task, EvalConfig(lengths=(length,), depths=tuple(args.depths), seed=args.seed))]
        Path(args.output).write_text(json.dumps({"method": args.method, "preset": args.preset, "overrides": overrides,
                                                 "seed": args.seed,
                                                 "offload": dataclasses.asdict(offload) if offload else None,
                                                 "device": str(llm.engine.device),
                                                 "results": results}, indent=1))
    print(f"{'length':>8} {'correct':>8} {'mean s':>8}")
    for length in sorted({r["length"] for r in results}):
        rows = [r for r in results if r["length"] == length]
        print(f"{length:>8} {sum(r['correct'] for r in rows):>4}/{len(rows):<3} {sum(r['seconds'] for r in rows) / len(rows):>8.1f}")


if __name__ == "__main__":
    main()

"""Tensor parallelism with the KV offloaded: the Llama-3.1-8B shape (RANDOM bf16 weights: speed, not answers), one
sequence of a given context, InfiniteHiP with CUDA-graph decode; TTFT (add_request -> first token) and decode
tokens/s, for each tensor-parallel size in turn on the same machine, as JSON (commit, device, versions, args).

    python -m bench tensor-parallel --tp 1 2 --context 1048576 --cold-context 32768 --kv-dtype fp8_e4m3 --output r.json
    python -m bench tensor-parallel --tp 2 --find-max 4194304 3145728 2097152 --fast-prefill --kv-dtype fp8_e4m3
    python -m bench tensor-parallel --smoke          # CPU, tiny model, tp 1 and 2 (gloo), tokens compared

Each size runs in a child process (sizes > 1 under torchrun: `python -m torch.distributed.run ... -m bench
tensor-parallel`), so every rank runs this suite: --fast-prefill (common/instrument.py: the prefill's sparse
attention replaced by zeros, K/V and saliency written as usual) then applies on every rank. TTFT is only a real
time-to-first-token without --fast-prefill, and a warm one with --cold-context (the first request compiles).
--find-max: the contexts, largest first; the first one whose KV the capacity planner of every rank accepts and
that runs is reported (each rank stores its own KV heads: host memory and banks are per rank).
Random weights differ between sizes (each rank draws its own part): tokens are not compared on GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.common import models
from bench.common.cli import add_method_flags, add_offload_flags, add_smoke_flag, banks_for, method_config
from bench.common.instrument import use_fast_prefill
from bench.common.meta import ROOT
from infinitehip.cli.options import parse_int
from infinitehip.config.engine import EngineConfig
from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.model.rank_weights import RankWeights


def sync(args) -> None:
    if torch.cuda.is_available() and not args.smoke:
        torch.cuda.synchronize()


def run_size(args, tp: int, context: int) -> dict:
    model = models.TINY if args.smoke else models.LLAMA_31_8B
    method = models.TINY_METHOD if args.smoke else method_config(args)
    total = max(context, args.cold_context) + args.warmup_steps + args.steps + 64
    # Banks sized for one rank's heads (each rank resolves only its own).
    offload = banks_for(method, total, model.num_heads // tp, args)
    config = EngineConfig(method="infinitehip", device="cpu" if args.smoke else "cuda",
                          dtype="float32" if args.smoke else "bfloat16", max_context_tokens=total,
                          prefill_chunk_size=args.chunk, max_num_seqs=1, show_progress=not args.smoke,
                          cuda_graphs=not (args.smoke or args.no_graphs), use_generation_config=False,
                          tensor_parallel_size=tp, method_config=method, offload=offload)
    t_build = time.perf_counter()
    engine = LLMEngine(config, RankWeights.random(model, seed=0, source="random Llama-3.1-8B-shaped bf16"))
    build_s = time.perf_counter() - t_build
    try:
        # Cold: the engine's first request (Triton compilation, allocator growth), of --cold-context tokens and
        # other token ids (no shared prefix); the timed request that follows is warm, as a running server serves it.
        cold_len = min(args.cold_context, context) if args.cold_context else 0
        cold_s = None
        if cold_len:
            t0 = time.perf_counter()
            cold = engine.add_request(models.random_ids(model.vocab_size, cold_len, seed=1),
                                      SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
            while not cold.is_finished:
                engine.step()
            sync(args)
            cold_s = time.perf_counter() - t0
        sync(args)
        t0 = time.perf_counter()
        seq = engine.add_request(models.random_ids(model.vocab_size, context, seed=0),
                                 SamplingParams(temperature=0.0, max_tokens=args.warmup_steps + args.steps + 1,
                                                ignore_eos=True))
        while not seq.output_ids:
            engine.step()
        sync(args)
        ttft_s = time.perf_counter() - t0
        steps = []
        while not seq.is_finished:
            t = time.perf_counter()
            engine.step()
            sync(args)
            steps.append(time.perf_counter() - t)
        timed = steps[args.warmup_steps:] or steps
        stats = engine.kv_stats()
        graphs = engine.runner.graph_decoder
        return dict(
            tp=tp, context=context, build_s=build_s, ttft_s=ttft_s, ttft_real=not args.fast_prefill,
            ttft_warm=bool(cold_len), cold_context=cold_len, cold_ttft_s=cold_s,
            decode_ms=statistics.fmean(timed) * 1e3, decode_tok_s=1e3 / (statistics.fmean(timed) * 1e3),
            decode_ms_median=statistics.median(timed) * 1e3, timed_steps=len(timed), tokens=seq.output_ids,
            rank0_peak_gpu_gb=torch.cuda.max_memory_allocated() / 1e9 if not args.smoke else 0.0,
            rank0_plan=engine.kv_plan.summary if engine.kv_plan is not None else "",
            rank0_mask_hit=stats["mask"].hit_ratio if stats else None,
            rank0_attention_hit=stats["attention"].hit_ratio if stats else None,
            graph_captures=graphs.captures if graphs else 0, graph_replays=graphs.replays if graphs else 0,
            resolved_config=engine.resolved.as_dict(),  # moved into the parent's meta (run)
        )
    finally:
        engine.close()
        del engine
        if torch.cuda.is_available() and not args.smoke:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def child(args) -> None:
    """One tensor-parallel size: runs in-process (size 1) or as torchrun's rank 0 (the others never return from
    LLMEngine()); appends its rows to --rows."""
    tp = args.tp[0]
    rows = []
    for context in args.find_max or [args.context]:
        try:
            rows.append(run_size(args, tp, context))
        except (ValueError, RuntimeError, torch.OutOfMemoryError) as e:  # the planner refused, or out of memory
            rows.append(dict(tp=tp, context=context, error=f"{type(e).__name__}: {str(e)[:400]}"))
            print(f"tp {tp} context {context:,}: {rows[-1]['error']}", flush=True)
            continue
        print({k: v for k, v in rows[-1].items() if k != "tokens"}, flush=True)
        if args.find_max:
            break  # the largest that ran
    with open(args.rows, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def add_arguments(p) -> None:
    p.add_argument("--tp", type=int, nargs="+", default=[1, 2], help="tensor-parallel sizes, run one after another")
    p.add_argument("--context", type=parse_int, default=1048576)
    p.add_argument("--find-max", type=parse_int, nargs="*", default=None, metavar="CONTEXT",
                   help="contexts, largest first: report the largest that runs (with each --tp size)")
    p.add_argument("--steps", type=int, default=64, help="timed decode steps")
    p.add_argument("--warmup-steps", type=int, default=34, help="decode steps before timing (graph captures)")
    p.add_argument("--chunk", type=parse_int, default=32768, help="prefill chunk")
    p.add_argument("--cold-context", type=parse_int, default=0,
                   help="first serve a request of this many tokens (cold: compilation), then time the context warm")
    p.add_argument("--fast-prefill", action="store_true", help="prefill sparse attention replaced by zeros (above)")
    p.add_argument("--no-graphs", action="store_true")
    add_smoke_flag(p, "tiny model, 700 tokens, tp 1 and 2 (gloo)")
    p.add_argument("--rows", default=None, help=argparse.SUPPRESS)  # internal: a size's rows (JSON lines)
    add_method_flags(p, preset="3k-fast")
    add_offload_flags(p)


def _without_tp(argv: list[str]) -> list[str]:
    if "--tp" not in argv:
        return argv
    i = j = argv.index("--tp")
    j += 1
    while j < len(argv) and not argv[j].startswith("--"):
        j += 1
    return argv[:i] + argv[j:]


def run(args, out) -> dict | None:
    if args.smoke:
        args.context, args.steps, args.warmup_steps, args.chunk, args.min_attention_bank = 700, 8, 2, 128, 0
        args.cold_context = 300
        out.meta["device"], out.meta["gpus"] = "cpu", 0
    if args.fast_prefill:
        use_fast_prefill()
    if args.rows is not None:  # a child: one size (under torchrun when > 1)
        child(args)
        return None
    rows_file = Path(args.output or "tensor_parallel.json").with_suffix(".rows.jsonl")
    rows_file.unlink(missing_ok=True)
    base = [a for a in _without_tp(out.meta["argv"])]
    if "--output" in base:
        i = base.index("--output")
        base = base[:i] + base[i + 2:]
    for tp in args.tp:
        argv = ["tensor-parallel", *base, "--tp", str(tp), "--rows", str(rows_file)]
        launcher = [] if tp == 1 else ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={tp}"]
        cmd = [sys.executable, *launcher, "-m", "bench", *argv]
        print(" ".join(cmd), flush=True)
        code = subprocess.run(cmd, cwd=ROOT).returncode
        if code:
            print(f"tp {tp}: exit code {code}", flush=True)
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
    rows_file.unlink(missing_ok=True)
    for r in rows:  # each child's engine settings
        out.record_resolved(r.pop("resolved_config", None))
    out.meta.update(model="Llama-3.1-8B shape, RANDOM bf16 weights" if not args.smoke else "tiny random",
                    method=f"infinitehip:{'tiny' if args.smoke else args.preset}",
                    prefill="FAST (sparse attention replaced by zeros)" if args.fast_prefill else "real")
    result = dict(rows=rows)
    m = out.meta
    print(f"\n{m['device']} x{m['gpus']}, torch {m['torch']}, {m['model']}, {m['method']}, prefill {m['prefill']}")
    print("| TP | context | TTFT s | cold TTFT s (length) | decode ms/step | tok/s | rank-0 peak GPU GB | "
          "rank-0 mask / attention hit | note |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['tp']} | {r['context']:,} | | | | | | | {r['error'][:120]} |")
        else:
            hit = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
            cold = "-" if r["cold_ttft_s"] is None else f"{r['cold_ttft_s']:.1f} ({r['cold_context']:,})"
            print(f"| {r['tp']} | {r['context']:,} | {r['ttft_s']:.1f} | {cold} | {r['decode_ms']:.2f} | {r['decode_tok_s']:.1f} | "
                  f"{r['rank0_peak_gpu_gb']:.1f} | {hit(r['rank0_mask_hit'])} / {hit(r['rank0_attention_hit'])} | "
                  f"{'TTFT real' if r['ttft_real'] else 'fast prefill'} |")
    if args.smoke:  # the tiny model's weights are drawn per rank: only the runs' completion is checked
        result["ok"] = sorted(r["tp"] for r in rows if "error" not in r) == sorted(args.tp)
    return result

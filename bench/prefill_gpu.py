"""Whole-model time to first token (TTFT): the engine's real prefill of L prompt tokens up to the first sampled token,
per method, with the KV resident or offloaded, against dense SDPA-flash in the same run.

    python bench/prefill_gpu.py --contexts 131072 524288 --methods infinitehip dense --modes resident
    python bench/prefill_gpu.py --contexts 1048576 --methods infinitehip --modes offloaded --kv-dtype fp8_e4m3 \\
        --cold-context 65536
    python bench/prefill_gpu.py --smoke                                   # CPU, tiny random model

Model: Llama-3.1-8B shape with RANDOM bf16 weights (tokens are noise; every FLOP and byte is real).
Each (method, mode, context) cell builds one engine and sends two requests with different prompts:
  cold   the first request the engine sees (Triton compilation, CUDA allocator growth included), of
         --cold-context tokens (default: the context itself);
  warm   the measured request of L tokens, as a running server would serve it (kernels compiled).
--phase-times splits the warm request (synchronised timers, which add syncs of their own).
Dense baselines:
  engine dense   the engine with method dense (SDPA flash / memory-efficient per prefill chunk), resident only;
                 skipped where its KV does not fit the GPU (--dense-engine-max);
  layer-wise     the paper's way where a dense KV cannot fit: the model without attention over the prompt
                 (one chunk timed, times the chunks) + layers x one-shot causal SDPA-flash of one layer at L.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SMOKE = "--smoke" in sys.argv
if SMOKE and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.decode_gpu import LLAMA_31_8B  # noqa: E402
from bench.offload_decode_gpu import PHASES, TINY, TINY_METHOD, banks_for, sync, time_phases  # noqa: E402
from infinitehip import EngineConfig, SamplingParams  # noqa: E402
from infinitehip.config.infinitehip import infinitehip_preset  # noqa: E402
from infinitehip.engine.llm_engine import LLMEngine  # noqa: E402
from infinitehip.model.loading import LoadedModel, random_model  # noqa: E402


def ttft(engine: LLMEngine, length: int, seed: int, device: torch.device) -> float:
    """Seconds from add_request to the first sampled token of a random prompt of `length` tokens."""
    ids = torch.randint(0, engine.model_config.vocab_size, (length,), generator=torch.Generator().manual_seed(seed))
    sync(device)
    t0 = time.perf_counter()
    seq = engine.add_request(ids.tolist(), SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    while not seq.output_ids:
        engine.step()
    sync(device)
    elapsed = time.perf_counter() - t0
    while not seq.is_finished:
        engine.step()
    return elapsed


def run_cell(loaded: LoadedModel, method_name: str, mode: str, context: int, args, device: torch.device) -> dict:
    method = (TINY_METHOD if args.smoke else infinitehip_preset(args.preset)) if method_name == "infinitehip" else None
    offload = banks_for(method, context + 64, loaded.config.num_heads, args) if mode != "resident" else None
    if mode == "offloaded-banks":  # the prefill resolves through the banks instead of a staged copy of each layer
        offload = dataclasses.replace(offload, stage_prefill=False)
    engine = LLMEngine(EngineConfig(method=method_name, device=str(device), dtype=args.dtype,
                                    max_context_tokens=context + 64, prefill_chunk_size=args.chunk,
                                    show_progress=False, max_num_seqs=1, enable_prefix_caching=False),
                       loaded, method, offload)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    cold_len = min(args.cold_context or context, context)
    cold_s = ttft(engine, cold_len, seed=1, device=device)
    PHASES.clear()
    prof = None
    if args.profile_rows and method is not None:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
        prof.__enter__()
    warm_s = ttft(engine, context, seed=2, device=device)
    if prof is not None:
        prof.__exit__(None, None, None)
        for key in ("cuda_time_total", "cpu_time_total"):
            print(f"profile of the warm prefill ({method_name}, {mode}, {context:,}; profiled, so slower), by {key}:")
            print(prof.key_averages().table(sort_by=key, row_limit=args.profile_rows, max_name_column_width=70))
    row = dict(method=method_name, mode=mode, context=context, preset=args.preset if method else None,
               cold_context=cold_len, cold_ttft_s=cold_s, warm_ttft_s=warm_s,
               phases={k: v for k, v in PHASES.items() if v > 0},
               peak_gpu_gb=torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else 0.0,
               plan=engine.kv_plan.summary if engine.kv_plan is not None else "")
    if mode != "resident":
        stats = engine.kv_stats()
        row.update(mask_hit=stats["mask"].hit_ratio, attention_hit=stats["attention"].hit_ratio)
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def dense_layerwise_prefill(loaded: LoadedModel, contexts: list[int], chunk: int, device: torch.device) -> list[dict]:
    """Dense prefill estimate: (the model without attention over one chunk) x chunks + layers x causal flash at L."""
    mc, model = loaded.config, loaded.model
    backend = torch.nn.attention.SDPBackend.FLASH_ATTENTION if device.type == "cuda" else torch.nn.attention.SDPBackend.MATH
    flash = lambda: torch.nn.attention.sdpa_kernel(backend)  # noqa: E731 (a fresh context manager per use)

    def timed(fn, reps: int = 2, warmup: bool = True) -> float:
        if warmup:
            fn()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync(device)
        return (time.perf_counter() - t0) / reps

    rows = []
    with torch.inference_mode():
        ids = torch.zeros(chunk, dtype=torch.long, device=device)
        rest_chunk_s = timed(lambda: model(ids, lambda layer, q, k, v: q))
        small = torch.randn(1, mc.num_heads, chunk, mc.head_dim, dtype=loaded_dtype(loaded), device=device)
        with flash():  # compiles / warms the flash kernel at a small length; each context is then timed once
            F.scaled_dot_product_attention(small, small[:, : mc.num_kv_heads], small[:, : mc.num_kv_heads],
                                           is_causal=True, enable_gqa=True)
        for context in contexts:
            q = torch.randn(1, mc.num_heads, context, mc.head_dim, dtype=loaded_dtype(loaded), device=device)
            k = torch.randn(1, mc.num_kv_heads, context, mc.head_dim, dtype=q.dtype, device=device)
            v = torch.randn_like(k)
            with flash():
                layer_s = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), reps=1,
                                warmup=False)
            del q, k, v
            if device.type == "cuda":
                torch.cuda.empty_cache()
            rest_s = rest_chunk_s * context / chunk
            rows.append(dict(context=context, rest_s=rest_s, layer_attention_s=layer_s,
                             dense_ttft_s=rest_s + mc.num_layers * layer_s))
    return rows


def loaded_dtype(loaded: LoadedModel) -> torch.dtype:
    return next(loaded.model.parameters()).dtype


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", type=int, nargs="+", default=[131072])
    p.add_argument("--methods", nargs="+", default=["infinitehip", "dense"], choices=("infinitehip", "dense"))
    p.add_argument("--modes", nargs="+", default=["resident"], choices=("resident", "offloaded", "offloaded-banks"),
                   help="offloaded: FP8/BF16 host store, prefill from a staged copy of each layer (the default); "
                        "offloaded-banks: the prefill resolves through the GPU banks")
    p.add_argument("--preset", default="default", help="infinitehip preset")
    p.add_argument("--chunk", type=int, default=32768, help="prefill chunk (tokens per engine step)")
    p.add_argument("--cold-context", type=int, default=None, help="length of the first (cold) request; default: L")
    p.add_argument("--kv-dtype", default="auto", help="host store dtype when offloaded (auto, fp8_e4m3, fp8_e5m2)")
    p.add_argument("--mask-bank-tokens", type=int, default=None)
    p.add_argument("--attention-bank-tokens", type=int, default=None)
    p.add_argument("--min-attention-bank", type=int, default=65536)
    p.add_argument("--dense-engine-max", type=int, default=262144, help="largest context for the engine's dense run")
    p.add_argument("--dense-layerwise", action="store_true", help="the layer-wise dense estimate at every context")
    p.add_argument("--dense-contexts", type=int, nargs="*", default=None, help="layer-wise estimate here (default: --contexts)")
    p.add_argument("--profile-rows", type=int, default=0, help="torch.profiler tables of the warm infinitehip prefill")
    p.add_argument("--phase-times", action="store_true", help="synchronised wall time per prefill phase (warm)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny random model, 700 tokens")
    p.add_argument("--output", default=None, help="JSON file, rewritten after every cell")
    args = p.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke:
        args.contexts, args.chunk, args.dtype, args.min_attention_bank = [700], 128, "float32", 0
        loaded = LoadedModel(TINY, random_model(TINY, device, torch.float32), None, "tiny random", Path("."))
    else:
        loaded = LoadedModel(LLAMA_31_8B, random_model(LLAMA_31_8B, device, torch.bfloat16), None,
                             "random Llama-3.1-8B-shaped weights", Path("."))
    if args.phase_times:
        time_phases(device)
    import triton

    meta = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
                triton=triton.__version__, model=loaded.source, argv=sys.argv[1:], preset=args.preset,
                git_commit=subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
                method_config=None if args.smoke else infinitehip_preset(args.preset).__dict__)
    rows: list[dict] = []
    dense: list[dict] = []

    def dump() -> None:
        if args.output:
            Path(args.output).write_text(json.dumps(dict(meta=meta, rows=rows, dense_layerwise=dense), indent=1,
                                                    default=str))

    for context in args.contexts:
        for method_name in args.methods:
            for mode in args.modes:
                if method_name == "dense" and (mode != "resident" or context > args.dense_engine_max):
                    continue
                try:
                    row = run_cell(loaded, method_name, mode, context, args, device)
                except torch.OutOfMemoryError as e:
                    row = dict(method=method_name, mode=mode, context=context, error=f"out of GPU memory: {str(e)[:200]}")
                    torch.cuda.empty_cache()
                rows.append(row)
                print(json.dumps(row, default=str), flush=True)
                dump()
    if args.dense_layerwise:
        dense = dense_layerwise_prefill(loaded, args.dense_contexts or args.contexts, args.chunk, device)
        dump()
    print(f"\ndevice: {meta['device']}; model: {loaded.source}; preset {args.preset}\n")
    print("| context | method | KV | cold TTFT s (cold length) | warm TTFT s | dense layer-wise s | warm / dense |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: |")
    by_context = {d["context"]: d["dense_ttft_s"] for d in dense}
    for r in rows:
        if "error" in r:
            print(f"| {r['context']:,} | {r['method']} | {r['mode']} | {r['error'][:60]} | | | |")
            continue
        ref = by_context.get(r["context"])
        print(f"| {r['context']:,} | {r['method']} | {r['mode']} | {r['cold_ttft_s']:.2f} ({r['cold_context']:,}) | "
              f"{r['warm_ttft_s']:.2f} | {'-' if ref is None else f'{ref:.2f}'} | "
              f"{'-' if ref is None else format(r['warm_ttft_s'] / ref, '.2f')} |")
        if r["phases"]:
            print("    phases: " + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(r["phases"].items(), key=lambda kv: -kv[1])))
    for d in dense:
        print(f"dense layer-wise at {d['context']:,}: rest {d['rest_s']:.2f} s + {LLAMA_31_8B.num_layers if not args.smoke else TINY.num_layers}"
              f" x {d['layer_attention_s'] * 1e3:.1f} ms = {d['dense_ttft_s']:.2f} s")


if __name__ == "__main__":
    main()

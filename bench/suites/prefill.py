"""Whole-model time to first token (TTFT): the engine's real prefill of L prompt tokens up to the first sampled token,
per method, with the KV resident or offloaded, against dense SDPA-flash in the same run.

    python -m bench prefill --contexts 131072 524288 --methods infinitehip dense --modes resident
    python -m bench prefill --contexts 1048576 --methods infinitehip --modes offloaded --kv-dtype fp8_e4m3 \\
        --cold-context 65536
    python -m bench prefill --contexts 131072 1048576 --methods cascade streaming dense --cascade-preset paper
    python -m bench prefill --smoke                                   # CPU, tiny random model

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

import dataclasses
import json

import torch

from bench.common import models
from bench.common.cli import add_method_flags, add_offload_flags, add_smoke_flag, banks_for, method_config
from bench.common.dense import prefill_layerwise
from bench.common.meta import record_engine
from bench.common.timing import first_token_s
from infinitehip import EngineConfig
from infinitehip.cli.options import parse_int
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.model.loading import LoadedModel
from infinitehip.profiling import record_phases

PHASES: dict[str, float] = {}  # --phase-times: seconds per marked product phase (infinitehip/profiling.py)


def ttft(engine: LLMEngine, length: int, seed: int) -> float:
    """Seconds from add_request to the first sampled token of a random prompt of `length` tokens."""
    return first_token_s(engine, models.random_ids(engine.model_config.vocab_size, length, seed), 1)[0]


def fixed_memory_config(method_name: str, args, trained_length: int):
    """cascade: --cascade-preset (sized for the model); streaming: the same KV memory (sinks + window + stride)."""
    from infinitehip.attention.methods.streaming.config import StreamingConfig
    from infinitehip.config.methods import method_spec

    cascade = method_spec("cascade").config(args.cascade_preset).for_model(trained_length)
    if method_name == "cascade":
        return cascade
    return StreamingConfig(sink_tokens=cascade.sink_tokens, window_tokens=cascade.cache_tokens - cascade.sink_tokens,
                           eviction_batch_tokens=cascade.stride_tokens)


def run_cell(loaded: LoadedModel, method_name: str, mode: str, context: int, args, device: torch.device) -> dict:
    method = (models.TINY_METHOD if args.smoke else method_config(args)) if method_name == "infinitehip" else None
    if method_name in ("cascade", "streaming"):
        method = fixed_memory_config(method_name, args, loaded.config.max_position_embeddings)
    offload = banks_for(method, context + 64, loaded.config.num_heads, args) if mode != "resident" else None
    if mode == "offloaded-banks":  # the prefill resolves through the banks instead of a staged copy of each layer
        offload = dataclasses.replace(offload, stage_prefill=False)
    engine = LLMEngine(EngineConfig(method=method_name, device=str(device), dtype=args.dtype,
                                    max_context_tokens=context + 64, prefill_chunk_size=args.chunk,
                                    show_progress=False, max_num_seqs=1, enable_prefix_caching=False,
                                    method_config=method, offload=offload),
                       loaded)
    record_engine(engine)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    cold_len = min(args.cold_context or context, context)
    cold_s = ttft(engine, cold_len, seed=1)
    PHASES.clear()
    prof = None
    if args.profile_rows and method is not None:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
        prof.__enter__()
    warm_s = ttft(engine, context, seed=2)
    if prof is not None:
        prof.__exit__(None, None, None)
        for key in ("cuda_time_total", "cpu_time_total"):
            print(f"profile of the warm prefill ({method_name}, {mode}, {context:,}; profiled, so slower), by {key}:")
            print(prof.key_averages().table(sort_by=key, row_limit=args.profile_rows, max_name_column_width=70))
    row = dict(method=method_name, mode=mode, context=context,
               preset=args.cascade_preset if method_name in ("cascade", "streaming") else args.preset if method else None,
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


def add_arguments(p) -> None:
    p.add_argument("--contexts", type=parse_int, nargs="+", default=[131072])
    p.add_argument("--methods", nargs="+", default=["infinitehip", "dense"],
                   choices=("infinitehip", "dense", "cascade", "streaming"))
    p.add_argument("--cascade-preset", default="paper",
                   help="cascade's preset (default: paper, a 16K cache); streaming gets the same KV memory")
    p.add_argument("--modes", nargs="+", default=["resident"], choices=("resident", "offloaded", "offloaded-banks"),
                   help="offloaded: FP8/BF16 host store, prefill from a staged copy of each layer (the default); "
                        "offloaded-banks: the prefill resolves through the GPU banks")
    p.add_argument("--chunk", type=parse_int, default=32768, help="prefill chunk (tokens per engine step)")
    p.add_argument("--cold-context", type=parse_int, default=None, help="length of the first (cold) request; default: L")
    p.add_argument("--dense-engine-max", type=parse_int, default=262144, help="largest context for the engine's dense run")
    p.add_argument("--dense-layerwise", action="store_true", help="the layer-wise dense estimate at every context")
    p.add_argument("--dense-contexts", type=parse_int, nargs="*", default=None,
                   help="layer-wise estimate here (default: --contexts)")
    p.add_argument("--profile-rows", type=int, default=0, help="torch.profiler tables of the warm infinitehip prefill")
    p.add_argument("--phase-times", action="store_true", help="synchronised wall time per prefill phase (warm)")
    p.add_argument("--dtype", default="bfloat16")
    add_smoke_flag(p, "tiny random model, 700 tokens")
    add_method_flags(p, preset="default")
    add_offload_flags(p)


def run(args, out) -> dict:
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke:
        args.contexts, args.chunk, args.dtype, args.min_attention_bank = [700], 128, "float32", 0
        out.meta["device"] = "cpu"
    loaded = models.load("tiny" if args.smoke else "random8b", device, getattr(torch, args.dtype))
    if args.phase_times:
        record_phases(device, PHASES)
    meta = out.meta
    meta.update(model=loaded.source, preset=args.preset,
                method_config=None if args.smoke else dataclasses.asdict(method_config(args)))
    rows: list[dict] = []
    dense: list[dict] = []

    def dump() -> None:
        out.write(dict(rows=rows, dense_layerwise=dense))

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
        dense = prefill_layerwise(loaded, args.dense_contexts or args.contexts, args.chunk, device)
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
        print(f"dense layer-wise at {d['context']:,}: rest {d['rest_s']:.2f} s + {loaded.config.num_layers}"
              f" x {d['layer_attention_s'] * 1e3:.1f} ms = {d['dense_ttft_s']:.2f} s")
    return dict(rows=rows, dense_layerwise=dense)

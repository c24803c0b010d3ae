"""Single-layer attention latency: InfiniteHiP vs dense FlashAttention (paper Table 19 style).

One attention layer with Llama-3-8B shapes (32 query heads, 8 KV heads, head_dim 128, bf16) over a
one-layer PagedKVCache holding T random tokens (keys without RoPE, as the engine stores them), for each
context T in --contexts:

Prefill = chunked prefill of the LAST --chunk (default 32K) queries at context T (queries at positions
T-chunk .. T-1, all T keys already cached).
  dense   torch SDPA with the FLASH_ATTENTION backend forced, keys/queries already rotated (dense needs
          no RoPE work at attention time). Timed as two calls, reported as their sum:
            (a) the chunk's queries over the T-chunk prefix keys, non-causal;
            (b) the causal chunk x chunk square.
          The merge of the two partial softmaxes (a few elementwise ops) is not included, so dense is
          slightly favoured.
  ours    the method's own building blocks: each pruning stage (`InfiniteHiPAttention._stage`, i.e.
          `run_stage`, including the child-block mapping), the block-sparse attention
          (`_attend_prefill`: key-list assembly + RoPE positions + kernel; the kernel alone is also shown),
          and the total as one real `InfiniteHiPAttention.prefill` call.
Decode = one query at position T-1 over T keys.
  dense   SDPA FLASH, 1 query x T keys (GQA); the achieved KV read bandwidth is printed as a sanity check.
  ours    per preset (--presets, default: default 3k 3k-fast; the prefill chunk of --prefill-preset, default):
          stage i    one `_stage` call with a 1-query block (what a refresh of stage i costs);
          BSA        `InfiniteHiPAttention.decode` with every stage cached (no refresh): key list + kernel;
          AR         `InfiniteHiPAttention.decode` with every stage refreshed each step (no mask caching);
          amortized (formula)  sum_i stage_i / refresh_intervals[i] + BSA;
          amortized (e2e)      the real mask-cache path: `decode` run for 2 x max(refresh interval) steps
                               from a fresh state (different random queries, same context), mean per step;
          GPU-only (CUDA graph, CUDA only): the device work of each stage (q rotation, candidate chunks,
                               chunk-scoring kernel, top-k, sort) and the BSA kernel captured in CUDA
                               graphs, i.e. without the eager Python/launch overhead and host syncs of the
                               method's glue code; "GPU-only amortized" = sum_i kernel_i / r_i + BSA kernel.
          The layer is a "late" layer (layer index >= 3: relative pruning RoPE, k3 = 2048) unless
          --layer-type early (chunk-indexed pruning RoPE, k3 = 4096).

Timing: CUDA events around each call, after an L2 flush (256 MB memset) and a device sync, so the eager
host overhead of each call is included (its own host syncs included); warm-up calls first; median of
several reps (mean for the e2e decode loop). CPU: time.perf_counter.

    python -m bench attention-latency                                   # GPU, 128K..1M
    python -m bench attention-latency --contexts 1048576 --output lat.json
    python -m bench attention-latency --device cpu --contexts 16384 --impl reference --chunk 4096
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import platform
import sys
import time
import traceback
from typing import Any, Callable

import torch

from bench.common.timing import Timer, log
from bench.suites import attention_parts as parts
from bench.suites.attention_parts import (DTYPES, LLAMA3_8B_LAYER, bench_dense, bench_ours_decode, bench_ours_prefill,
                                          build_context)
from infinitehip.attention.methods.infinitehip.config import PRESETS
from infinitehip.cli.options import parse_int
from infinitehip.model.rope import RotaryEmbedding


# ---- reporting -------------------------------------------------------------------------------------------
def fmt(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fx(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def print_context_tables(T: int, C: int, dense: dict, ours_p: dict | None, ours_d: dict[str, dict]) -> None:
    log(f"\n### T = {T:,} tokens\n")
    if ours_p is not None or "prefill_ms" in dense:
        log(f"Prefill: the last {C:,}-query chunk (positions {T - C:,}..{T - 1:,}), ms\n")
        log("| component | ms | share of ours |\n| --- | ---: | ---: |")
        if "prefill_ms" in dense:
            log(f"| dense {parts.DENSE}: {C:,} q x {T - C:,} prefix keys, non-causal | {fmt(dense['prefill_prefix']['ms'], 2)} | |")
            log(f"| dense {parts.DENSE}: {C:,} x {C:,} causal square | {fmt(dense['prefill_square']['ms'], 2)} | |")
            log(f"| **dense total** | **{fmt(dense['prefill_ms'], 2)}** | |")
        if ours_p is not None:
            tot = ours_p["prefill_ms"]
            for i, (s, spec) in enumerate(zip(ours_p["stages"], ours_p["specs"])):
                log(f"| ours stage {i + 1} (b_q={spec['query_block_size']}, l_c={spec['chunk_size']}, "
                    f"k={spec['keep_tokens']}) | {fmt(s['ms'], 2)} | {s['ms'] / tot:.1%} |")
            log(f"| ours BSA (key lists + positions + kernel; {ours_p['keys_per_block_mean']:.0f} keys/block mean) "
                f"| {fmt(ours_p['bsa']['ms'], 2)} | {ours_p['bsa']['ms'] / tot:.1%} |")
            log(f"| &nbsp;&nbsp;of which BSA kernel | {fmt(ours_p['bsa_kernel']['ms'], 2)} | {ours_p['bsa_kernel']['ms'] / tot:.1%} |")
            log(f"| ours sum of parts | {fmt(ours_p['sum_of_parts_ms'], 2)} | |")
            log(f"| **ours total (InfiniteHiPAttention.prefill)** ({ours_p['preset']}) | **{fmt(tot, 2)}** | |")
            if "prefill_ms" in dense:
                log(f"| speedup dense / ours | {fx(ratio(dense['prefill_ms'], tot))} | |")
    if ours_d or "decode_us" in dense:
        presets = list(ours_d)
        log(f"\nDecode: 1 query at position {T - 1:,} over {T:,} keys, us\n")
        log("| component | " + " | ".join(presets or ["-"]) + " |")
        log("| --- |" + " ---: |" * max(1, len(presets)))

        def row(name: str, get) -> None:
            vals = []
            for p in presets or ["-"]:
                try:
                    vals.append(get(ours_d[p]) if presets else get(None))
                except (KeyError, TypeError, IndexError):
                    vals.append("n/a")
            log(f"| {name} | " + " | ".join(vals) + " |")

        if presets:
            row("refresh intervals", lambda r: "/".join(map(str, r["refresh_intervals"])))
        if "decode_us" in dense:
            row(f"dense {parts.DENSE} ({dense['decode_kv_GBps']:.0f} GB/s KV read)", lambda r: fmt(dense["decode_us"]))
        if presets:
            n = len(next(iter(ours_d.values()))["stages"])
            for i in range(n):
                row(f"stage {i + 1} (one refresh)", lambda r, i=i: fmt(r["stages"][i]["ms"] * 1e3))
            row("BSA (decode with all stages cached)", lambda r: fmt(r["bsa_us"]))
            row("**AR total** (every stage refreshed)", lambda r: f"**{fmt(r['ar_us'])}**")
            row("&nbsp;&nbsp;other (AR - stages - BSA)", lambda r: fmt(r["other_ar_us"]))
            row("amortized, formula (sum stage_i/r_i + BSA)", lambda r: fmt(r["amortized_formula_us"]))
            row("**amortized, end-to-end** (mean over steps)", lambda r: f"**{fmt(r['amortized_e2e_us'])}** ({r['e2e_steps']} steps)")
            row("&nbsp;&nbsp;e2e stage refreshes", lambda r: "/".join(map(str, r["e2e_refreshes"])))
            if any("engine_graph_amortized_us" in r for r in ours_d.values()):
                row("**engine decode step, CUDA graph, amortized**", lambda r: f"**{fmt(r.get('engine_graph_amortized_us'))}**")
                row("engine decode step, CUDA graph, AR", lambda r: fmt(r.get("engine_graph_ar_us")))
            if any("stage_kernels" in r for r in ours_d.values()):
                for i in range(n):
                    row(f"GPU-only stage {i + 1} (CUDA graph)", lambda r, i=i: fmt(r["stage_kernels"][i]["ms"] * 1e3))
                row("GPU-only BSA kernel (CUDA graph)", lambda r: fmt(r["bsa_kernel"]["ms"] * 1e3))
                row("GPU-only AR", lambda r: fmt(r.get("gpu_only_ar_us")))
                row("**GPU-only amortized**", lambda r: f"**{fmt(r.get('gpu_only_amortized_us'))}**")
            if "decode_us" in dense:
                d = dense["decode_us"]
                row("speedup vs dense: e2e amortized", lambda r: f"{fx(ratio(d, r['amortized_e2e_us']))}")
                row("speedup vs dense: AR", lambda r: f"{fx(ratio(d, r['ar_us']))}")
                row("**speedup vs dense: engine graph amortized**", lambda r: f"**{fx(ratio(d, r.get('engine_graph_amortized_us')))}**")
                row("speedup vs dense: engine graph AR", lambda r: f"{fx(ratio(d, r.get('engine_graph_ar_us')))}")
                if any("gpu_only_amortized_us" in r for r in ours_d.values()):
                    row("speedup vs dense: GPU-only amortized", lambda r: f"{fx(ratio(d, r.get('gpu_only_amortized_us')))}")


def summarize(results: list[dict], fast: str, targets: tuple[float, float]) -> None:
    log("\n## Summary\n")
    log(f"| T | dense prefill ms | ours prefill ms | speedup | dense decode us | ours decode ({fast} amortized eager) us "
        f"| speedup | ours decode ({fast}, engine CUDA graph, amortized) us | speedup | engine graph AR us | speedup |")
    log("| ---: |" + " ---: |" * 10)
    for r in results:
        d, p, dec = r.get("dense", {}), r.get("ours_prefill"), r.get("ours_decode", {}).get(fast)
        dp, op = d.get("prefill_ms"), p["prefill_ms"] if p else None
        dd = d.get("decode_us")
        oe = dec["amortized_e2e_us"] if dec else None
        og = dec.get("engine_graph_amortized_us") if dec else None
        oar = dec.get("engine_graph_ar_us") if dec else None
        log(f"| {r['T']:,} | {fmt(dp, 2)} | {fmt(op, 2)} | {fx(ratio(dp, op))} | {fmt(dd)} | {fmt(oe)} | "
            f"{fx(ratio(dd, oe))} | {fmt(og)} | {fx(ratio(dd, og))} | {fmt(oar)} | {fx(ratio(dd, oar))} |")
    log(f"\nours prefill = one InfiniteHiPAttention.prefill call; dense prefill = {parts.DENSE} prefix (non-causal) + causal "
        "square, summed. Decode 'amortized e2e' and 'AR' run the method's eager code (Python glue, host syncs, "
        "kernel launches); 'engine CUDA graph' = the same InfiniteHiPAttention.decode captured once per refresh "
        "pattern and replayed (what the engine's GraphDecoder runs), amortized over a refresh cycle.")
    last = results[-1] if results else None
    if last is None:
        return
    d, p, dec = last.get("dense", {}), last.get("ours_prefill"), last.get("ours_decode", {}).get(fast)
    dec_target, pre_target = targets
    log(f"\nTargets at T = {last['T']:,} (paper: 1M):")
    sp = ratio(d.get("prefill_ms"), p["prefill_ms"] if p else None)
    if sp is not None:
        log(f"- prefill speedup >= {pre_target:g}x: {sp:.2f}x -> {'MET' if sp >= pre_target else 'NOT met'}")
    if dec is not None and d.get("decode_us"):
        se = ratio(d["decode_us"], dec["amortized_e2e_us"])
        log(f"- decode speedup >= {dec_target:g}x ({fast}, amortized end-to-end, eager method code): {se:.2f}x -> "
            f"{'MET' if se >= dec_target else 'NOT met'}")
        sg = ratio(d["decode_us"], dec.get("engine_graph_amortized_us"))
        if sg is not None:
            log(f"- decode speedup >= {dec_target:g}x ({fast}, engine decode step replayed from CUDA graphs, amortized): "
                f"{sg:.2f}x -> {'MET' if sg >= dec_target else 'NOT met'}")


# ---- main -------------------------------------------------------------------------------------------------
def add_arguments(parser) -> None:
    parser.add_argument("--contexts", type=parse_int, nargs="+", default=[131072, 262144, 524288, 1048576])
    parser.add_argument("--chunk", type=parse_int, default=32768, help="prefill chunk (queries) at the end of the context")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--impl", default=None, choices=["triton", "reference"], help="default: triton on cuda, reference on cpu")
    parser.add_argument("--presets", nargs="+", default=["default", "3k", "3k-fast"],
                        help="InfiniteHiP presets whose decode is timed (the default first: what users run)")
    parser.add_argument("--prefill-preset", default="default", help="preset whose prefill chunk is timed")
    parser.add_argument("--fast-preset", default="default", help="preset used in the summary / decode target")
    parser.add_argument("--layer-type", choices=["late", "early"], default="late")
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--shuffle-pages", action="store_true", help="random page table instead of the identity")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--min-reps", type=int, default=None)
    parser.add_argument("--max-reps", type=int, default=None)
    parser.add_argument("--budget-s", type=float, default=None, help="time budget per measurement")
    parser.add_argument("--e2e-steps", type=int, default=None, help="decode steps of the e2e loop (default: cycles x max interval)")
    parser.add_argument("--e2e-cycles", type=int, default=None, help="refresh cycles of the e2e loop (default 2 on cuda, 1 on cpu)")
    parser.add_argument("--heads", type=int, default=None, help="query heads (default 32 on cuda, 8 on cpu)")
    parser.add_argument("--kv-heads", type=int, default=None, help="kv heads (default 8 on cuda, 2 on cpu)")
    parser.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph (GPU-only) measurements")
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--decode-target", type=float, default=20.0)
    parser.add_argument("--prefill-target", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=0)



def run(args, out) -> dict:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("CUDA is not available; use --device cpu --contexts 16384 --impl reference --chunk 4096")
    dtype = DTYPES[args.dtype or ("bfloat16" if cuda else "float32")]
    args.impl = args.impl or ("triton" if cuda else "reference")
    warmup = args.warmup if args.warmup is not None else (2 if cuda else -1)  # -1: auto (see Timer)
    min_reps = args.min_reps or (5 if cuda else 1)
    max_reps = args.max_reps or (50 if cuda else 1)
    args.e2e_cycles = args.e2e_cycles or (2 if cuda else 1)
    parts.DENSE = "SDPA-flash" if cuda else "SDPA (cpu)"
    parts.MC = dataclasses.replace(LLAMA3_8B_LAYER, num_heads=args.heads or (32 if cuda else 8),
                             num_kv_heads=args.kv_heads or (8 if cuda else 2))
    budget = args.budget_s if args.budget_s is not None else (1.0 if cuda else 0.5)
    for p in args.presets + [args.prefill_preset]:
        if p not in PRESETS:
            sys.exit(f"unknown preset {p!r}; available: {', '.join(PRESETS)}")
    contexts = sorted(args.contexts)
    if not args.skip_prefill and min(contexts) < args.chunk:
        sys.exit(f"every context must hold the prefill chunk ({args.chunk}); got {min(contexts)}")

    torch.manual_seed(args.seed)
    mc = parts.MC
    timer = Timer(device, warmup, min_reps, max_reps, budget)
    rope = RotaryEmbedding(mc, max(contexts) + 1, device)
    header = {
        "device": torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine()),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__ if cuda else None,
        "dtype": str(dtype).removeprefix("torch."),
        "impl": args.impl,
        "shapes": {"num_heads": mc.num_heads, "num_kv_heads": mc.num_kv_heads, "head_dim": mc.head_dim},
        "args": vars(args),
        "timing": {"warmup": warmup, "min_reps": min_reps, "max_reps": max_reps, "budget_s": budget,
                   "l2_flush": cuda, "stat": "median (e2e decode: mean over steps)"},
    }
    log(f"# Attention latency: InfiniteHiP vs dense (one Llama-3-8B-style layer: {mc.num_heads} q heads, "
        f"{mc.num_kv_heads} kv heads, d={mc.head_dim}, {header['dtype']})\n")
    log(f"device {header['device']}, torch {torch.__version__}, impl {args.impl}, page size {args.page_size} "
        f"({'shuffled' if args.shuffle_pages else 'identity'} page table), {args.layer_type} layer, "
        f"prefill chunk {args.chunk}")
    if not cuda:
        log("CPU mode: functional check only; timings on a shared CPU are meaningless. Dense uses the default SDPA "
            "backend (no flash forcing), no CUDA graphs, 1 rep, and by default 8/2 heads instead of 32/8 "
            "(same GQA group, same code path) so that it runs in about a minute.")

    results, errors = [], []
    body = {"header": header, "results": results, "errors": errors}
    out.meta["device"] = header["device"]

    def dump() -> None:
        out.write(body)

    for T in contexts:
        t0 = time.perf_counter()
        ctx = build_context(T, args, device, dtype, rope)
        gen = torch.Generator(device=device).manual_seed(args.seed + T)
        q_prefill = None if args.skip_prefill else torch.randn(args.chunk, mc.num_heads, mc.head_dim, generator=gen,
                                                                device=device, dtype=dtype)
        q_decode = torch.randn(1, mc.num_heads, mc.head_dim, generator=gen, device=device, dtype=dtype)
        r: dict = {"T": T, "chunk": args.chunk}

        def attempt(what: str, fn: Callable[[], Any]) -> Any:
            """Run one part; a failure is reported and recorded, and the run goes on with the next part."""
            try:
                return fn()
            except Exception as e:  # noqa: BLE001
                errors.append(f"T={T} {what}: {type(e).__name__}: {e}")
                log(f"\n[T={T} {what} FAILED]\n{traceback.format_exc()}")
                with contextlib.suppress(Exception):
                    torch.cuda.synchronize() if cuda else None
                return None

        if not args.skip_dense:
            r["dense"] = attempt("dense", lambda: bench_dense(ctx, q_prefill, q_decode, args, timer, rope, device)) or {}
            ctx.k_dense = ctx.v_dense = None  # free before ours runs
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        r["ours_prefill"] = None if args.skip_prefill else attempt(
            "ours prefill", lambda: bench_ours_prefill(ctx, q_prefill, args, timer, rope))
        r["ours_decode"] = {}
        if not args.skip_decode:
            for preset in args.presets:
                d = attempt(f"ours decode {preset}",
                            lambda: bench_ours_decode(ctx, preset, q_decode, args, timer, rope, device, errors))
                if d is not None:
                    r["ours_decode"][preset] = d
        r["wall_s"] = time.perf_counter() - t0
        results.append(r)
        print_context_tables(T, args.chunk, r.get("dense", {}), r["ours_prefill"], r["ours_decode"])
        log(f"\n(T = {T:,}: {r['wall_s']:.1f} s wall)")
        dump()
        ctx = q_prefill = q_decode = None  # free before the next length
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()

    summarize(results, args.fast_preset, (args.decode_target, args.prefill_target))
    if errors:
        log("\nErrors:\n" + "\n".join(f"- {e}" for e in errors))
    return body

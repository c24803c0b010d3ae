"""Single-layer latency, side by side: our InfiniteHiP vs the authors' hip-attn 1.2.9 (v1_2) vs dense SDPA flash.

Layer, cache, dense baseline and our numbers come from the attention-latency suite (attention_parts.py): Llama-3-8B shapes
(32 q / 8 KV heads, d 128, bf16), one paged layer of T random tokens, keys stored WITHOUT RoPE. Both sparse methods
take unrotated q/k and rotate inside their kernels: ours with the preset's late-layer styles (relative pruning RoPE,
streaming attention RoPE); hip-attn with using_extend=need_apply_rope=True, scan_extend_backend='relative',
sa_extend_backend='streaming' (its sglang setting for non-dense layers). Dense gets keys rotated once, untimed.
hip-attn reads the same K/V memory, viewed as its paged layout with page size 1 (k_cache [T, 1, 8, 128],
block_table = token -> slot) as its sglang backend passes it; its queries are pre-scaled by 1/sqrt(d), untimed.

Prefill: the last --chunk (32K) queries over all T keys, causal. Decode: 1 query at T-1 amortized over the mask
refresh cycle. Ours: attention_latency's eager e2e loop and engine CUDA-graph numbers. hip-attn: the same refresh
intervals through its HiPMaskRefreshState; a refresh from stage i passes the stage caches back as cached_metadata,
other steps the cached mask (as its sglang backend does); timed the same ways (eager loop from a fresh state, mean
per step; per-pattern median, eager and CUDA-graph replay, weighted over one cycle). CUDA events, L2 flush, warm-up,
median. cold_ms = first call (compile/autotune included: fresh TRITON_CACHE_DIR unless --keep-triton-cache; only
the first context compiles). hip-attn is FSL-1.1: called through its public v1_2 API only; nothing copied.

    pip install --no-deps hip_attn-1.2.9-py3-none-any.whl
    python -m bench hip-attn --output hip_cmp.json                  # GPU, 128K..1M, preset default
    python -m bench hip-attn --smoke --hip-path /tmp/hipattn        # CPU check (pip install --target)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback

import torch

from bench.common.timing import Timer, log, try_graph
from bench.suites import attention_parts as parts
from bench.suites.attention_latency import fmt, fx, ratio
from bench.suites.hip_attn_loader import SMOKE_TWEAKS, hip_mapping, import_hip, smoke_interpreter, _cpu_cuda_calls
from infinitehip.attention.methods.infinitehip.config import PRESETS
from infinitehip.cli.options import parse_int


def hip_call_args(api, m: dict, ctx: parts.Context, rope_tables, positions: torch.Tensor, decode: bool,
                  extend: bool = True) -> tuple:
    """(HiPAttentionArgs, the same kwargs with tensors described) for one call over ctx's cache. extend False:
    using_extend off (see bench_hip_decode)."""
    T = ctx.T
    k, v = (x.view(-1, 1, *x.shape[-2:]) for x in (ctx.cache.flat_k(parts.LAYER), ctx.cache.flat_v(parts.LAYER)))
    kw = {key: val for key, val in m.items() if key != "mask_refresh_interval"}
    kw.update(using_extend=extend, need_apply_rope=True, rope_cos=rope_tables[0], rope_sin=rope_tables[1],
              rope_is_neox_style=True, model_context_length=parts.MC.max_position_embeddings, extend_context_length=T,
              k_cache=k, v_cache=v, block_table=ctx.cache.slots(ctx.page_table, 0, T).to(torch.int32)[None],
              cache_seq_lens=torch.tensor([T], dtype=torch.int32, device=k.device), position_ids=positions[None],
              is_decode=decode, disable_flashdecode=not decode, require_cache_statistics=False)
    described = {key: f"tensor{list(val.shape)} {str(val.dtype).removeprefix('torch.')}" if torch.is_tensor(val)
                 else val for key, val in kw.items()}
    kw["stages"] = [api.ScanStage(**s) for s in kw["stages"]]
    return api.Args(**kw), described


# ---- hip-attn measurements ---------------------------------------------------------------------------------------
def bench_hip_prefill(api, m, ctx, q, rope_tables, timer) -> dict:
    T, C = ctx.T, q.shape[0]
    hip_args, described = hip_call_args(api, m, ctx, rope_tables, torch.arange(T - C, T, device=q.device), False)
    qs = (q * q.shape[-1] ** -0.5)[None].contiguous()
    call = lambda: api.attention(q=qs, k=None, v=None, args=hip_args)  # noqa: E731
    kept: list = []
    res = {"cold_ms": timer.once(lambda: kept.append(call()))}
    res.update(timer(call))
    res["prefill_ms"], res["args"] = res["ms"], described
    res.update(output_check(m, *kept.pop()))
    return res


def output_check(m: dict, out: torch.Tensor, meta) -> dict:
    """Sanity of one hip-attn call: finite output, and the tokens its final mask selects per (head, query block),
    sink and window excluded (ks = selected final-stage chunks); cf. ours' keys_per_block_mean."""
    return {"output_finite": bool(torch.isfinite(out).all()),
            "selected_tokens_per_block_mean": float(meta.ks.float().mean()) * m["stages"][-1]["stage_chunk_size"]}


def bench_hip_decode(api, m, ctx, q, rope_tables, timer, args, errors, what, extend: bool = True) -> dict:
    """extend False: hip-attn's decode with using_extend off, the fallback where its extend decode does not compile
    (its decode scan passes a literal True as mask_tdst into load_keys_with_rope, whose extend branch calls
    mask_tdst.to(): a Triton compile error, reproduced on the CPU with a 10-line kernel under triton 3.0, 3.2 and
    3.6 alike, so not a Triton version). Its decode then skips the extend path's RoPE remapping: timings of the
    same scan and sparse attention, positions as trained, said so in the table."""
    T, n = ctx.T, len(m["stages"])
    position = torch.tensor([T - 1], device=q.device)
    hip_args, described = hip_call_args(api, m, ctx, rope_tables, position, True, extend)
    scale = q.shape[-1] ** -0.5
    qs = (q * scale)[None].contiguous()  # [1, 1, H, d]
    call = lambda qq, meta: api.attention(q=qq, k=None, v=None, args=hip_args, cached_metadata=meta)  # noqa: E731

    def meta_for(restart, last):  # restart None: the cached mask; i: recompute from stage i (0: from scratch)
        if restart is None:
            return api.Metadata(indices=last.indices, ks=last.ks, ks_count=last.ks_count, ks_start_end=last.ks_start_end,
                                mask_cache_statistics=None, sa_cache_statistics=None, stage_caches=None)
        if restart <= 0:
            return None
        return api.Metadata(indices=None, ks=None, ks_count=None, ks_start_end=None, mask_cache_statistics=None,
                            sa_cache_statistics=None, stage_caches=list(last.stage_caches[:restart + 1]))

    res: dict = {"refresh_intervals": m["mask_refresh_interval"], "args": described, "using_extend": extend}
    kept: list = []
    res["cold_ms"] = timer.once(lambda: kept.append(call(qs, None)))
    out, full = kept.pop()  # the full mask every timed pattern restarts from
    res.update(output_check(m, out, full))
    name = lambda p: "cached mask (BSA only)" if p is None else f"refresh from stage {p + 1}"  # noqa: E731
    patterns = [None, *range(n - 1, -1, -1)]
    res["patterns"] = {name(p): timer(lambda p=p: call(qs, meta_for(p, full))) for p in patterns}
    cycle = math.lcm(*m["mask_refresh_interval"])
    new_state = lambda: api.RefreshState(api.Config(mask_refresh_interval=list(m["mask_refresh_interval"])))  # noqa: E731
    state = new_state()  # update(): None = cached mask, i = refresh from stage i (-1 = first step: from scratch)
    counts = collections.Counter(max(0, s) if s is not None else None for s in (state.update() for _ in range(cycle)))
    res["cycle_counts"] = {name(p): c for p, c in counts.items()}
    weigh = lambda t: sum(t[name(p)]["ms"] * c for p, c in counts.items()) / cycle * 1e3  # noqa: E731
    res["bsa_us"], res["ar_us"] = res["patterns"][name(None)]["ms"] * 1e3, res["patterns"][name(0)]["ms"] * 1e3
    res["amortized_formula_us"] = weigh(res["patterns"])

    # Eager loop from a fresh refresh state, new random query each step (as attention_latency's e2e for ours).
    steps = args.e2e_steps or args.e2e_cycles * max(m["mask_refresh_interval"])
    gen = torch.Generator(device=q.device).manual_seed(args.seed + 7)
    qs_all = torch.randn(steps, *qs.shape, generator=gen, device=q.device, dtype=q.dtype) * scale
    state, last, step_ms, refreshes = new_state(), None, [], []

    def step(i):
        nonlocal last
        r = state.update()
        r = None if r is None else max(0, r)
        _, meta = call(qs_all[i], meta_for(r, last))
        if r is not None:
            last = meta
            refreshes.append(r + 1)

    for i in range(steps):
        step_ms.append(timer.once(lambda i=i: step(i)))
    res.update(e2e_steps=steps, e2e_refresh_from_stage=refreshes, amortized_e2e_us=statistics.fmean(step_ms) * 1e3,
               e2e_step_us_median=statistics.median(step_ms) * 1e3)
    if q.is_cuda and not args.no_graphs:  # per-pattern CUDA graphs (its sglang backend captures decode too)
        graphs = {name(p): try_graph(timer, lambda p=p: call(qs, meta_for(p, full)), f"{what} graph {name(p)}", errors)
                  for p in patterns}
        res["graph_patterns"] = graphs
        if all(g is not None for g in graphs.values()):
            res["graph_amortized_us"], res["graph_ar_us"] = weigh(graphs), graphs[name(0)]["ms"] * 1e3
    return res


# ---- ours: the cold (first) calls; everything else is attention_latency's -----------------------------------------
def ours_cold(ctx, preset, q_prefill, q_decode, args, timer, rope) -> dict:
    T, C, out = ctx.T, q_prefill.shape[0], {}
    method = parts.InfiniteHiPAttention(parts.MC, parts.method_config(preset, args))
    seq = parts.SequenceSlice(0, 0, C, T - C, T - C, ctx.page_table, ctx.cache, method.new_state(), True)
    batch = parts.ForwardBatch([seq], ctx.cache, rope, C)
    with torch.inference_mode():
        out["prefill_cold_ms"] = timer.once(lambda: method.prefill(parts.LAYER, q_prefill, seq, batch))
        seq = parts.SequenceSlice(0, 0, 1, T - 1, T - 1, ctx.page_table, ctx.cache, method.new_state(), False)
        batch = parts.ForwardBatch([seq], ctx.cache, rope, 1)
        out["decode_cold_ms"] = timer.once(lambda: method.decode(parts.LAYER, q_decode, [seq], batch))
    return out


# ---- report ------------------------------------------------------------------------------------------------------
def ratios(res: dict, p: str) -> dict:
    o, h = res["ours"].get(p) or {}, res["hip"].get(p) or {}
    op, od, hd = (o.get("prefill") or {}).get("prefill_ms"), o.get("decode") or {}, h.get("decode") or {}
    pairs = {"e2e": ("amortized_e2e_us",) * 2, "formula": ("amortized_formula_us",) * 2, "cached": ("bsa_us",) * 2,
             "ar": ("ar_us",) * 2, "graph": ("engine_graph_amortized_us", "graph_amortized_us")}
    return {"prefill": {v: ratio(op, x.get("prefill_ms")) for v, x in (h.get("prefill") or {}).items()},
            **{f"decode_{k}": ratio(od.get(a), hd.get(b)) for k, (a, b) in pairs.items()}}


def no_extend(h: dict) -> str:
    return " (using_extend off)" if h.get("using_extend") is False else ""


def print_tables(results: list[dict], presets: list[str]) -> None:
    f = fmt
    log("\n## Prefill (last chunk over T keys), ms; ours/hip < 1: ours faster\n\n| T | preset | dense | ours | ours cold "
        "| hip strides | hip | hip cold | ours/hip |\n|" + " ---: |" * 9)
    for res in results:
        for p in presets:
            o, rat = res["ours"].get(p) or {}, res["ratios_ours_over_hip"][p]
            for var, h in ((res["hip"].get(p) or {}).get("prefill") or {"-": {}}).items():
                log(f"| {res['T']:,} | {p} | {f(res.get('dense', {}).get('prefill_ms'), 2)} | "
                    f"{f((o.get('prefill') or {}).get('prefill_ms'), 2)} | {f(o.get('prefill_cold_ms'))} | {var} | "
                    f"{'FAILED' if 'error' in h else f(h.get('prefill_ms'), 2)} | {f(h.get('cold_ms'))} | "
                    f"{fx(rat['prefill'].get(var))} |")
    log("\n## Decode (1 query over T keys), us per step amortized over the refresh cycle\n\n| T | preset | dense "
        "| ours e2e | hip e2e | ours/hip | ours graph | hip graph | ours/hip | ours cached / AR | hip cached / AR "
        "| ours cold / hip cold (ms) |\n|" + " ---: |" * 12)
    for res in results:
        for p in presets:
            o, rat = res["ours"].get(p) or {}, res["ratios_ours_over_hip"][p]
            od, h = o.get("decode") or {}, (res["hip"].get(p) or {}).get("decode") or {}
            log(f"| {res['T']:,} | {p} | {f(res.get('dense', {}).get('decode_us'))} | {f(od.get('amortized_e2e_us'))} | "
                f"{'FAILED' if 'error' in h else f(h.get('amortized_e2e_us')) + no_extend(h)} | "
                f"{fx(rat['decode_e2e'])} | "
                f"{f(od.get('engine_graph_amortized_us'))} | {f(h.get('graph_amortized_us'))} | {fx(rat['decode_graph'])} | "
                f"{f(od.get('bsa_us'))} / {f(od.get('ar_us'))} | {f(h.get('bsa_us'))} / {f(h.get('ar_us'))} | "
                f"{f(o.get('decode_cold_ms'))} / {f(h.get('cold_ms'))} |")


def add_arguments(ap) -> None:
    ap.add_argument("--contexts", type=parse_int, nargs="+", default=[131072, 262144, 524288, 1048576])
    ap.add_argument("--chunk", type=parse_int, default=32768, help="prefill queries at the end of the context")
    ap.add_argument("--presets", nargs="+", default=["default"], help="ours; hip-attn runs each one's mapping")
    ap.add_argument("--hip-strides", nargs="+", default=["4,4,1", "1,1,1"],
                    help="hip stage_block_stride_q per stage, one prefill variant each (decode: the first). 4,4,1 = "
                         "its shipped default (scores every 4th query of a block); 1,1,1 = every query, as ours")
    ap.add_argument("--hip-path", default=None, help="dir holding hip_attn/ (pip --target dir); default: installed")
    ap.add_argument("--layer-type", choices=["late", "early"], default="late")
    ap.add_argument("--smoke", action="store_true", help="CPU check: tiny shapes, 1 rep, hip-attn via the interpreter")
    for flag in ("--skip-hip", "--skip-ours", "--skip-dense", "--no-graphs", "--keep-triton-cache"):
        ap.add_argument(flag, action="store_true")
    ap.add_argument("--e2e-steps", type=int, default=None)
    ap.add_argument("--e2e-cycles", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)


def run(args, out) -> dict:
    args.page_size, args.shuffle_pages, args.impl = 64, False, "triton"  # read by attention_parts
    strides = [tuple(int(s) for s in v.split(",")) for v in args.hip_strides]
    cuda = not args.smoke
    if args.smoke:  # CPU: our reference formulations, 4/1 heads; hip-attn's Triton kernels via the interpreter
        args.contexts, args.chunk, args.impl, args.no_graphs = [4096], 128, "reference", True
        args.e2e_steps, strides = args.e2e_steps or 3, strides[:1]
        smoke_interpreter()
    elif not torch.cuda.is_available():
        sys.exit("CUDA is not available; use --smoke for the CPU check")
    if not args.keep_triton_cache:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="hipcmp-triton-")
    device, dtype = torch.device("cuda" if cuda else "cpu"), torch.bfloat16 if cuda else torch.float32
    parts.MC = mc = dataclasses.replace(parts.LLAMA3_8B_LAYER, num_heads=32 if cuda else 4, num_kv_heads=8 if cuda else 1)
    parts.DENSE = "SDPA-flash" if cuda else "SDPA (cpu)"
    timer = Timer(device, 2 if cuda else 0, 5 if cuda else 1, 50 if cuda else 1, 1.0 if cuda else 0.0)
    rope = parts.RotaryEmbedding(mc, max(args.contexts) + 1, device)
    maps = {p: {",".join(map(str, s)): hip_mapping(PRESETS[p], args.layer_type, s) for s in strides} for p in args.presets}
    header = {"device": torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine()),
              "torch": torch.__version__, "triton": __import__("triton").__version__, "python": platform.python_version(),
              "dtype": str(dtype).removeprefix("torch."), "impl": args.impl, "layer_type": args.layer_type,
              "shapes": {"num_heads": mc.num_heads, "num_kv_heads": mc.num_kv_heads, "head_dim": mc.head_dim},
              "args": vars(args), "ours_presets": {p: dataclasses.asdict(PRESETS[p]) for p in args.presets},
              "hip_mapping": maps, "rope": "K/V cache holds keys WITHOUT RoPE; ours and hip-attn (using_extend, "
              "need_apply_rope) rotate q/k inside their kernels; dense gets q/k rotated at true positions, untimed",
              "notes": ["ours `default` decode also attends its question-time chunks (question_keep_tokens); hip-attn "
                        "has no equivalent", "hip-attn queries pre-scaled by 1/sqrt(d) outside the timing"]}
    body = {"header": header, "results": [], "errors": []}
    errors = body["errors"]
    out.meta["device"] = header["device"]
    log(f"# InfiniteHiP (ours) vs hip-attn vs dense: {mc.num_heads}/{mc.num_kv_heads} heads, d={mc.head_dim}, "
        f"{header['dtype']}, {header['device']}, torch {torch.__version__}, triton {header['triton']}")
    api = None
    if not args.skip_hip:
        try:
            api, info = import_hip(args.hip_path)
            header["hip_attn"] = info
            info["shims"] += SMOKE_TWEAKS if args.smoke else []
            log(f"hip-attn {info['version']} from {info['path']}\nstubbed modules: {info['stubbed'] or 'none'}\n"
                f"shims: {info['shims'] or 'none'}\nsignature check passed: {json.dumps(info['signatures'])}")
        except Exception as e:  # noqa: BLE001 - ours and dense still run
            header["hip_attn"] = {"import_error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            log(f"hip-attn import FAILED:\n{traceback.format_exc()}")
    log(f"hip-attn arguments per preset / stride variant: {json.dumps(maps)}")

    def dump():
        out.write(body)

    def attempt(T, what, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - one failed cell (OOM, unsupported) must not end the run
            errors.append(f"T={T} {what}: {type(e).__name__}: {e}")
            log(f"\n[T={T} {what} FAILED]\n{traceback.format_exc()}")
            with contextlib.suppress(Exception):
                torch.cuda.synchronize() if cuda else None
            return {"error": f"{type(e).__name__}: {e}"}
        finally:
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()

    hip_rope = None
    for T in sorted(args.contexts):
        t0 = time.perf_counter()
        ctx = parts.build_context(T, args, device, dtype, rope)
        gen = torch.Generator(device=device).manual_seed(args.seed + T)
        q_prefill = torch.randn(args.chunk, mc.num_heads, mc.head_dim, generator=gen, device=device, dtype=dtype)
        q_decode = torch.randn(1, mc.num_heads, mc.head_dim, generator=gen, device=device, dtype=dtype)
        res: dict = {"T": T, "chunk": args.chunk, "ours": {}, "hip": {}}
        if not args.skip_dense:
            res["dense"] = attempt(T, "dense", lambda: parts.bench_dense(ctx, q_prefill, q_decode, args, timer, rope, device))
        ctx.k_dense = ctx.v_dense = None
        for p in [] if args.skip_ours else args.presets:  # cold calls first: nothing of this preset has run yet
            o = res["ours"][p] = attempt(T, f"ours cold {p}", lambda: ours_cold(ctx, p, q_prefill, q_decode, args, timer, rope))
            args.prefill_preset = p
            o["prefill"] = attempt(T, f"ours prefill {p}", lambda: parts.bench_ours_prefill(ctx, q_prefill, args, timer, rope))
            o["decode"] = attempt(T, f"ours decode {p}",
                                  lambda: parts.bench_ours_decode(ctx, p, q_decode, args, timer, rope, device, errors))
        for p in [] if api is None else args.presets:
            if hip_rope is None:  # hip wants full-width float32 cos/sin rows [positions, d] (neox halves)
                hip_rope = tuple(torch.cat([t, t], dim=-1).contiguous() for t in (rope.cos, rope.sin))
            h = res["hip"][p] = {"prefill": {}}
            with _cpu_cuda_calls(cuda), torch.inference_mode():  # as ours (attention_latency) and its sglang path
                for var, m in maps[p].items():
                    h["prefill"][var] = attempt(T, f"hip prefill {p} strides {var}",
                                                lambda: bench_hip_prefill(api, m, ctx, q_prefill, hip_rope, timer))
                m = next(iter(maps[p].values()))
                h["decode"] = attempt(T, f"hip decode {p}", lambda: bench_hip_decode(
                    api, m, ctx, q_decode, hip_rope, timer, args, errors, f"T={T} hip {p}"))
                if "error" in h["decode"]:  # its extend decode does not compile (bench_hip_decode): without extend
                    h["decode_extend_error"] = h["decode"]["error"]
                    h["decode"] = attempt(T, f"hip decode {p} without extend", lambda: bench_hip_decode(
                        api, m, ctx, q_decode, hip_rope, timer, args, errors, f"T={T} hip {p} no extend", False))
        res["ratios_ours_over_hip"] = {p: ratios(res, p) for p in args.presets}
        res["wall_s"] = time.perf_counter() - t0
        body["results"].append(res)
        log(f"\n(T = {T:,}: {res['wall_s']:.1f} s wall)")
        dump()
        ctx = q_prefill = q_decode = None
    print_tables(body["results"], args.presets)
    if errors:
        log("\nErrors:\n" + "\n".join(f"- {e.splitlines()[0][:300]}" for e in errors))
    return body

"""Single-layer latency, side by side: our InfiniteHiP vs the authors' hip-attn 1.2.9 (v1_2) vs dense SDPA flash.

Layer, cache, dense baseline and our numbers come from bench/attention_latency.py (imported): Llama-3-8B shapes
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
    python bench/hip_attn_compare.py --output hip_cmp.json                  # GPU, 128K..1M, preset default
    python bench/hip_attn_compare.py --smoke --hip-path /tmp/hipattn        # CPU check (pip install --target)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import gc
import importlib
import importlib.util
import inspect
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
import types
from unittest import mock

if "--smoke" in sys.argv:  # Triton's own tl.* helpers are decorated when triton is first imported: interpret from then
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attention_latency as al  # noqa: E402
import torch  # noqa: E402

from infinitehip.attention.triton_interpreter import fix_interpreter  # noqa: E402
from infinitehip.config.infinitehip import PRESETS, InfiniteHiPConfig  # noqa: E402

NEVER_STUB = ("torch", "triton", "numpy", "hip_attn")  # hip-attn's attention path needs these for real
HIP_MODULES = ("attention_extend", "attention_metadata", "hip_config", "mask_refresh_interval")  # in hip_attn.v1_2
log = al.log


# ---- importing hip-attn ------------------------------------------------------------------------------------------
class _NoOp:
    """Every attribute of a stubbed module: a no-op decorator, decorator factory, context manager or base class."""

    def __call__(self, *a, **k):
        return a[0] if len(a) == 1 and callable(a[0]) and not k else self

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    __enter__ = lambda self: self  # noqa: E731
    __exit__ = lambda self, *exc: False  # noqa: E731
    __mro_entries__ = lambda self, bases: ()  # noqa: E731


class StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):  # star-imports and probes see an empty module
            raise AttributeError(name)
        return _NoOp()


def install_stub(name: str) -> None:
    sys.modules[name] = StubModule(name)
    parent, _, leaf = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], leaf, sys.modules[name])


def triton_jit_shim() -> types.ModuleType:
    """Stand-in for hip_attn.v1_2.triton_jit: its JITFunction subclass asserts triton == 3.4.0 and overrides Triton
    3.4 internals (create_binder's return tuple) that changed since; this maps its decorator onto stock triton.jit
    (+ triton.autotune when given configs), which is what it wraps."""
    import triton

    def triton_jit(walk_dependency=None, do_autotune=None, configs=None, key=None, restore_value=None, **jit_kw):
        def decorate(fn):
            kernel = triton.jit(fn, **jit_kw)  # version, repr, launch_metadata, do_not_specialize*, debug, noinline
            if (configs is not None) if do_autotune is None else do_autotune:
                one = triton.knobs.runtime.interpret  # interpreter: no benchmarker, take its first config
                kernel = triton.autotune(configs=configs[:1] if one else configs, key=key,
                                         restore_value=restore_value)(kernel)
            return kernel
        return decorate

    mod = types.ModuleType("hip_attn.v1_2.triton_jit")
    mod.triton_jit = triton_jit
    return mod


def import_hip(path: str | None) -> tuple[types.SimpleNamespace, dict]:
    """Import the hip_attn.v1_2 modules that define its public attention API (hip_attention = hip_attention_12,
    HiPAttentionArgs, HiPAttentionConfig, HiPMaskRefreshState). The package __init__s are not run: they also load
    the v1.0/v1.1 APIs, HF model wrappers and the sglang glue (flash_attn, sgl_kernel, Triton-driver queries at import).
    Each missing module they import unconditionally is stubbed. Returns (api, info for the JSON)."""
    import triton

    if path:
        pkg_dir = path if os.path.basename(os.path.normpath(path)) == "hip_attn" else os.path.join(path, "hip_attn")
    else:
        spec = importlib.util.find_spec("hip_attn")
        if spec is None:
            raise ModuleNotFoundError("hip_attn is not installed (pip install --no-deps <wheel>, or --hip-path)")
        pkg_dir = list(spec.submodule_search_locations)[0]
    root = os.path.dirname(pkg_dir)
    dist = [d for d in os.listdir(root) if d.startswith("hip_attn-") and d.endswith(".dist-info")]
    info: dict = {"path": pkg_dir, "version": dist[0][len("hip_attn-"):-len(".dist-info")] if dist else None,
                  "imported": list(HIP_MODULES), "stubbed": [], "shims": []}
    shim = None
    if triton.__version__ != "3.4.0":
        shim = triton_jit_shim()
        info["shims"].append(f"hip_attn.v1_2.triton_jit -> stock triton.jit/autotune (it asserts triton 3.4.0, "
                             f"found {triton.__version__})")
    patches = contextlib.ExitStack()
    if not torch.cuda.is_available():  # its autotune configs ask for the device name at import time
        patches.enter_context(mock.patch("torch.cuda.get_device_name", lambda *a, **k: "cpu"))
        info["shims"].append("torch.cuda.get_device_name -> 'cpu' during import (no CUDA)")
    with patches:
        for _ in range(64):
            for name in [m for m in sys.modules if m == "hip_attn" or m.startswith("hip_attn.")]:
                del sys.modules[name]
            for name, where in (("hip_attn", pkg_dir), ("hip_attn.v1_2", os.path.join(pkg_dir, "v1_2"))):
                sys.modules[name] = types.ModuleType(name)  # bare package: its __init__ is not run
                sys.modules[name].__path__ = [where]
            if shim is not None:
                sys.modules[shim.__name__] = shim
            try:
                ext, meta, conf, refresh = (importlib.import_module(f"hip_attn.v1_2.{m}") for m in HIP_MODULES)
                break
            except ModuleNotFoundError as e:
                if not e.name or e.name.split(".")[0] in NEVER_STUB or e.name in info["stubbed"]:
                    raise
                install_stub(e.name)
                info["stubbed"].append(e.name)
    if torch.cuda.is_available():  # its SM count comes from numba.cuda (only use of numba.cuda on this path): seed
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count  # its cache
        for name in ("hip_attn.v1_2.attention_extend", "hip_attn.v1_2.scan_stage"):
            if name in sys.modules:
                sys.modules[name]._NUM_STREAMING_MULTIPROCESSOR = sms
        info["shims"].append(f"SM count cache preset to {sms} from torch (instead of numba.cuda)")
    api = types.SimpleNamespace(attention=ext.dual_stage_quadratic_hip_attention, Args=meta.HiPAttentionArgs,
                                ScanStage=meta.ScanStage, Metadata=meta.HiPAttentionOutputMetadata,
                                Config=conf.HiPAttentionConfig, RefreshState=refresh.HiPMaskRefreshState)
    info["signatures"] = check_signatures(api)
    return api, info


ARG_NAMES = ("sink_token_size", "sliding_window_size", "second_stage_k", "stages", "scan_extend_backend",
             "sa_extend_backend", "using_landmark", "landmark_stage_k", "block_sparse_block_size_q", "using_extend",
             "need_apply_rope", "rope_cos", "rope_sin", "rope_is_neox_style", "model_context_length",
             "extend_context_length", "k_cache", "v_cache", "block_table", "cache_seq_lens", "position_ids",
             "is_decode", "disable_flashdecode", "require_cache_statistics")
STAGE_NAMES = ("stage_block_size_q", "stage_block_stride_q", "stage_chunk_size", "stage_k", "stage_stride")
META_NAMES = ("indices", "ks", "ks_count", "ks_start_end", "mask_cache_statistics", "sa_cache_statistics",
              "stage_caches")


def check_signatures(api) -> dict:
    """Every name this script passes must exist in the installed hip-attn (raises otherwise)."""
    fn = getattr(api.attention, "callback", api.attention)  # its functions are wrapped in a `capture` object
    need = {f"{fn.__module__}.{fn.__name__}": (set(inspect.signature(fn).parameters), {"q", "k", "v", "args", "cached_metadata"}),
            "HiPAttentionArgs": ({f.name for f in dataclasses.fields(api.Args)}, set(ARG_NAMES)),
            "ScanStage": ({f.name for f in dataclasses.fields(api.ScanStage)}, set(STAGE_NAMES)),
            "HiPAttentionOutputMetadata": ({f.name for f in dataclasses.fields(api.Metadata)}, set(META_NAMES)),
            "HiPAttentionConfig": ({f.name for f in dataclasses.fields(api.Config)}, {"mask_refresh_interval"}),
            "HiPMaskRefreshState": (set(inspect.signature(api.RefreshState).parameters) | set(dir(api.RefreshState)),
                                    {"hip_config", "update"})}
    missing = {k: sorted(want - have) for k, (have, want) in need.items() if want - have}
    if missing:
        raise TypeError(f"hip-attn API differs from 1.2.9: missing {missing}")
    return {k: sorted(want) for k, (have, want) in need.items()}


# ---- our preset -> hip-attn arguments ----------------------------------------------------------------------------
def hip_mapping(cfg: InfiniteHiPConfig, layer_type: str, strides: tuple[int, ...]) -> dict:
    """hip-attn v1_2 settings closest to one of our presets (plain data). hip's stage i scores stage_k tokens (the
    previous stage's keep; None = the whole context) in chunks of stage_chunk_size; second_stage_k = final keep."""
    if cfg.attention_rope != "streaming":
        raise ValueError(f"no hip-attn equivalent mapped for attention_rope={cfg.attention_rope!r}")
    late = layer_type == "late"
    keep = cfg.keep_tokens if late else (*cfg.keep_tokens[:-1], cfg.early_last_keep_tokens)
    stages = [dict(stage_block_size_q=b, stage_block_stride_q=s, stage_chunk_size=c,
                   stage_k=None if i == 0 else keep[i - 1], stage_stride=1)
              for i, (b, s, c) in enumerate(zip(cfg.query_block_sizes, strides, cfg.chunk_sizes, strict=True))]
    return dict(sink_token_size=cfg.sink_tokens, sliding_window_size=cfg.stream_tokens, stages=stages,
                second_stage_k=keep[-1], scan_extend_backend="relative" if late else "streaming",
                sa_extend_backend="streaming", using_landmark=cfg.representative == "landmark",
                landmark_stage_k=[1] * len(stages), block_sparse_block_size_q=cfg.query_block_sizes[-1],
                mask_refresh_interval=list(cfg.refresh_intervals))


def hip_call_args(api, m: dict, ctx: al.Context, rope_tables, positions: torch.Tensor, decode: bool) -> tuple:
    """(HiPAttentionArgs, the same kwargs with tensors described) for one call over ctx's cache."""
    T = ctx.T
    k, v = (x.view(-1, 1, *x.shape[-2:]) for x in (ctx.cache.flat_k(al.LAYER), ctx.cache.flat_v(al.LAYER)))
    kw = {key: val for key, val in m.items() if key != "mask_refresh_interval"}
    kw.update(using_extend=True, need_apply_rope=True, rope_cos=rope_tables[0], rope_sin=rope_tables[1],
              rope_is_neox_style=True, model_context_length=al.MC.max_position_embeddings, extend_context_length=T,
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


def bench_hip_decode(api, m, ctx, q, rope_tables, timer, args, errors, what) -> dict:
    T, n = ctx.T, len(m["stages"])
    hip_args, described = hip_call_args(api, m, ctx, rope_tables, torch.tensor([T - 1], device=q.device), True)
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

    res: dict = {"refresh_intervals": m["mask_refresh_interval"], "args": described}
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
        graphs = {name(p): al.try_graph(timer, lambda p=p: call(qs, meta_for(p, full)), f"{what} graph {name(p)}", errors)
                  for p in patterns}
        res["graph_patterns"] = graphs
        if all(g is not None for g in graphs.values()):
            res["graph_amortized_us"], res["graph_ar_us"] = weigh(graphs), graphs[name(0)]["ms"] * 1e3
    return res


# ---- ours: the cold (first) calls; everything else is attention_latency's -----------------------------------------
def ours_cold(ctx, preset, q_prefill, q_decode, args, timer, rope) -> dict:
    T, C, out = ctx.T, q_prefill.shape[0], {}
    method = al.InfiniteHiPAttention(al.MC, al.method_config(preset, args))
    seq = al.SequenceSlice(0, 0, C, T - C, T - C, ctx.page_table, ctx.cache, method.new_state(), True)
    batch = al.ForwardBatch([seq], ctx.cache, rope, C)
    with torch.inference_mode():
        out["prefill_cold_ms"] = timer.once(lambda: method.prefill(al.LAYER, q_prefill, seq, batch))
        seq = al.SequenceSlice(0, 0, 1, T - 1, T - 1, ctx.page_table, ctx.cache, method.new_state(), False)
        batch = al.ForwardBatch([seq], ctx.cache, rope, 1)
        out["decode_cold_ms"] = timer.once(lambda: method.decode(al.LAYER, q_decode, [seq], batch))
    return out


# ---- report ------------------------------------------------------------------------------------------------------
def ratios(res: dict, p: str) -> dict:
    o, h = res["ours"].get(p) or {}, res["hip"].get(p) or {}
    op, od, hd = (o.get("prefill") or {}).get("prefill_ms"), o.get("decode") or {}, h.get("decode") or {}
    pairs = {"e2e": ("amortized_e2e_us",) * 2, "formula": ("amortized_formula_us",) * 2, "cached": ("bsa_us",) * 2,
             "ar": ("ar_us",) * 2, "graph": ("engine_graph_amortized_us", "graph_amortized_us")}
    return {"prefill": {v: al.ratio(op, x.get("prefill_ms")) for v, x in (h.get("prefill") or {}).items()},
            **{f"decode_{k}": al.ratio(od.get(a), hd.get(b)) for k, (a, b) in pairs.items()}}


def print_tables(results: list[dict], presets: list[str]) -> None:
    f, fx = al.fmt, al.fx
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
                f"{'FAILED' if 'error' in h else f(h.get('amortized_e2e_us'))} | {fx(rat['decode_e2e'])} | "
                f"{f(od.get('engine_graph_amortized_us'))} | {f(h.get('graph_amortized_us'))} | {fx(rat['decode_graph'])} | "
                f"{f(od.get('bsa_us'))} / {f(od.get('ar_us'))} | {f(h.get('bsa_us'))} / {f(h.get('ar_us'))} | "
                f"{f(o.get('decode_cold_ms'))} / {f(h.get('cold_ms'))} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[131072, 262144, 524288, 1048576])
    ap.add_argument("--chunk", type=int, default=32768, help="prefill queries at the end of the context")
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
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    args.page_size, args.shuffle_pages, args.impl = 64, False, "triton"  # read by attention_latency
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
    al.MC = mc = dataclasses.replace(al.LLAMA3_8B_LAYER, num_heads=32 if cuda else 4, num_kv_heads=8 if cuda else 1)
    al.DENSE = "SDPA-flash" if cuda else "SDPA (cpu)"
    timer = al.Timer(device, 2 if cuda else 0, 5 if cuda else 1, 50 if cuda else 1, 1.0 if cuda else 0.0)
    rope = al.RotaryEmbedding(mc, max(args.contexts) + 1, device)
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
    out = {"header": header, "results": [], "errors": []}
    errors = out["errors"]
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
        if args.output:
            with open(args.output, "w") as fh:
                json.dump(out, fh, indent=1, default=str)

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
        ctx = al.build_context(T, args, device, dtype, rope)
        gen = torch.Generator(device=device).manual_seed(args.seed + T)
        q_prefill = torch.randn(args.chunk, mc.num_heads, mc.head_dim, generator=gen, device=device, dtype=dtype)
        q_decode = torch.randn(1, mc.num_heads, mc.head_dim, generator=gen, device=device, dtype=dtype)
        res: dict = {"T": T, "chunk": args.chunk, "ours": {}, "hip": {}}
        if not args.skip_dense:
            res["dense"] = attempt(T, "dense", lambda: al.bench_dense(ctx, q_prefill, q_decode, args, timer, rope, device))
        ctx.k_dense = ctx.v_dense = None
        for p in [] if args.skip_ours else args.presets:  # cold calls first: nothing of this preset has run yet
            o = res["ours"][p] = attempt(T, f"ours cold {p}", lambda: ours_cold(ctx, p, q_prefill, q_decode, args, timer, rope))
            args.prefill_preset = p
            o["prefill"] = attempt(T, f"ours prefill {p}", lambda: al.bench_ours_prefill(ctx, q_prefill, args, timer, rope))
            o["decode"] = attempt(T, f"ours decode {p}",
                                  lambda: al.bench_ours_decode(ctx, p, q_decode, args, timer, rope, device, errors))
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
        res["ratios_ours_over_hip"] = {p: ratios(res, p) for p in args.presets}
        res["wall_s"] = time.perf_counter() - t0
        out["results"].append(res)
        log(f"\n(T = {T:,}: {res['wall_s']:.1f} s wall)")
        dump()
        ctx = q_prefill = q_decode = None
    print_tables(out["results"], args.presets)
    if errors:
        log("\nErrors:\n" + "\n".join(f"- {e.splitlines()[0][:300]}" for e in errors))
    dump()
    if args.output:
        log(f"\nwrote {args.output}")


SMOKE_TWEAKS = ["Triton interpreter: our numpy>=2.4 scalar / bf16-dot fixes (fix_interpreter)",
                "Triton interpreter: a Python bool passed to an unannotated @jit-helper parameter becomes an int1 "
                "tensor (hip's decode scan passes mask_tdst=True and calls .to() on it)",
                "HIP_DISABLE_FLASHDECODE=1: hip's flash-decode stage-2 kernel calls .to() on a range() loop index, "
                "a Python int under the interpreter; its regular block-sparse kernel runs decode instead"]


def smoke_interpreter() -> None:
    """--smoke only (CPU, TRITON_INTERPRET=1): let hip-attn's kernels run under the Triton 3.6 interpreter."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    fix_interpreter()
    os.environ["HIP_DISABLE_FLASHDECODE"] = "1"
    call = interpreter.InterpretedFunction.__call__

    def call_bools_as_tensors(self, *args, **kwargs):
        params = list(inspect.signature(self.fn).parameters.values())
        byname = {p.name: p for p in params}

        def cvt(p, a):
            if isinstance(a, bool) and p is not None and p.annotation is inspect.Parameter.empty:
                return tl.tensor(interpreter.TensorHandle(np.array([a]), tl.int1), tl.int1)
            return a

        args = tuple(cvt(params[i] if i < len(params) else None, a) for i, a in enumerate(args))
        return call(self, *args, **{k: cvt(byname.get(k), v) for k, v in kwargs.items()})

    interpreter.InterpretedFunction.__call__ = call_bools_as_tensors


@contextlib.contextmanager
def _cpu_cuda_calls(cuda: bool):
    """--smoke only: hip-attn calls torch.cuda device / capture queries that fail without CUDA."""
    if cuda:
        yield
        return
    with mock.patch("torch.cuda.current_device", lambda: 0), mock.patch("torch.cuda.set_device", lambda d: None), \
            mock.patch("torch.cuda.is_current_stream_capturing", lambda: False):
        yield


if __name__ == "__main__":
    main()

"""Single-layer attention latency of any registered method against dense SDPA-flash, in one run.

One attention layer with Llama-3-8B shapes (32 query heads, 8 KV heads, head_dim 128, bf16) over a one-layer
PagedKVCache of T random tokens (keys without RoPE, as the engine stores them; `attention_parts.build_context`):

  prefill   the method's `prefill` of the last --chunk queries at context T (all T keys cached); dense: the chunk
            over the T - chunk prefix (non-causal) plus the causal chunk square, SDPA-flash (`bench_dense`);
  decode    one query at position T - 1: `refresh` = the method's decode from a fresh state (its selection computed),
            `e2e` = the mean of --decode-steps consecutive decode calls on one state (different random queries,
            the same context: refreshes on the method's own schedule included); dense: SDPA-flash over T keys.

The layer is treated as a sparse one: `hip` gets dense_layers=0, `infinitehip` early_layers=0 (a late layer).
Methods as NAME[:PRESET] (`hip`, `hip:paper`, `infinitehip:default`); `dense` is always measured unless
--skip-dense.

    python -m bench method-latency --contexts 131072 1048576 --methods hip infinitehip:default
    python -m bench method-latency --smoke          # CPU, 8/2 heads, 4K context, reference kernels
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

from bench.common.cli import add_smoke_flag
from bench.common.timing import Timer, log
from bench.suites import attention_parts as parts
from bench.suites.attention_parts import DTYPES, LLAMA3_8B_LAYER, bench_dense, build_context
from infinitehip.attention.base import ForwardBatch, SequenceSlice
from infinitehip.attention.registry import create_method
from infinitehip.cli.options import parse_int
from infinitehip.config.methods import method_spec
from infinitehip.model.rope import RotaryEmbedding


def method_config(spec: str, impl: str):
    """NAME[:PRESET] -> (name, label, config) with the one layer made a sparse layer of the method."""
    name, _, preset = spec.partition(":")
    config = method_spec(name).config(preset or None)
    if config is None:
        return name, name, None
    fields = {f.name for f in dataclasses.fields(config)}
    changes = {"impl": impl} if "impl" in fields else {}
    changes.update({f: 0 for f in ("dense_layers", "early_layers") if f in fields})
    return name, f"{name} {preset or 'default'}", dataclasses.replace(config, **changes)


def bench_method(method, ctx, q_prefill, q_decode, args, timer: Timer, rope: RotaryEmbedding) -> dict:
    T, res = ctx.T, {}

    def batch_for(start: int, n: int, prefill: bool, state) -> tuple[SequenceSlice, ForwardBatch]:
        s = SequenceSlice(0, 0, n, start, start, ctx.page_table, ctx.cache, state, prefill)
        return s, ForwardBatch([s], ctx.cache, rope, n)

    with torch.inference_mode():
        if q_prefill is not None:
            C = q_prefill.shape[0]
            res["prefill"] = timer(lambda: method.prefill(0, q_prefill, *batch_for(T - C, C, True, method.new_state())))
            res["prefill_ms"] = res["prefill"]["ms"]

        def fresh_decode():
            seq, batch = batch_for(T - 1, 1, False, method.new_state())
            return method.decode(0, q_decode[:1], [seq], batch)

        res["refresh"] = timer(fresh_decode)
        res["refresh_us"] = res["refresh"]["ms"] * 1e3
        state = method.new_state()
        steps = []
        for i in range(args.decode_steps):
            seq, batch = batch_for(T - 1, 1, False, state)
            steps.append(timer.once(lambda: method.decode(0, q_decode[i : i + 1], [seq], batch)))
        res["e2e_us"] = statistics.fmean(steps) * 1e3
        res["e2e_steps_us"] = [s * 1e3 for s in steps]
    return res


def add_arguments(parser) -> None:
    parser.add_argument("--contexts", type=parse_int, nargs="+", default=[131072, 1048576])
    parser.add_argument("--methods", nargs="+", default=["hip", "infinitehip:default"], help="NAME[:PRESET] each")
    parser.add_argument("--chunk", type=parse_int, default=32768, help="prefill chunk (queries) at the context's end")
    parser.add_argument("--decode-steps", type=int, default=16, help="consecutive decode calls of the e2e mean")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--impl", default=None, choices=["auto", "triton", "reference"],
                        help="the methods' impl (default: auto)")
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--shuffle-pages", action="store_true", help="random page table instead of the identity")
    parser.add_argument("--budget-s", type=float, default=None, help="time budget per measurement")
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    add_smoke_flag(parser, "8/2 heads, a 4K context, a 1K chunk, hip and infinitehip:default")


def run(args, out) -> dict:
    if args.smoke:
        args.device, args.contexts, args.chunk, args.decode_steps = "cpu", [4096], 1024, 3
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = DTYPES[args.dtype or ("bfloat16" if cuda else "float32")]
    impl = args.impl or "auto"
    parts.DENSE = "SDPA-flash" if cuda else "SDPA (cpu)"
    parts.MC = LLAMA3_8B_LAYER if cuda else dataclasses.replace(LLAMA3_8B_LAYER, num_heads=8, num_kv_heads=2)
    mc = parts.MC
    timer = Timer(device, 2 if cuda else 0, 5 if cuda else 1, 50 if cuda else 1,
                  args.budget_s if args.budget_s is not None else (1.0 if cuda else 0.1))
    rope = RotaryEmbedding(mc, max(args.contexts) + 1, device)
    out.meta["device"] = torch.cuda.get_device_name(device) if cuda else "cpu"
    configs = [method_config(spec, impl) for spec in args.methods]
    rows = []
    for T in sorted(args.contexts):
        torch.manual_seed(args.seed)
        ctx = build_context(T, args, device, dtype, rope)
        C = None if args.skip_prefill else min(args.chunk, T)
        q_prefill = None if C is None else torch.randn(C, mc.num_heads, mc.head_dim, dtype=dtype, device=device)
        q_decode = torch.randn(max(1, args.decode_steps), mc.num_heads, mc.head_dim, dtype=dtype, device=device)
        rope.ensure(T + 1)
        if not args.skip_dense:
            dense = bench_dense(ctx, q_prefill, q_decode[:1], args, timer, rope, device)
            rows.append(dict(context=T, method=f"dense {parts.DENSE}", prefill_ms=dense.get("prefill_ms"),
                             decode_us=dense["decode_us"]))
        for name, label, config in configs:
            method = create_method(name, mc, config)
            r = bench_method(method, ctx, q_prefill, q_decode, args, timer, rope)
            rows.append(dict(context=T, method=label, prefill_ms=r.get("prefill_ms"), refresh_us=r["refresh_us"],
                             e2e_us=r["e2e_us"], e2e_steps_us=r["e2e_steps_us"]))
        del ctx
        if cuda:
            torch.cuda.empty_cache()
        out.write({"rows": rows})
    log("| context | method | prefill ms | decode us (refresh) | decode us (e2e mean) |\n| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        fmt = lambda x, d: "-" if x is None else f"{x:,.{d}f}"
        log(f"| {r['context']:,} | {r['method']} | {fmt(r['prefill_ms'], 2)} | "
            f"{fmt(r.get('refresh_us', r.get('decode_us')), 1)} | {fmt(r.get('e2e_us', r.get('decode_us')), 1)} |")
    return {"rows": rows}

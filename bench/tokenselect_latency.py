"""Single-layer decode latency: TokenSelect vs dense FlashAttention, with the Selection Cache off and on.

One attention layer with Llama-3-8B shapes (32 query heads, 8 KV heads, head_dim 128, bf16) over a one-layer
PagedKVCache holding T random tokens (keys without RoPE, as the engine stores them), for each T in --contexts.
One query at position T - 1 (batch 1). TokenSelect uses the paper's budget (k = 2048 selected, 128 sink,
512 local: --select-tokens / --sink-tokens / --local-tokens).

  dense          torch SDPA, FLASH_ATTENTION backend forced on CUDA, 1 query x T keys already rotated.
  select         `TokenSelectAttention.select` alone: query rotation, paged dot-product + soft-vote kernels,
                 top-k over T - 640 candidates, sort (what a Selection Cache miss adds).
  hit step       `decode` when the Selection Cache hits (the same query again): key list + sparse attention.
  cache off      `decode` with selection_cache=False: every step selects (= select + attention).
  cache on       `decode` with selection_cache=True over --steps consecutive queries from a fresh state, mean
                 per step; the hit ratio is the method's own count (`stats(state)`).

Query stream for "cache on": real consecutive decode queries are not available in a single-layer benchmark, so
the pre-RoPE query follows an AR(1) process per element, q_t = rho q_{t-1} + sqrt(1 - rho^2) eps_t (eps
standard normal, rho = --query-correlation). Then cos(q_t, q_{t+j}) ~ rho^j, so with threshold theta a selection
is reused for about log(theta) / log(rho) steps (rho = 0.98, theta = 0.9: ~5 hits per miss). The paper's Fig. 3a
measures consecutive-query cosines mostly above 0.9 on real tasks; the printed mean cosine shows what the
synthetic stream gave.

Chunk prefill step (the paper's Fig. 6 measurement, where its 23.84x comes from: one prefill chunk of
--chunk-tokens queries, 512 as in the paper, at the end of a T-token cache):
  dense chunk    torch SDPA flash, the chunk's queries x all T keys (non-causal: PyTorch's is_causal aligns
                 a short query block top-left; the within-chunk triangle is 512 of T keys, < 0.4% at 128K).
  tokenselect    `prefill` of the chunk: one selection with the chunk's mean query (paged dot product over the
                 T - 640 candidates, soft vote, top-k) + block-sparse attention over sink + selected + local.
  Each is timed alone (host overhead exposed) and --chain times back to back (the layers of one forward pass:
  the host prepares the next step while the GPU runs this one), per step.

Timing: CUDA events after an L2 flush, warm-up calls first, median of reps (mean over the stream for "cache on");
eager host overhead included. CPU: time.perf_counter.

    python bench/tokenselect_latency.py                      # GPU: 128K, 256K, 512K, 1M
    python bench/tokenselect_latency.py --smoke              # CPU check: tiny contexts, a few reps
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_latency import LLAMA3_8B_LAYER, Timer, backend_ctx, sdpa  # noqa: E402

from infinitehip.attention.base import ForwardBatch, SequenceSlice  # noqa: E402
from infinitehip.attention.tokenselect.method import TokenSelectAttention  # noqa: E402
from infinitehip.config.tokenselect import TokenSelectConfig  # noqa: E402
from infinitehip.kv.paged_cache import PagedKVCache  # noqa: E402
from infinitehip.model.rope import RotaryEmbedding  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def log(msg: str = "") -> None:
    print(msg, flush=True)


def build_cache(T: int, page_size: int, dtype, device, seed: int) -> tuple[PagedKVCache, torch.Tensor]:
    mc = LLAMA3_8B_LAYER
    pages = -(-T // page_size)
    cache = PagedKVCache(1, pages, page_size, mc.num_kv_heads, mc.head_dim, dtype, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    page_table = torch.randperm(pages, generator=torch.Generator().manual_seed(seed + 1)).to(device, torch.int32)
    return cache, page_table


def dense_kv(cache: PagedKVCache, page_table: torch.Tensor, T: int, rope: RotaryEmbedding) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous [T, Hkv, d] keys rotated at their positions and values: dense attention's input."""
    k = torch.empty(T, *cache.k.shape[-2:], dtype=cache.k.dtype, device=cache.device)
    v = torch.empty_like(k)
    rope.ensure(T)
    for s in range(0, T, 1 << 16):
        e = min(T, s + (1 << 16))
        slots = cache.slots(page_table, s, e)
        k[s:e] = rope.apply_range(cache.flat_k(0)[slots], s)
        v[s:e] = cache.flat_v(0)[slots]
    return k, v


def query_stream(n: int, rho: float, device, dtype, seed: int) -> torch.Tensor:
    """[n, 1, H, d] AR(1) queries: consecutive cosine ~ rho."""
    mc = LLAMA3_8B_LAYER
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(1, mc.num_heads, mc.head_dim, generator=gen, device=device)
    out = []
    for _ in range(n):
        out.append(q.clone())
        q = rho * q + math.sqrt(1 - rho * rho) * torch.randn(q.shape, generator=gen, device=device)
    return torch.stack(out).to(dtype)


def bench_context(T: int, args, timer: Timer, device, dtype) -> dict:
    mc = LLAMA3_8B_LAYER
    cache, page_table = build_cache(T, args.page_size, dtype, device, args.seed)
    rope = RotaryEmbedding(mc, 1 << 14, device)
    base = TokenSelectConfig(select_tokens=args.select_tokens, sink_tokens=args.sink_tokens, local_tokens=args.local_tokens,
                             vote_pool_size=args.vote_pool_size,
                             selection_cache_threshold=args.threshold, impl=args.impl)
    res: dict = {"T": T}

    def fresh(cache_on: bool):
        method = TokenSelectAttention(mc, dataclasses.replace(base, selection_cache=cache_on))
        state = method.new_state()
        seq = SequenceSlice(0, 0, 1, T - 1, T - 1, page_table, cache, state, False)
        return method, state, seq, ForwardBatch([seq], cache, rope, 1)

    q = query_stream(1, args.query_correlation, device, dtype, args.seed + 2)[0]
    C = args.chunk_tokens
    q_chunk = torch.randn(C, mc.num_heads, mc.head_dim, generator=torch.Generator(device=device).manual_seed(args.seed + 4),
                          device=device).to(dtype)
    with torch.inference_mode():
        method = TokenSelectAttention(mc, dataclasses.replace(base, query_block_size=C))
        chunk_seq = SequenceSlice(0, 0, C, T - C, T - C, page_table, cache, method.new_state(), True)
        chunk_step = lambda: method.prefill(0, q_chunk, chunk_seq, ForwardBatch([chunk_seq], cache, rope, C))  # noqa: E731
        res["chunk_tokenselect"] = timer(chunk_step)["ms"] * 1e3
        # back to back, as the layers of one forward pass run: the host prepares step i + 1 while the GPU runs i
        res["chunk_tokenselect_chain"] = timer(lambda: [chunk_step() for _ in range(args.chain)])["ms"] * 1e3 / args.chain
        if args.profile and device.type == "cuda":
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    chunk_step()
                torch.cuda.synchronize()
            log(f"chunk prefill step at {T:,}, 5 calls:\n" +
                prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=50))
        if not args.skip_dense:
            kd, vd = dense_kv(cache, page_table, T, rope)
            qd = rope.apply_range(q, T - 1)
            qc = rope.apply_range(q_chunk, T - C)
            with backend_ctx(device):
                res["dense"] = timer(lambda: sdpa(qd, kd, vd, causal=False))["ms"] * 1e3
                res["chunk_dense"] = timer(lambda: sdpa(qc, kd, vd, causal=False))["ms"] * 1e3
                res["chunk_dense_chain"] = timer(lambda: [sdpa(qc, kd, vd, causal=False) for _ in range(args.chain)])["ms"] * 1e3 / args.chain
            del kd, vd

        method, state, seq, batch = fresh(False)
        limit = [method.window_start(T - 1)]
        res["select"] = timer(lambda: method.select(q, cache.flat_k(0), page_table[None], cache.page_size, limit, rope))["ms"] * 1e3
        res["cache_off"] = timer(lambda: method.decode(0, q, [seq], batch))["ms"] * 1e3

        method, state, seq, batch = fresh(True)
        method.decode(0, q, [seq], batch)  # selects once; the same query then always hits
        res["hit_step"] = timer(lambda: method.decode(0, q, [seq], batch))["ms"] * 1e3

        method, state, seq, batch = fresh(True)
        qs = query_stream(args.steps, args.query_correlation, device, dtype, args.seed + 3)
        method.decode(0, qs[0], [seq], batch)  # compile / warm up outside the measurement, then reset the counts
        method, state, seq, batch = fresh(True)
        step_ms = [timer.once(lambda i=i: method.decode(0, qs[i], [seq], batch)) for i in range(args.steps)]
        res["cache_on"] = statistics.fmean(step_ms) * 1e3
        res["hit_ratio"] = method.stats(state)["hit_ratio"]
        flat = qs.flatten(1).float()
        res["consecutive_cos"] = torch.nn.functional.cosine_similarity(flat[1:], flat[:-1], dim=-1).mean().item()
    return res  # the cache is freed with this frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=None, help="default: 128K 256K 512K 1M (smoke: 4K 8K)")
    parser.add_argument("--smoke", action="store_true", help="CPU check: small contexts, few reps and steps")
    parser.add_argument("--device", default=None, help="default: cuda (smoke: cpu)")
    parser.add_argument("--dtype", default=None, choices=list(DTYPES), help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--impl", default="auto", choices=["auto", "triton", "reference"])
    parser.add_argument("--select-tokens", type=int, default=2048)
    parser.add_argument("--sink-tokens", type=int, default=128)
    parser.add_argument("--local-tokens", type=int, default=512)
    parser.add_argument("--vote-pool-size", type=int, default=TokenSelectConfig.vote_pool_size)
    parser.add_argument("--threshold", type=float, default=0.9, help="Selection Cache cosine threshold")
    parser.add_argument("--query-correlation", type=float, default=0.98, help="rho of the AR(1) query stream")
    parser.add_argument("--steps", type=int, default=None, help="decode steps of the cache-on stream (default 200; smoke 12)")
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--profile", action="store_true", help="kernel table of the chunk prefill step per context")
    parser.add_argument("--chain", type=int, default=8, help="chunk steps timed back to back (layers of a forward)")
    parser.add_argument("--chunk-tokens", type=int, default=512, help="queries of the chunk prefill step (paper: 512)")
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    device = torch.device(args.device or ("cpu" if args.smoke else "cuda"))
    dtype = DTYPES[args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    args.contexts = args.contexts or ([4096, 8192] if args.smoke else [131072, 262144, 524288, 1048576])
    args.steps = args.steps or (12 if args.smoke else 200)
    if args.smoke:
        timer = Timer(device, warmup=1, min_reps=2, max_reps=3, budget_s=0.5, flush_mb=0)
    else:
        timer = Timer(device, warmup=3, min_reps=10, max_reps=50, budget_s=2.0)

    mc = LLAMA3_8B_LAYER
    log(f"# TokenSelect decode latency, one layer: {mc.num_heads} heads / {mc.num_kv_heads} KV heads, d {mc.head_dim}, "
        f"{dtype}, {device}; k={args.select_tokens} sink={args.sink_tokens} local={args.local_tokens} "
        f"theta={args.threshold}; query stream rho={args.query_correlation}, {args.steps} steps\n")
    log("| context | dense us | select us | hit step us | cache off us | cache on us | hit ratio | mean cos | "
        "dense / off | dense / on |")
    log("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    chunk_rows = []
    for T in args.contexts:
        r = bench_context(T, args, timer, device, dtype)
        chunk_rows.append(r)
        d = r.get("dense")
        f = lambda x: "n/a" if x is None else f"{x:,.0f}"
        x = lambda a, b: "n/a" if a is None else f"{a / b:.2f}x"
        log(f"| {T:,} | {f(d)} | {f(r['select'])} | {f(r['hit_step'])} | {f(r['cache_off'])} | {f(r['cache_on'])} | "
            f"{r['hit_ratio']:.2f} | {r['consecutive_cos']:.3f} | {x(d, r['cache_off'])} | {x(d, r['cache_on'])} |")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    log(f"\n# Chunk prefill step: {args.chunk_tokens} queries at the end of the context (paper Fig. 6)\n")
    log(f"| context | dense chunk us | tokenselect chunk us | dense / tokenselect | {args.chain} back to back: dense us "
        f"| tokenselect us | dense / tokenselect |")
    log("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in chunk_rows:
        d, ts = r.get("chunk_dense"), r["chunk_tokenselect"]
        dc, tc = r.get("chunk_dense_chain"), r["chunk_tokenselect_chain"]
        f = lambda x: "n/a" if x is None else f"{x:,.0f}"  # noqa: E731
        x = lambda a, b: "n/a" if a is None else f"{a / b:.2f}x"  # noqa: E731
        log(f"| {r['T']:,} | {f(d)} | {f(ts)} | {x(d, ts)} | {f(dc)} | {f(tc)} | {x(dc, tc)} |")

if __name__ == "__main__":
    main()

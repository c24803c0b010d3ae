"""Resolve latency of the offloaded KV banks for a realistic decode step (paper Sec. 3.3), per layer.

One layer's host store (pinned, `--slots` tokens, Llama-3-8B rows: 8 KV heads x 128, bf16 or fp8) and an
attention bank of `--bank` tokens (keys and values). Each decode step requests `--requested` slots (3.3K:
InfiniteHiP 3k's sink + kept + stream keys): a share `--hit-ratio` of them is drawn from the previous
step's slots (resident), the rest are fresh random slots of the whole store (misses: rows read from
pinned host memory over PCIe). The trace is generated up front on the GPU; the bank is warmed with
`--warmup` steps before timing.

Timed per resolve call (median over --steps steps, CUDA events):
  eager      `resolve(..., impl="triton")` launched from Python;
  graph      the same call captured once in a CUDA graph and replayed (the request list is copied into the
             graph's static input first, included in the time): what the sync-free decode path pays;
  reference  the eager oracle (boolean masks + a host gather: syncs), for comparison.
Also printed: the measured hit ratio, missed rows and bytes per call, the PCIe bandwidth that implies,
and the per-token estimate for a model (`--layers` layers x 2 banks, graph mode). After timing, the rows
read through the returned indices are checked against the host store.

    python -m bench offload-resolve                      # CUDA: 1M slots, 64K bank, 3.3K requested
    python -m bench offload-resolve --kv-dtype fp8_e4m3 --output resolve.json
    python -m bench offload-resolve --smoke              # CPU, Triton interpreter, tiny sizes

Exit status 1 when the rows read back differ from the host store (or, with --smoke, when the Triton and
reference paths leave different banks).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from infinitehip.cli.options import parse_int
from infinitehip.config.offload import OffloadConfig
from infinitehip.kv.offload import OffloadedKV
from infinitehip.kv.offload.resolve import resolve

ARGS = None  # the parsed flags of the run (set by run())


def add_arguments(p) -> None:
    p.add_argument("--slots", type=parse_int, default=1 << 20, help="store tokens (context)")
    p.add_argument("--bank", type=parse_int, default=1 << 16, help="attention bank tokens")
    p.add_argument("--requested", type=int, default=3300, help="slots requested per resolve call")
    p.add_argument("--hit-ratio", type=float, default=0.9)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--kv-dtype", default="bfloat16", choices=["bfloat16", "float16", "fp8_e4m3", "fp8_e5m2"])
    p.add_argument("--layers", type=int, default=32, help="model layers for the per-token estimate (one is stored)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny sizes")


def make_trace(steps: int, slots: int, requested: int, hit_ratio: float, device, seed: int = 0) -> torch.Tensor:
    """[steps, requested] int64: each step keeps `hit_ratio` of the previous step's slots, the rest fresh."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    keep = int(round(requested * hit_ratio))
    current = torch.randperm(slots, generator=g)[:requested]
    rows = []
    for _ in range(steps):
        kept = current[torch.randperm(requested, generator=g)[:keep]]
        fresh = torch.randint(0, slots, (requested - keep,), generator=g)
        current = torch.cat([kept, fresh])
        rows.append(current)
    return torch.stack(rows).to(device)


def fill_random(t: torch.Tensor, chunk: int = 1 << 16) -> None:
    for start in range(0, t.shape[0], chunk):
        block = torch.randn(t[start : start + chunk].shape)
        t[start : start + chunk].copy_(block.clamp(-400, 400).to(t.dtype))


def timed(fn, steps: int, device) -> list[float]:
    """Per-call microseconds of fn(step) for each step."""
    out = []
    for i in range(steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn(i)
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn(i)
            out.append((time.perf_counter() - t0) * 1e6)
    return out


def build(device, impl):
    cfg = OffloadConfig(offload_enabled=True, mask_bank_tokens=1, attention_bank_tokens=ARGS.bank, kv_dtype=ARGS.kv_dtype, offload_impl=impl)
    kv = OffloadedKV(cfg, 1, ARGS.slots, ARGS.kv_heads, ARGS.head_dim, torch.bfloat16, device)
    return kv


def run(args, out) -> dict:
    global ARGS
    ARGS = args
    if args.smoke:
        args.slots, args.bank, args.requested, args.kv_heads, args.head_dim = 4096, 512, 64, 2, 16
        args.steps, args.warmup = 6, 4
        out.meta["device"] = "cpu"
    device = torch.device("cpu" if ARGS.smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA is not available; use --smoke for the CPU check")
    torch.manual_seed(0)
    kv = build(device, "triton")
    fill_random(kv.store.k[0])
    fill_random(kv.store.v[0])
    total = ARGS.warmup + 2 * ARGS.steps
    trace = make_trace(total, ARGS.slots, ARGS.requested, ARGS.hit_ratio, device)
    bank, store = kv.attention_bank, kv.store
    row_bytes = 2 * ARGS.kv_heads * ARGS.head_dim * store.k[0].element_size()
    results = {"device": out.meta["device"]}

    for i in range(ARGS.warmup):
        resolve(bank, store, 0, trace[i], impl="triton")
    kv.reset_stats()
    eager = timed(lambda i: resolve(bank, store, 0, trace[ARGS.warmup + i], impl="triton"), ARGS.steps, device)
    stats = bank.stats()
    results["eager_us"] = statistics.median(eager)
    results["hit_ratio"] = stats.hit_ratio
    results["misses_per_call"] = stats.total_misses / ARGS.steps

    graph_steps = trace[ARGS.warmup + ARGS.steps :]
    if device.type == "cuda":
        static_in = graph_steps[0].clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm up allocator / kernels on the side stream before capture
                resolve(bank, store, 0, static_in, impl="triton")
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = resolve(bank, store, 0, static_in, impl="triton")
        kv.reset_stats()

        def replay(i):
            static_in.copy_(graph_steps[i])
            graph.replay()

        graph_us = timed(replay, ARGS.steps, device)
        results["graph_us"] = statistics.median(graph_us)
        torch.cuda.synchronize()
        idx = static_out.long().cpu()
        want = graph_steps[-1].cpu()
        gstats = bank.stats()
        results["graph_hit_ratio"] = gstats.hit_ratio
    else:
        out = None
        for i in range(ARGS.steps):
            out = resolve(bank, store, 0, graph_steps[i], impl="triton")
        idx, want = out.long(), graph_steps[ARGS.steps - 1]
    ok_k = torch.equal(bank.k[0][idx.to(device)].cpu().view(torch.uint8), store.k[0][want].view(torch.uint8))
    ok_v = torch.equal(bank.v[0][idx.to(device)].cpu().view(torch.uint8), store.v[0][want].view(torch.uint8))
    results["rows_match_host_store"] = bool(ok_k and ok_v)

    ref = build(device, "reference")
    ref.store.k[0].copy_(store.k[0])
    ref.store.v[0].copy_(store.v[0])
    for i in range(ARGS.warmup):
        resolve(ref.attention_bank, ref.store, 0, trace[i], impl="reference")
    ref_us = timed(lambda i: resolve(ref.attention_bank, ref.store, 0, trace[ARGS.warmup + i], impl="reference"),
                   ARGS.steps, device)
    results["reference_us"] = statistics.median(ref_us)
    if ARGS.smoke:  # the two copy paths must leave identical banks after the same trace
        fresh = build(device, "triton")
        fresh.store.k[0].copy_(store.k[0])
        fresh.store.v[0].copy_(store.v[0])
        for i in range(ARGS.warmup + ARGS.steps):
            resolve(fresh.attention_bank, fresh.store, 0, trace[i], impl="triton")
        a, b, B, S = fresh.attention_bank, ref.attention_bank, ARGS.bank, ARGS.slots
        results["triton_equals_reference"] = all(  # entry B / S of the maps is trash (masked-off writes)
            torch.equal(getattr(a, n)[:, :size], getattr(b, n)[:, :size])
            for n, size in (("k", B), ("v", B), ("table", S), ("owner", B), ("last_used", B), ("order", B))
        ) and all(torch.equal(getattr(a, n), getattr(b, n)) for n in ("hits", "misses", "clock"))

    per_call = results.get("graph_us", results["eager_us"])
    miss_bytes = results["misses_per_call"] * row_bytes
    results["miss_mb_per_call"] = miss_bytes / 1e6
    results["pcie_gb_s_implied"] = miss_bytes / (per_call * 1e-6) / 1e9 if per_call else 0.0
    results["per_token_ms_estimate"] = per_call * 2 * ARGS.layers / 1e3

    print(f"offload resolve on {results['device']}: {ARGS.slots:,} slots, bank {ARGS.bank:,} tokens, "
          f"{ARGS.requested:,} requested/call, rows {ARGS.kv_heads}x{ARGS.head_dim} {ARGS.kv_dtype}")
    print(f"{'mode':<12}{'us/call':>10}")
    for name in ("eager", "graph", "reference"):
        if f"{name}_us" in results:
            print(f"{name:<12}{results[f'{name}_us']:>10.1f}")
    print(f"hit ratio {results['hit_ratio']:.3f} (target {ARGS.hit_ratio}), {results['misses_per_call']:.0f} missed rows/call "
          f"= {results['miss_mb_per_call']:.2f} MB/call -> {results['pcie_gb_s_implied']:.1f} GB/s implied")
    print(f"per token, {ARGS.layers} layers x 2 banks: {results['per_token_ms_estimate']:.2f} ms; "
          f"rows match host store: {results['rows_match_host_store']}"
          + (f"; triton == reference: {results['triton_equals_reference']}" if "triton_equals_reference" in results else ""))
    results["ok"] = bool(results["rows_match_host_store"] and results.get("triton_equals_reference", True))
    return results

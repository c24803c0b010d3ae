"""GPU decode throughput of a Llama-3.1-8B-shaped model with RANDOM bf16 weights, against the bandwidth bound.

The bound: every decode step reads all weights once, so tokens/s <= HBM bandwidth / weight bytes.
Bandwidth is measured in the same run (device-to-device copy, bytes read + written).

    python -m bench decode --contexts 4096 --steps 64
    python -m bench decode --contexts 131072 262144 --methods dense infinitehip:3k-fast infinitehip:3k-flash --no-graphs
    python -m bench decode --smoke                       # CPU, tiny random model, no bandwidth bound

Decode steps of infinitehip replay CUDA graphs of the whole model (engine/graph_decode.py) unless --no-graphs adds
the eager rows; dense's and hip's decode replay graphs too. The mean over the timed steps includes the mask refreshes.
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.common import models
from bench.common.cli import add_smoke_flag
from bench.common.meta import record_engine
from bench.common.timing import sync
from infinitehip import EngineConfig, SamplingParams
from infinitehip.cli.options import parse_int
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.model.loading import LoadedModel


def hbm_bandwidth(gib: int = 4) -> float:
    """Bytes/s moved by a device copy (read + write counted)."""
    src = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 10
    del src, dst
    torch.cuda.empty_cache()
    return 2 * (gib << 30) / seconds


def run_method(loaded: LoadedModel, method: str, preset: str | None, context: int, steps: int, warmup_steps: int,
               cuda_graphs: bool, chunk: int, device: torch.device) -> dict:
    """Prefill `context` random tokens, decode warmup_steps (graph captures happen there), then time `steps`."""
    config = None
    if method == "infinitehip":
        from infinitehip.attention.methods.infinitehip.config import infinitehip_preset

        config = models.TINY_METHOD if device.type == "cpu" else infinitehip_preset(preset)
    elif method in ("cascade", "infinipot", "tokenselect"):  # a named preset (or the method's default)
        from infinitehip.config.methods import method_spec

        config = method_spec(method).config(None if preset == "3k" else preset)
    cpu = device.type == "cpu"
    engine = LLMEngine(
        EngineConfig(method=method, device=device.type, dtype="float32" if cpu else "bfloat16",
                     max_context_tokens=context + steps + warmup_steps + 8, prefill_chunk_size=chunk,
                     show_progress=False, cuda_graphs=cuda_graphs and not cpu, method_config=config),
        loaded,
    )
    record_engine(engine)
    ids = models.random_ids(loaded.config.vocab_size, context, seed=0)
    seq = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=steps + warmup_steps + 1, ignore_eos=True))
    sync(device)
    t0 = time.perf_counter()
    while seq.in_prefill or not seq.output_ids:
        engine.step()  # prefill chunks; the last one samples the first token
    sync(device)
    prefill_s = time.perf_counter() - t0
    step_s = []
    while not seq.is_finished:
        t = time.perf_counter()
        engine.step()  # sampling reads the token back: the step is complete when it returns
        step_s.append(time.perf_counter() - t)
    timed = step_s[warmup_steps:]
    graphs = engine.runner.graph_decoder
    out = dict(method=f"{method} {preset}" if config is not None and preset != "3k" else method, context=context,
               cuda_graphs=graphs is not None, prefill_s=prefill_s, step_ms_mean=statistics.fmean(timed) * 1e3,
               step_ms_median=statistics.median(timed) * 1e3, steps=len(timed),
               captures=graphs.captures if graphs else 0, replays=graphs.replays if graphs else 0,
               kv_gb=engine.cache.bytes_per_token * context / 1e9,
               peak_gb=torch.cuda.max_memory_allocated() / 1e9 if not cpu else 0.0)
    del engine, seq
    if not cpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return out


def add_arguments(parser) -> None:
    parser.add_argument("--contexts", type=parse_int, nargs="+", default=[4096])
    parser.add_argument("--steps", type=int, default=64, help="timed decode steps (mean over them: refresh steps included)")
    parser.add_argument("--warmup-steps", type=int, default=40, help="decode steps before timing (graph captures)")
    parser.add_argument("--methods", nargs="+", default=["dense"],
                        help="dense, infinitehip:PRESET (e.g. infinitehip:3k-fast), hip, cascade[:PRESET], streaming")
    parser.add_argument("--no-graphs", action="store_true", help="also run every infinitehip method without CUDA graphs")
    parser.add_argument("--chunk", type=parse_int, default=32768, help="prefill chunk")
    add_smoke_flag(parser, "tiny random model, 300 tokens, dense and infinitehip")


def run(args, out) -> dict:
    if args.smoke:
        device = torch.device("cpu")
        args.contexts, args.steps, args.warmup_steps, args.chunk = [300], 4, 2, 128
        args.methods = ["dense", "infinitehip:tiny"]
        out.meta["device"] = "cpu"
        loaded = models.load("tiny", device, torch.float32)
        bandwidth = None
    else:
        device = torch.device("cuda")
        bandwidth = hbm_bandwidth()
        loaded = models.load("random8b", device, torch.bfloat16)
    weight_bytes = models.weights_gb(loaded) * 1e9
    bound = weight_bytes / bandwidth if bandwidth else None
    rows = []
    for context in args.contexts:
        for spec in args.methods:
            method, _, preset = spec.partition(":")
            variants = [True, False] if (method == "infinitehip" and args.no_graphs) else [True]
            for graphs in variants:
                try:
                    r = run_method(loaded, method, preset or "3k", context, args.steps, args.warmup_steps, graphs,
                                   args.chunk, device)
                except torch.OutOfMemoryError as e:
                    print(f"{spec} at {context}: out of GPU memory ({str(e).splitlines()[0][:120]})", flush=True)
                    torch.cuda.empty_cache()
                    continue
                rows.append(r)
                print(r, flush=True)

    print(f"\ndevice: {out.meta['device']}, torch {torch.__version__}")
    print(f"model: {loaded.source} ({weight_bytes / 1e9:.2f} GB); KV resident in GPU memory")
    if bound:
        print(f"measured HBM bandwidth: {bandwidth / 1e12:.2f} TB/s; weight-bandwidth bound {1 / bound:.1f} tok/s "
              f"({bound * 1e3:.2f} ms/step)\n")
    print("| context | method | CUDA graphs | prefill s | decode ms/step (mean) | tok/s | graphs captured / replays | KV GB | peak GPU GB |")
    print("| ---: | --- | :-: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['context']:,} | {r['method']} | {'yes' if r['cuda_graphs'] else 'no'} | {r['prefill_s']:.1f} | "
              f"{r['step_ms_mean']:.2f} | {1e3 / r['step_ms_mean']:.1f} | {r['captures']} / {r['replays']} | "
              f"{r['kv_gb']:.1f} | {r['peak_gb']:.1f} |")
    return dict(model=loaded.source, hbm_bandwidth_bytes_s=bandwidth, weight_bytes=weight_bytes,
                bound_step_s=bound, rows=rows)

"""CPU prefill time of the embedded model per attention method, same prompt, runs alternating.

Issue 3's CPU target: `infinitehip` prefill at 16K >= 2x faster than `dense` on the same machine. Dense runs
twice: with the engine's chunked prefill (the same chunks infinitehip gets; chunks after the first attend the
cached prefix through a masked SDPA) and as one chunk (is_causal SDPA over the whole prompt, the fastest dense
forward we have on CPU). Times are prefill only (the step that computes the prompt and samples the first token).

    python bench/prefill_methods_cpu.py --tokens 16384 --repeats 1 --output prefill_cpu_16k.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from infinitehip import EngineConfig, SamplingParams
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.model.gguf_convert import default_cache_root
from infinitehip.model.loading import load_model


def prefill_seconds(engine: LLMEngine, ids: list[int]) -> float:
    engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    start = time.perf_counter()
    while engine.has_work:
        engine.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--prefill-chunk-size", type=int, default=4096)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="weights, activations and KV of every run (bfloat16: this CPU's avx512_bf16 GEMMs)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    loaded = load_model(None, default_cache_root(), torch.device("cpu"), getattr(torch, args.dtype))
    ids = torch.randint(0, loaded.config.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    runs = {  # name -> (method, prefill chunk)
        "dense (chunked)": ("dense", args.prefill_chunk_size),
        "dense (one chunk)": ("dense", args.tokens),
        "infinitehip": ("infinitehip", args.prefill_chunk_size),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.repeats):
        for name, (method, chunk) in runs.items():
            engine = LLMEngine(EngineConfig(method=method, device="cpu", dtype=args.dtype, prefill_chunk_size=chunk,
                                            max_context_tokens=args.tokens + 64, show_progress=False), loaded)
            times[name].append(prefill_seconds(engine, ids))
            print(f"repeat {r}: {name}: {times[name][-1]:.1f} s", flush=True)
    med = {name: statistics.median(t) for name, t in times.items()}
    best_dense = min(med["dense (chunked)"], med["dense (one chunk)"])
    print(f"\nprefill of {args.tokens} tokens, embedded model, {args.dtype}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    print("| run | median s | tokens/s | infinitehip speedup |")
    print("| --- | ---: | ---: | ---: |")
    for name, s in med.items():
        print(f"| {name} | {s:.1f} | {args.tokens / s:.0f} | {s / med['infinitehip']:.2f}x |")
    print(f"target: infinitehip >= 2x faster than the best dense: {best_dense / med['infinitehip']:.2f}x")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"tokens": args.tokens, "dtype": args.dtype, "times_s": times, "median_s": med}, f, indent=1)


if __name__ == "__main__":
    main()

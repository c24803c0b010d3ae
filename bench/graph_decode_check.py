"""CUDA-graph decode vs eager decode on the embedded model (GPU): same tokens, and the time per decode step.

For each length, one passkey prompt is prefilled and `--max-tokens` tokens are decoded greedily twice: with the
engine's GraphDecoder (whole-model CUDA graphs per capacity bucket and refresh pattern) and with eager steps.
The outputs must be identical token for token; the script exits non-zero otherwise.

    python bench/graph_decode_check.py --lengths 32768 131072 --preset 3k-fast --max-tokens 48
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from infinitehip import EngineConfig, SamplingParams
from infinitehip.config.infinitehip import infinitehip_preset
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.eval.passkey import make_passkey_sample


def decode(engine: LLMEngine, ids: list[int], max_tokens: int) -> tuple[list[int], float, list[float]]:
    seq = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while seq.in_prefill or not seq.output_ids:
        engine.step()
    prefill_s = time.perf_counter() - t0
    steps = []
    while not seq.is_finished:
        t = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t)
    return seq.output_ids, prefill_s, steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", type=int, nargs="+", default=[32768])
    p.add_argument("--preset", default="3k-fast")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--model", default=None)
    p.add_argument("--model-cache-dir", default=None)
    p.add_argument("--depth", type=float, default=0.5)
    args = p.parse_args()

    rows, failures = [], 0
    engines = {}
    for graphs in (True, False):
        engines[graphs] = LLMEngine(EngineConfig(
            model=args.model, model_cache_dir=args.model_cache_dir, method="infinitehip", device="cuda",
            max_context_tokens=max(args.lengths) + args.max_tokens + 64, prefill_chunk_size=32768, show_progress=False,
            cuda_graphs=graphs), None if graphs else engines[True].loaded, infinitehip_preset(args.preset))
    for length in args.lengths:
        sample = make_passkey_sample(engines[True].tokenizer, length, args.depth, seed=length)
        ids = engines[True].encode_chat(sample.messages)
        out = {}
        for graphs, engine in engines.items():
            tokens, prefill_s, steps = decode(engine, ids, args.max_tokens)
            text = engine.tokenizer.decode(tokens, skip_special_tokens=True)
            warm = steps[8:] or steps
            out[graphs] = tokens
            gd = engine.runner.graph_decoder
            rows.append((length, "graphs" if graphs else "eager", prefill_s, statistics.fmean(warm) * 1e3,
                         statistics.median(warm) * 1e3, sample.is_correct(text) if hasattr(sample, "is_correct") else None,
                         f"{gd.captures}/{gd.replays}" if gd else "-", text[:40].replace("\n", " ")))
        same = out[True] == out[False]
        failures += not same
        print(f"length {length}: graph tokens == eager tokens: {same}", flush=True)
    print(f"\ndevice {torch.cuda.get_device_name()}, preset {args.preset}, embedded model, bf16, KV resident\n")
    print("| prompt tokens | decode | prefill s | step ms mean (after 8) | step ms median | passkey | captures/replays | output |")
    print("| ---: | --- | ---: | ---: | ---: | :-: | ---: | --- |")
    for r in rows:
        print(f"| {r[0]:,} | {r[1]} | {r[2]:.1f} | {r[3]:.2f} | {r[4]:.2f} | {r[5]} | {r[6]} | {r[7]!r} |")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

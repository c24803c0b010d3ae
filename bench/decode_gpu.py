"""GPU decode throughput of a Llama-3.1-8B-shaped model with RANDOM bf16 weights, against the bandwidth bound.

The bound: every decode step reads all weights once, so tokens/s <= HBM bandwidth / weight bytes.
Bandwidth is measured in the same run (device-to-device copy, bytes read + written).

    python bench/decode_gpu.py --context 4096 --steps 64
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from infinitehip import EngineConfig, SamplingParams
from infinitehip.config.model import ModelConfig, RopeScaling
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.model.loading import LoadedModel, random_model

LLAMA_31_8B = ModelConfig(
    model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
    num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
    max_position_embeddings=131072, rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
)


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--method", default="dense")
    args = parser.parse_args()

    bandwidth = hbm_bandwidth()
    model = random_model(LLAMA_31_8B, torch.device("cuda"), torch.bfloat16)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    loaded = LoadedModel(LLAMA_31_8B, model, None, "random Llama-3.1-8B-shaped weights", Path("."))
    engine = LLMEngine(
        EngineConfig(method=args.method, device="cuda", dtype="bfloat16", max_context_tokens=args.context + args.steps + 8,
                     prefill_chunk_size=args.context, show_progress=False),
        loaded,
    )
    kv_bytes = engine.cache.bytes_per_token * args.context
    ids = torch.randint(0, LLAMA_31_8B.vocab_size, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=args.steps, ignore_eos=True)

    for _ in range(2):  # the first run warms up kernels and allocator
        seq = engine.add_request(ids, params)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.step()  # prefill (one chunk) + first token
        torch.cuda.synchronize()
        prefill_s = time.perf_counter() - t0
        step_s = []
        while not seq.is_finished:
            t = time.perf_counter()
            engine.step()  # sampling reads the token back: the step is complete when it returns
            step_s.append(time.perf_counter() - t)

    step = statistics.median(step_s)
    bound = weight_bytes / bandwidth
    bound_kv = (weight_bytes + kv_bytes) / bandwidth
    print(f"\ndevice: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("model: Llama-3.1-8B shape, RANDOM bf16 weights; method", args.method)
    print(f"measured HBM bandwidth: {bandwidth / 1e12:.2f} TB/s; weights {weight_bytes / 1e9:.2f} GB; "
          f"KV at {args.context} tokens {kv_bytes / 1e9:.2f} GB\n")
    print("| metric | value |\n| --- | --- |")
    print(f"| prefill {args.context} tokens | {prefill_s * 1e3:.0f} ms ({args.context / prefill_s:.0f} tok/s) |")
    print(f"| decode step (median of {len(step_s)}) | {step * 1e3:.2f} ms |")
    print(f"| decode tokens/s | {1 / step:.1f} |")
    print(f"| weight-bandwidth bound | {1 / bound:.1f} tok/s ({bound * 1e3:.2f} ms/step) |")
    print(f"| weights+KV bound | {1 / bound_kv:.1f} tok/s |")
    print(f"| achieved / weight bound | {bound / step:.1%} |")


if __name__ == "__main__":
    main()

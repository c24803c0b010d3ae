"""CPU prefill throughput of the embedded model: our engine vs transformers' own sdpa forward.

Both run the same fp32 weights on the same prompt, alternating, so background load hits both alike.
transformers computes logits for the last position only (logits_to_keep=1), as our engine does.

    python bench/prefill_cpu.py --tokens 4096 --repeats 3
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import transformers

from infinitehip import EngineConfig, SamplingParams
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.model.gguf_convert import default_cache_root
from infinitehip.model.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--method", default="dense")
    args = parser.parse_args()

    loaded = load_model(None, default_cache_root(), torch.device("cpu"), torch.float32)
    engine = LLMEngine(
        EngineConfig(method=args.method, device="cpu", dtype="float32", max_context_tokens=args.tokens + 64,
                     prefill_chunk_size=args.tokens, show_progress=False),
        loaded,
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(loaded.model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    ids = torch.randint(0, loaded.config.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()

    engine_params = SamplingParams(temperature=0.0, max_tokens=1)

    def ours() -> None:
        seq = engine.add_request(ids, engine_params)
        while not seq.is_finished:
            engine.step()

    def theirs() -> None:
        with torch.inference_mode():
            hf(torch.tensor([ids]), logits_to_keep=1, use_cache=False)

    times: dict[str, list[float]] = {"infinitehip": [], "transformers": []}
    ours(), theirs()  # warm-up
    for _ in range(args.repeats):
        for name, fn in (("infinitehip", ours), ("transformers", theirs)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)

    print(f"\nCPU: {platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"prefill {args.tokens} tokens, method {args.method}, median of {args.repeats}\n")
    print("| implementation | seconds | tokens/s |\n| --- | --- | --- |")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.2f} | {args.tokens / med:.0f} |")
    ratio = statistics.median(times["transformers"]) / statistics.median(times["infinitehip"])
    print(f"\nours / transformers throughput: {ratio:.2f}x (target >= 0.8x)")


if __name__ == "__main__":
    main()

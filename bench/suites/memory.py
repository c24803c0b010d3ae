"""InfiniPot cost vs input length (paper App. C.2, Table 5): time to first token, share of it spent distilling
(catalyst + selection + compaction), KV cache bytes, peak device memory and decode speed. The KV cache
is one pot whatever the length, so memory should stay flat while TTFT grows linearly.

    python bench/infinipot_memory.py --lengths 8192 32768 131072 --pot-tokens 4096 --random-8b
    python bench/infinipot_memory.py --lengths 2048 8192 --pot-tokens 1024 --device cpu   # embedded model
    python bench/infinipot_memory.py --lengths 65536 1048576 --preset 4k-retrieval --model smol.gguf \
        --prefill-chunk-size 32768                                                          # a named preset

--random-8b: Llama-3.1-8B-shaped model with random bf16 weights (the embedded tokenizer encodes the
catalyst; its ids are inside the 8B vocabulary). Prompts are random token ids.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from infinitehip import EngineConfig, SamplingParams
from infinitehip.attention.infinipot import method as infinipot_method
from infinitehip.config.infinipot import PRESETS, InfiniPotConfig
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.model.gguf_convert import default_cache_root
from infinitehip.model.loading import LoadedModel, load_model, random_model


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", required=True)
    parser.add_argument("--pot-tokens", type=int, default=None, help=f"default: {InfiniPotConfig.pot_tokens}")
    parser.add_argument("--compressed-tokens", type=int, default=None, help="default: pot_tokens / 4")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="a named InfiniPot preset instead of --pot-tokens / --compressed-tokens")
    parser.add_argument("--model", default=None, help="HF dir or .gguf (default: the embedded SmolLM2-135M)")
    parser.add_argument("--model-cache-dir", default=None, help="GGUF conversion cache (default: the user cache dir)")
    parser.add_argument("--prefill-chunk-size", type=int, default=EngineConfig.prefill_chunk_size)
    parser.add_argument("--decode-steps", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--random-8b", action="store_true")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    if args.preset is not None:
        if args.pot_tokens is not None or args.compressed_tokens is not None:
            parser.error("--preset fixes the pot: drop --pot-tokens / --compressed-tokens")
        config = PRESETS[args.preset]
    else:
        pot = args.pot_tokens or InfiniPotConfig.pot_tokens
        config = InfiniPotConfig(pot_tokens=pot, compressed_tokens=args.compressed_tokens or pot // 4)

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cache_root = Path(args.model_cache_dir) if args.model_cache_dir else default_cache_root()
    embedded = load_model(args.model, cache_root, device, dtype)
    if args.random_8b:
        from decode_gpu import LLAMA_31_8B  # bench/ is the script's directory, first on sys.path

        model = random_model(LLAMA_31_8B, device, dtype)
        loaded = LoadedModel(LLAMA_31_8B, model, embedded.tokenizer, "random Llama-3.1-8B-shaped weights", Path("."))
    else:
        loaded = embedded

    distill_seconds = []
    distill = infinipot_method.InfiniPotAttention._distill

    def timed_distill(self, seq, hooks):
        _sync(device)
        start = time.perf_counter()
        kept = distill(self, seq, hooks)
        _sync(device)
        distill_seconds.append(time.perf_counter() - start)
        return kept

    infinipot_method.InfiniPotAttention._distill = timed_distill
    rows = []
    for length in args.lengths:
        engine = LLMEngine(EngineConfig(method="infinipot", device=args.device, dtype=str(dtype).removeprefix("torch."),
                                        show_progress=False, max_context_tokens=length + args.decode_steps + 8,
                                        prefill_chunk_size=args.prefill_chunk_size), loaded, config)
        ids = torch.randint(0, loaded.config.vocab_size, (length,), generator=torch.Generator().manual_seed(length)).tolist()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        distill_seconds.clear()
        engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=args.decode_steps, ignore_eos=True))
        _sync(device)
        start = time.perf_counter()
        engine.step()
        while engine.scheduler.running and engine.scheduler.running[0].in_prefill:
            engine.step()
        _sync(device)
        ttft = time.perf_counter() - start
        prefill_distill = sum(distill_seconds)
        start = time.perf_counter()
        while engine.has_work:
            engine.step()
        _sync(device)
        decode = time.perf_counter() - start
        row = dict(length=length, ttft_s=round(ttft, 3), distill_s=round(prefill_distill, 3),
                   distill_share=round(prefill_distill / ttft, 4), distillations=len(distill_seconds),
                   kv_cache_mib=round(engine.cache.num_pages * engine.cache.page_size * engine.cache.bytes_per_token / 2**20, 1),
                   peak_mem_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
                   decode_tok_s=round(args.decode_steps / decode, 1))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del engine
    if args.output:
        Path(args.output).write_text(json.dumps(dict(config=dataclasses.asdict(config), preset=args.preset,
                                                     prefill_chunk_size=args.prefill_chunk_size, rows=rows), indent=1))


if __name__ == "__main__":
    main()

"""Fixed-memory methods' cost vs input length (InfiniPot paper App. C.2, Table 5; `--method cascade` or `streaming`
beside it): time to first token, share of it spent compacting (InfiniPot's catalyst + selection + compaction, the
cascade's cache update), KV cache bytes, peak device memory and decode speed. The KV cache is one pot (cascade,
window) whatever the length, so memory should stay flat while TTFT grows linearly.

    python -m bench memory --lengths 8192 32768 131072 --pot-tokens 4096 --model random8b
    python -m bench memory --lengths 2048 8192 --pot-tokens 1024 --device cpu          # embedded model
    python -m bench memory --lengths 65536 1048576 --preset 4k-retrieval --model smol.gguf \
        --prefill-chunk-size 32768                                                   # a named preset
    python -m bench memory --smoke                                                   # CPU, embedded model
    python -m bench memory --method cascade --preset paper --lengths 32768 1048576 --model random8b
    python -m bench memory --method streaming --lengths 32768 1048576 --model random8b --window-tokens 16316

--model random8b: Llama-3.1-8B-shaped model with random bf16 weights (the embedded tokenizer encodes the
catalyst; its ids are inside the 8B vocabulary). Prompts are random token ids. The method's settings are
InfiniPot's flags (--preset, --pot-tokens, --compressed-tokens: default pot / 4, ... --help-all).
"""

from __future__ import annotations

import dataclasses
import json
import time

import torch

from bench.common import models
from bench.common.cli import add_method_flags, add_smoke_flag, method_config
from bench.common.meta import record_engine
from bench.common.timing import sync as _sync
from infinitehip import EngineConfig, SamplingParams
from infinitehip.cli.options import parse_int
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.model.loading import LoadedModel
from infinitehip.profiling import record_phases, stop_recording

DISTILL = "InfiniPot distillation"  # the product's phase name (attention/methods/infinipot/method.py)
# The phase each method compacts its cache in (its timers: distill_s, distillations); streaming has none.
COMPACTION = {"infinipot": DISTILL, "cascade": "cascade update", "streaming": None}


def add_arguments(parser) -> None:
    parser.add_argument("--lengths", type=parse_int, nargs="+", default=[8192])
    parser.add_argument("--method", choices=tuple(COMPACTION), default="infinipot",
                        help="a fixed-memory method: infinipot (default), cascade or streaming")
    models.add_model_flags(parser, default="embedded")
    parser.add_argument("--tokenizer-model", default="embedded",
                        help="with a random model: the model whose tokenizer it runs with (InfiniPot's catalyst "
                             "prompt), e.g. a carried smol.gguf where the embedded package is not installed")
    parser.add_argument("--prefill-chunk-size", type=parse_int, default=EngineConfig.prefill_chunk_size)
    parser.add_argument("--decode-steps", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    add_smoke_flag(parser, "embedded model, one 600-token prompt, a 256-token pot")
    add_method_flags(parser)


def run(args, out) -> dict:
    if args.smoke:
        args.lengths, args.device, args.decode_steps, args.model, args.prefill_chunk_size = [600], "cpu", 4, "embedded", 128
        if args.method == "infinipot":
            args.pot_tokens = getattr(args, "pot_tokens", 256)
        elif args.method == "cascade":
            args.cache_tokens, args.stride_tokens = getattr(args, "cache_tokens", 256), getattr(args, "stride_tokens", 128)
            args.sink_tokens = getattr(args, "sink_tokens", 4)
        out.meta["device"] = "cpu"
    if getattr(args, "pot_tokens", None) is not None and not hasattr(args, "compressed_tokens"):
        args.compressed_tokens = args.pot_tokens // 4
    config = method_config(args, args.method)
    phase_name = COMPACTION[args.method]
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    embedded = models.load(args.tokenizer_model if models.is_random(args.model) else args.model, device, dtype,
                           getattr(args, "model_cache_dir", None))
    if models.is_random(args.model):
        random = models.load(args.model, device, dtype)
        loaded = LoadedModel(random.config, random.model, embedded.tokenizer, random.source, random.model_dir)
        del embedded
    else:
        loaded = embedded

    seconds: dict[str, float] = {}
    calls: dict[str, int] = {}
    record_phases(device, seconds, calls)  # the product's phase timers: InfiniPot's distillations
    rows = []
    for length in args.lengths:
        engine = LLMEngine(EngineConfig(method=args.method, device=args.device, dtype=str(dtype).removeprefix("torch."),
                                        show_progress=False, max_context_tokens=length + args.decode_steps + 8,
                                        prefill_chunk_size=args.prefill_chunk_size, method_config=config), loaded)
        record_engine(engine)
        ids = models.random_ids(loaded.config.vocab_size, length, seed=length)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        seconds.clear()
        calls.clear()
        engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=args.decode_steps, ignore_eos=True))
        _sync(device)
        start = time.perf_counter()
        engine.step()
        while engine.scheduler.running and engine.scheduler.running[0].in_prefill:
            engine.step()
        _sync(device)
        ttft = time.perf_counter() - start
        prefill_distill = seconds.get(phase_name, 0.0)
        start = time.perf_counter()
        while engine.has_work:
            engine.step()
        _sync(device)
        decode = time.perf_counter() - start
        row = dict(length=length, ttft_s=round(ttft, 3), distill_s=round(prefill_distill, 3),
                   distill_share=round(prefill_distill / ttft, 4), distillations=calls.get(phase_name, 0),
                   kv_cache_mib=round(engine.cache.num_pages * engine.cache.page_size * engine.cache.bytes_per_token / 2**20, 1),
                   peak_mem_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
                   decode_tok_s=round(args.decode_steps / decode, 1))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del engine
    stop_recording()
    return dict(method=args.method, config=dataclasses.asdict(config), preset=args.preset, prefill_chunk_size=args.prefill_chunk_size,
                rows=rows)

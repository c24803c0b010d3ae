"""Prefix caching: time to first token of a first question on a long document vs a second question on the same
document (its prefix served from the cache, only the question prefilled). InfiniteHiP, Llama-3.1-8B shape with
RANDOM bf16 weights (bench/decode_gpu.py's setup; tokens are noise), resident KV and/or offloaded KV.

    python bench/prefix_ttft_gpu.py --resident 131072 --offloaded 1048576 --fast-prefill-offloaded --out prefix_ttft.json
    python bench/prefix_ttft_gpu.py --smoke                                                   # CPU, tiny model

The document is a multiple of --chunk tokens and each question --question tokens (>= the preset's question_tokens),
so the second request reuses the whole document: InfiniteHiP reuses prefixes on the prefill-chunk grid only
(kv/prefix_reuse.py); a document off the grid recomputes up to one chunk more.
--fast-prefill-offloaded (bench/offload_decode_gpu.py --fast-prefill): in the offloaded runs the prefill's sparse
attention output is zeros (K/V and saliency written as in a real prefill), so a 1M prefill fits a device call; both
requests use it, which shortens the first TTFT and so overstates the ratio. Reported in the JSON as `fast_prefill`.
--verify also runs the second question with caching off and checks the greedy tokens are equal (one more prefill).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

SMOKE = "--smoke" in sys.argv
if SMOKE and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.decode_gpu import LLAMA_31_8B  # noqa: E402
from bench.offload_decode_gpu import TINY, TINY_METHOD, banks_for, sync, use_fast_prefill  # noqa: E402
from infinitehip import EngineConfig, SamplingParams  # noqa: E402
from infinitehip.config.infinitehip import infinitehip_preset  # noqa: E402
from infinitehip.engine.llm_engine import LLMEngine  # noqa: E402
from infinitehip.model.loading import LoadedModel, random_model  # noqa: E402


def ttft(engine: LLMEngine, ids: list[int], steps: int) -> tuple[float, object]:
    """Seconds from add_request to the first sampled token (then the sequence runs to its end, untimed)."""
    sync(engine.device)
    t0 = time.perf_counter()
    seq = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True))
    while not seq.output_ids:
        engine.step()
    sync(engine.device)
    elapsed = time.perf_counter() - t0
    while not seq.is_finished:
        engine.step()
    return elapsed, seq


def run(loaded: LoadedModel, method, context: int, offloaded: bool, args) -> dict:
    device = next(loaded.model.parameters()).device
    vocab = loaded.config.vocab_size
    doc = torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    q1, q2 = (torch.randint(0, vocab, (args.question,), generator=torch.Generator().manual_seed(s)).tolist() for s in (1, 2))
    total = context + args.question + args.steps + 64
    offload = banks_for(method, total, loaded.config.num_heads, args) if offloaded else None

    def engine(caching: bool) -> LLMEngine:
        # Room for the cached document, one running request, the hit's private copies of the landmark-saliency tail
        # (their sources stay referenced while copied) and a page of slack; with less, the second request is
        # computed from scratch (scheduler.py) and the table would show no reuse.
        slack = method.landmark_window + 2 * args.page_size
        return LLMEngine(EngineConfig(method="infinitehip", device=str(device), dtype=args.dtype, max_context_tokens=total,
                                      kv_cache_tokens=total + args.question + args.steps + slack,
                                      page_size=args.page_size, prefill_chunk_size=args.chunk, max_num_seqs=1,
                                      show_progress=True, enable_prefix_caching=caching), loaded, method, offload)

    e = engine(True)
    first_s, first = ttft(e, doc + q1, args.steps)
    second_s, second = ttft(e, doc + q2, args.steps)
    stats = e.prefix_cache_stats()
    out = dict(mode="offloaded" if offloaded else "resident", context=context, question_tokens=args.question,
               ttft_first_s=first_s, ttft_second_s=second_s, ratio=second_s / first_s,
               cached_tokens=second.cached_prompt_tokens, prefilled_second=len(doc + q2) - second.cached_prompt_tokens,
               evictions=stats.evictions, fast_prefill=bool(offloaded and args.fast_prefill_offloaded),
               tokens_second=list(second.output_ids), plan=e.kv_plan.summary if e.kv_plan is not None else "")
    del e, first
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if args.verify:
        _, plain = ttft(engine(False), doc + q2, args.steps)
        out["verified_equal_to_caching_off"] = list(plain.output_ids) == out["tokens_second"]
    print(json.dumps({k: v for k, v in out.items() if k != "plan"}), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--resident", type=int, nargs="*", default=[131072], help="document lengths with the KV resident")
    p.add_argument("--offloaded", type=int, nargs="*", default=[], help="document lengths with the KV offloaded")
    p.add_argument("--question", type=int, default=64, help="tokens of each question after the document")
    p.add_argument("--steps", type=int, default=4, help="tokens generated per request (the first one is timed)")
    p.add_argument("--chunk", type=int, default=32768, help="prefill chunk (documents are rounded down to a multiple)")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--preset", default="3k-fast")
    p.add_argument("--fast-prefill-offloaded", action="store_true", help="offloaded runs: zeros for prefill attention")
    p.add_argument("--verify", action="store_true", help="compare the second answer with a caching-off run")
    # banks_for's knobs (bench/offload_decode_gpu.py)
    p.add_argument("--kv-dtype", default="auto")
    p.add_argument("--mask-bank-tokens", type=int, default=None)
    p.add_argument("--attention-bank-tokens", type=int, default=None)
    p.add_argument("--min-attention-bank", type=int, default=65536)
    p.add_argument("--warmup-tokens", type=int, default=0,
                   help="first a request of this many tokens with caching off (Triton kernels compiled before timing)")
    p.add_argument("--out", default="prefix_ttft.json")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny random model, 512-token document, verified")
    args = p.parse_args()
    if args.smoke:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        config, method = TINY, TINY_METHOD
        args.resident, args.offloaded, args.chunk, args.page_size, args.question = [512], [512], 128, 16, 40
        args.verify, args.min_attention_bank = True, 0
        from dataclasses import replace

        method = replace(method, question_tokens=8, question_keep_tokens=32, question_window=3)
    else:
        device, config = torch.device("cuda"), LLAMA_31_8B
        method = infinitehip_preset(args.preset)
    if args.question < max(1, method.question_tokens):
        p.error(f"--question must be >= the preset's question_tokens ({method.question_tokens})")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    args.dtype = "float32" if args.smoke else "bfloat16"
    loaded = LoadedModel(config, random_model(config, device, dtype), None, "random", Path("."))
    if args.warmup_tokens:
        warm = LLMEngine(EngineConfig(method="infinitehip", device=str(device), dtype=args.dtype,
                                      max_context_tokens=args.warmup_tokens + 8, prefill_chunk_size=args.chunk,
                                      max_num_seqs=1, show_progress=False, enable_prefix_caching=False),
                         loaded, method, None)
        ttft(warm, torch.randint(0, config.vocab_size, (args.warmup_tokens,)).tolist(), 2)
        del warm
    rows = []
    for context in args.resident:
        rows.append(run(loaded, method, context // args.chunk * args.chunk, False, args))
    if args.offloaded and args.fast_prefill_offloaded:
        use_fast_prefill()
    for context in args.offloaded:
        rows.append(run(loaded, method, context // args.chunk * args.chunk, True, args))
    meta = dict(weights="random bf16, Llama-3.1-8B shape" if not args.smoke else "random fp32, tiny",
                method="infinitehip", preset=args.preset, device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                torch=torch.__version__, chunk=args.chunk, page_size=args.page_size, warmup_tokens=args.warmup_tokens,
                argv=sys.argv[1:])
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    for r in rows:
        print(f"{r['mode']:>9} {r['context']:>8}: first TTFT {r['ttft_first_s']:.2f} s, second {r['ttft_second_s']:.3f} s "
              f"({100 * r['ratio']:.2f}%), cached {r['cached_tokens']}, prefilled {r['prefilled_second']}"
              + (" [fast prefill]" if r["fast_prefill"] else ""))
    if args.smoke:
        assert all(r["verified_equal_to_caching_off"] and r["cached_tokens"] == r["context"] for r in rows), rows


if __name__ == "__main__":
    main()

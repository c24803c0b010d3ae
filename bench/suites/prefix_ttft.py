"""Prefix caching: time to first token of a first question on a long document vs a second question on the same
document (its prefix served from the cache, only the question prefilled). InfiniteHiP, by default the Llama-3.1-8B
shape with RANDOM bf16 weights (tokens are noise; `--model` for a real one), resident KV and/or offloaded KV.

    python -m bench prefix-ttft --resident 131072 --offloaded 1048576 --fast-prefill-offloaded --output prefix_ttft.json
    python -m bench prefix-ttft --smoke                                                   # CPU, tiny model
    python -m bench prefix-ttft --model gemma3-270m --resident 131072 --verify            # a real model (Gemma 3)

Documents and questions are random token ids of the model's vocabulary (timing only, also with a real model).

The document is a multiple of --chunk tokens and each question --question tokens (>= the preset's question_tokens),
so the second request reuses the whole document: InfiniteHiP reuses prefixes on the prefill-chunk grid only
(kv/prefix_reuse.py); a document off the grid recomputes up to one chunk more.
--fast-prefill-offloaded (as offload-decode's --fast-prefill): in the offloaded runs the prefill's sparse
attention output is zeros (K/V and saliency written as in a real prefill), so a 1M prefill fits a device call; both
requests use it, which shortens the first TTFT and so overstates the ratio. Reported in the JSON as `fast_prefill`.
--verify also runs the second question with caching off and checks the greedy tokens are equal (one more prefill).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json

import torch

from bench.common import models
from bench.common.models import add_model_flags
from bench.common.cli import add_method_flags, add_offload_flags, add_smoke_flag, banks_for, method_config
from bench.common.gpu_profile import print_report, profile_region
from bench.common.instrument import use_fast_prefill
from bench.common.meta import record_engine
from bench.common.timing import first_token_s
from infinitehip import EngineConfig
from infinitehip.cli.options import parse_int
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.model.loading import LoadedModel
from infinitehip.profiling import record_phases

PHASES: dict[str, float] = {}  # --phase-times: seconds per marked product phase (infinitehip/profiling.py)


def run_cell(loaded: LoadedModel, method, context: int, offloaded: bool, args) -> dict:
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
        config = EngineConfig(method="infinitehip", device=str(device), dtype=args.dtype, max_context_tokens=total,
                              kv_cache_tokens=total + args.question + args.steps + slack,
                              page_size=args.page_size, prefill_chunk_size=args.chunk, max_num_seqs=1,
                              show_progress=True, enable_prefix_caching=caching, method_config=method,
                              offload=offload)
        return record_engine(LLMEngine(config, loaded))

    e = engine(True)
    first_s, first = first_token_s(e, doc + q1, args.steps)
    PHASES.clear()  # --phase-times: the second request's phases only
    with profile_region(device, args.profile_rows) if args.profile else contextlib.nullcontext() as report:
        second_s, second = first_token_s(e, doc + q2, args.steps)
    if report is not None:  # profiled: its time is not the table's
        print_report(report, f"second request, {'offloaded' if offloaded else 'resident'} {context}")
    phases = {k: v for k, v in PHASES.items() if v > 0}
    stats = e.prefix_cache_stats()
    out = dict(mode="offloaded" if offloaded else "resident", context=context, question_tokens=args.question,
               ttft_first_s=first_s, ttft_second_s=second_s, ratio=second_s / first_s,
               cached_tokens=second.cached_prompt_tokens, prefilled_second=len(doc + q2) - second.cached_prompt_tokens,
               evictions=stats.evictions, fast_prefill=bool(offloaded and args.fast_prefill_offloaded),
               tokens_second=list(second.output_ids), phases_second=phases, profiled=bool(args.profile),
               host_syncs_second=report["sync_count"] if report else None, plan=e.kv_plan.summary if e.kv_plan is not None else "")
    del e, first
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if args.verify:
        _, plain = first_token_s(engine(False), doc + q2, args.steps)
        out["verified_equal_to_caching_off"] = list(plain.output_ids) == out["tokens_second"]
    print(json.dumps({k: v for k, v in out.items() if k != "plan"}), flush=True)
    return out


def add_arguments(p) -> None:
    p.add_argument("--resident", type=parse_int, nargs="*", default=[131072], help="document lengths with the KV resident")
    p.add_argument("--offloaded", type=parse_int, nargs="*", default=[], help="document lengths with the KV offloaded")
    p.add_argument("--question", type=int, default=64, help="tokens of each question after the document")
    p.add_argument("--steps", type=int, default=4, help="tokens generated per request (the first one is timed)")
    p.add_argument("--chunk", type=parse_int, default=32768, help="prefill chunk (documents are rounded down to a multiple)")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--fast-prefill-offloaded", action="store_true", help="offloaded runs: zeros for prefill attention")
    p.add_argument("--phase-times", action="store_true",
                   help="synchronised wall time per prefill phase of the second request (adds syncs of its own)")
    p.add_argument("--profile", action="store_true",
                   help="profile the second request: kernel and host-op tables, host sync sites (its time is slowed)")
    p.add_argument("--profile-rows", type=int, default=30)
    p.add_argument("--verify", action="store_true", help="compare the second answer with a caching-off run")
    p.add_argument("--warmup-tokens", type=parse_int, default=0,
                   help="first a cell of a document this long (both questions) per KV mode timed, untimed: the Triton "
                        "kernels of a first request and of a hit compiled before timing, as in a running server")
    add_smoke_flag(p, "tiny random model, 512-token document, verified")
    add_model_flags(p)
    add_method_flags(p, preset="3k-fast")
    add_offload_flags(p)


def run(args, out) -> dict:
    if args.smoke:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        args.resident, args.offloaded, args.chunk, args.page_size, args.question = [512], [512], 128, 16, 40
        args.verify, args.min_attention_bank = True, 0
        method = dataclasses.replace(models.TINY_METHOD, question_tokens=8, question_keep_tokens=32, question_window=3)
        out.meta["device"] = str(device) if device.type == "cpu" else out.meta["device"]
    else:
        device = torch.device("cuda")
        method = method_config(args)
    if args.question < max(1, method.question_tokens):
        raise ValueError(f"--question must be >= the preset's question_tokens ({method.question_tokens})")
    args.dtype = "float32" if args.smoke else "bfloat16"
    loaded = models.load("tiny" if args.smoke else args.model, device, getattr(torch, args.dtype), args.model_cache_dir)
    warm = args.warmup_tokens // args.chunk * args.chunk
    if warm:  # both requests of a smaller cell first, per KV mode timed: every kernel of a hit compiled before timing
        for mode, contexts in ((False, args.resident), (True, args.offloaded)):
            if contexts:
                print(f"warm-up ({'offloaded' if mode else 'resident'}, {warm} tokens):", flush=True)
                run_cell(loaded, method, warm, mode, args)
    if args.phase_times:
        record_phases(device, PHASES)
    rows = []
    for context in args.resident:
        rows.append(run_cell(loaded, method, context // args.chunk * args.chunk, False, args))
    if args.offloaded and args.fast_prefill_offloaded:
        use_fast_prefill()
    for context in args.offloaded:
        rows.append(run_cell(loaded, method, context // args.chunk * args.chunk, True, args))
    out.meta.update(weights=loaded.source, method="infinitehip", preset=args.preset, chunk=args.chunk,
                    page_size=args.page_size, warmup_tokens=args.warmup_tokens,
                    method_config=None if args.smoke else dataclasses.asdict(method))
    for r in rows:
        print(f"{r['mode']:>9} {r['context']:>8}: first TTFT {r['ttft_first_s']:.2f} s, second {r['ttft_second_s']:.3f} s "
              f"({100 * r['ratio']:.2f}%), cached {r['cached_tokens']}, prefilled {r['prefilled_second']}"
              + (" [fast prefill]" if r["fast_prefill"] else ""))
        if r["phases_second"]:
            print("    second request's phases: " + ", ".join(
                f"{k} {v:.3f} s" for k, v in sorted(r["phases_second"].items(), key=lambda kv: -kv[1])))
    ok = all(r["verified_equal_to_caching_off"] and r["cached_tokens"] == r["context"] for r in rows) if args.smoke else True
    return dict(rows=rows, ok=ok)

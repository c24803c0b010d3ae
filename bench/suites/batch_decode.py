"""Serving throughput of decode: N sequences decoding together through `LLMEngine`, per method and KV mode, against
the bytes-read bound.

Each cell (method, KV mode, context, N) builds one engine, adds N requests of `context` random token ids (a seed
per sequence: no shared prefix), prefills them, then times greedy steps once every sequence decodes (one token per
sequence a step): the median step, aggregate tok/s = N / median step, and the ratio to N = 1 of the same run. The
bound: a step reads every weight once plus the KV it attends; `bound_ms` counts the whole KV of every sequence (what
dense reads), `weights_bound_ms` the weights only (the floor of a sparse method), both at --bandwidth-gbs (default:
the device-to-device copy bandwidth measured in the same run on CUDA, none on CPU).

    python -m bench batch-decode --model random8b --contexts 32768 --batch-sizes 1 4 16 --methods dense infinitehip
    python -m bench batch-decode --contexts 131072 --batch-sizes 1 8 --methods dense --modes resident offloaded
    python -m bench batch-decode --smoke                     # CPU, tiny random model, dense and infinitehip

--modes offloaded keeps the KV in host memory behind GPU banks (methods that refuse offloading are skipped, said so);
offloaded-one-graph also decodes a batch from one graph of all its sequences (`OffloadConfig.batch_decode_graph`).
"""

from __future__ import annotations

import gc
import statistics
import time

import torch

from bench.common import models
from bench.common.cli import add_smoke_flag
from bench.common.gpu_profile import print_report, profile_region
from bench.common.instrument import use_fast_prefill
from bench.common.meta import record_engine
from bench.common.timing import sync
from bench.suites.decode import hbm_bandwidth
from infinitehip import EngineConfig, SamplingParams
from infinitehip.cli.options import parse_int
from infinitehip.config.offload import KV_DTYPES, OffloadConfig
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.model.loading import LoadedModel


def method_config(method: str, preset: str | None, cpu: bool):
    """The method's config: a named preset (`NAME:PRESET`), the tiny-model InfiniteHiP on CPU, else its default."""
    from infinitehip.config.methods import method_spec

    if method in ("infinitehip", "auto") and cpu and preset in (None, "tiny"):
        import dataclasses

        return dataclasses.replace(models.TINY_METHOD, dense_within_trained=method == "auto")
    spec = method_spec(method)
    return None if spec.config_cls is None else spec.config(preset)


OFFLOADED = {"offloaded": False, "offloaded-one-graph": True}  # mode -> OffloadConfig.batch_decode_graph


def offload_for(method: str, config, context: int, num_heads: int, num_seqs: int,
                one_graph: bool = False, kv_dtype: str = "auto") -> OffloadConfig:
    """Offloading on; for infinitehip the banks hold the worst case of one resolve call for num_seqs sequences
    (one_graph: a batch replays one graph of all, `OffloadConfig.batch_decode_graph`; kv_dtype: the host store's)."""
    if method not in ("infinitehip", "auto"):
        return OffloadConfig(offload_enabled=True, batch_decode_graph=one_graph, kv_dtype=kv_dtype)
    from infinitehip.attention.methods.infinitehip.offload_access import check_offload

    need = check_offload(config, OffloadConfig(mask_bank_tokens=1 << 40, attention_bank_tokens=1 << 40), context,
                         num_heads, num_seqs)
    return OffloadConfig(offload_enabled=True, mask_bank_tokens=need.mask_stage_tokens,
                         attention_bank_tokens=max(need.attention_tokens, 65536), batch_decode_graph=one_graph,
                         kv_dtype=kv_dtype)


def kv_bytes_per_token(loaded: LoadedModel, dtype: torch.dtype) -> int:
    """K and V of one token over every layer, in the model's dtype (what dense reads per cached token)."""
    mc = loaded.config
    return 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * torch.empty(0, dtype=dtype).element_size()


def run_cell(loaded: LoadedModel, spec: str, mode: str, context: int, num_seqs: int, args, device: torch.device,
             dtype: torch.dtype) -> dict:
    method, _, preset = spec.partition(":")
    config = method_config(method, preset or None, device.type == "cpu")
    # Sequences whose prefill ends first decode while the others prefill: room for those tokens on top of the timed
    # ones (at most one a prefill step); the timed steps stop at warmup + steps and the rest is aborted.
    prefill_steps = -(-num_seqs * context // args.chunk) + num_seqs
    extra = prefill_steps + args.warmup_steps + args.steps + args.profile_steps + 8
    page = 64
    per_seq = -(-(context + extra) // page) * page + page
    offload = offload_for(method, config, context + extra, loaded.config.num_heads, num_seqs, OFFLOADED[mode],
                          args.kv_dtype) if mode in OFFLOADED else None
    engine = LLMEngine(
        EngineConfig(method=method, device=str(device), dtype=str(dtype).removeprefix("torch."),
                     max_context_tokens=context + extra, kv_cache_tokens=num_seqs * per_seq, page_size=page,
                     max_num_seqs=num_seqs, prefill_chunk_size=args.chunk, show_progress=False,
                     cuda_graphs=not args.no_graphs and device.type == "cuda", method_config=config,
                     offload=offload, enable_prefix_caching=False),
        loaded,
    )
    record_engine(engine)
    params = SamplingParams(temperature=0.0, max_tokens=extra - 4, ignore_eos=True)
    seqs = [engine.add_request(models.random_ids(loaded.config.vocab_size, context, seed=i), params)
            for i in range(num_seqs)]
    sync(device)
    t0 = time.perf_counter()
    while any(s.in_prefill or not s.output_ids for s in seqs):
        engine.step()  # prefill chunks (and the decode steps of sequences already past theirs)
    sync(device)
    prefill_s = time.perf_counter() - t0
    step_s = []
    for _ in range(args.warmup_steps + args.steps):  # every step decodes one token of each sequence
        t = time.perf_counter()
        engine.step()  # sampling reads the tokens back: the step is done when it returns
        step_s.append(time.perf_counter() - t)
    if args.profile_steps:  # after the timed steps: the profiler slows the steps it watches, so they are not timed
        with profile_region(device, args.profile_rows, syncs=False) as report:
            for _ in range(args.profile_steps):
                engine.step()
        print_report(report, f"profile of {args.profile_steps} decode steps ({spec}, {mode}, {context}, N={num_seqs})")
    if any(s.is_finished for s in seqs):
        raise RuntimeError(f"a sequence finished within the timed steps (N={num_seqs}): its tokens were not enough")
    # TokenSelect's Selection Cache: an eager step whose sequences all reuse skips scoring, a graph scores every step
    stats = [engine.method.stats(s.method_state) for s in seqs] if hasattr(engine.method, "stats") else []
    hit_ratios = [st["hit_ratio"] for st in stats if st.get("hit_ratio") is not None]
    for s in seqs:
        engine.abort(s)
    timed = step_s[args.warmup_steps:]
    median = statistics.median(timed)
    graphs = engine.runner.graph_decoder
    mean_context = context + args.warmup_steps + len(timed) / 2  # tokens per sequence over the timed steps
    row = dict(method=spec, mode=mode, context=context, batch=num_seqs, prefill_s=prefill_s,
               step_ms_median=median * 1e3, step_ms_mean=statistics.fmean(timed) * 1e3, steps=len(timed),
               tok_s=num_seqs / median, kv_bytes_per_step=int(num_seqs * mean_context * args.kv_bytes_per_token),
               captures=graphs.captures if graphs else 0, replays=graphs.replays if graphs else 0,
               batch_replays=graphs.batch_replays if graphs else 0,
               selection_hit_ratio=statistics.fmean(hit_ratios) if hit_ratios else None,
               peak_gb=torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else 0.0)
    del engine, seqs
    gc.collect()  # the engine's objects hold each other (runner, graphs, scheduler): freed only by a collection
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return row


def add_bounds(row: dict, weight_bytes: float, bandwidth_bytes_s: float | None, single: dict | None) -> dict:
    """The bytes-read bounds of the row's step, and its throughput relative to N = 1 of the same cell."""
    row["ratio_vs_batch_1"] = row["tok_s"] / single["tok_s"] if single else None
    if bandwidth_bytes_s:
        row["bound_ms"] = (weight_bytes + row["kv_bytes_per_step"]) / bandwidth_bytes_s * 1e3
        row["weights_bound_ms"] = weight_bytes / bandwidth_bytes_s * 1e3
        row["fraction_of_bound"] = row["bound_ms"] / row["step_ms_median"]
    return row


def add_arguments(parser) -> None:
    models.add_model_flags(parser)
    parser.add_argument("--contexts", type=parse_int, nargs="+", default=[32768], help="prompt tokens per sequence")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16], help="sequences decoding together")
    parser.add_argument("--methods", nargs="+", default=["dense", "infinitehip"],
                        help="NAME[:PRESET]: dense, auto, infinitehip[:3k-fast], tokenselect, streaming, ...")
    parser.add_argument("--modes", nargs="+", default=["resident"], choices=("resident", *OFFLOADED),
                        help="offloaded: KV in host memory behind GPU banks, for the methods that support it (a batch "
                             "replays each sequence's graph in turn); offloaded-one-graph: one graph of the batch "
                             "(OffloadConfig.batch_decode_graph)")
    parser.add_argument("--kv-dtype", default="auto", choices=("auto", *KV_DTYPES),
                        help="offloaded modes: the host store's dtype (auto: the model's)")
    parser.add_argument("--fast-prefill", action="store_true",
                        help="random weights only: infinitehip's prefill attention replaced by zeros (K/V, saliency "
                             "and question-time selection as in a real prefill; decode runs the real method), for "
                             "contexts whose real prefill would take most of a device session")
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps (the median is reported)")
    parser.add_argument("--warmup-steps", type=int, default=8, help="decode steps before timing (graph captures)")
    parser.add_argument("--chunk", type=parse_int, default=16384, help="prefill chunk")
    parser.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                        help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--bandwidth-gbs", type=float, default=None,
                        help="memory bandwidth of the bound, GB/s (default: measured device copy on CUDA)")
    parser.add_argument("--no-graphs", action="store_true", help="CUDA graphs off (a single sequence's decode)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="after the timed steps, profile this many more (kernel and host-op tables, printed): "
                             "where a batch's step goes")
    parser.add_argument("--profile-rows", type=int, default=30, help="rows of each profile table")
    add_smoke_flag(parser, "tiny random model, 200 tokens, N = 1 and 2, dense and infinitehip, every KV mode")


def run(args, out) -> dict:
    if args.smoke:
        args.model, args.contexts, args.batch_sizes, args.chunk = "tiny", [200], [1, 2], 128
        args.steps, args.warmup_steps = 3, 1
        args.methods, args.modes = ["dense", "infinitehip:tiny"], ["resident", *OFFLOADED]
    if args.fast_prefill and not models.is_random(args.model):
        raise ValueError("--fast-prefill is for random weights only (a real model's answer needs the real prefill)")
    if args.fast_prefill:
        use_fast_prefill()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    if device.type == "cpu":
        out.meta["device"] = "cpu"
    loaded = models.load(args.model, device, dtype, getattr(args, "model_cache_dir", None))
    weight_bytes = models.weights_gb(loaded) * 1e9
    if args.bandwidth_gbs:
        bandwidth = args.bandwidth_gbs * 1e9
    else:
        bandwidth = hbm_bandwidth() if device.type == "cuda" else None
    args.kv_bytes_per_token = kv_bytes_per_token(loaded, dtype)
    body = dict(model=loaded.source, fast_prefill=bool(args.fast_prefill), kv_dtype=args.kv_dtype,
                weight_bytes=weight_bytes, bandwidth_bytes_s=bandwidth,
                kv_bytes_per_token=args.kv_bytes_per_token, rows=[], skipped=[])
    for context in args.contexts:
        for spec in args.methods:
            for mode in args.modes:
                single = None
                for n in args.batch_sizes:
                    try:
                        row = run_cell(loaded, spec, mode, context, n, args, device, dtype)
                    except ValueError as e:  # a method that refuses the mode (offloading) or the context
                        body["skipped"].append(dict(method=spec, mode=mode, context=context, batch=n, why=str(e)))
                        print(f"{spec} {mode} at {context}, N={n}: skipped ({e})", flush=True)
                        break
                    except torch.OutOfMemoryError as e:
                        body["skipped"].append(dict(method=spec, mode=mode, context=context, batch=n, why="OOM"))
                        print(f"{spec} {mode} at {context}, N={n}: out of memory ({str(e).splitlines()[0][:120]})")
                        torch.cuda.empty_cache()
                        break
                    single = row if n == 1 else single
                    body["rows"].append(add_bounds(row, weight_bytes, bandwidth, single))
                    print(row, flush=True)
                    out.write(body)
    print_table(body)
    return body


def print_table(body: dict) -> None:
    bw = body["bandwidth_bytes_s"]
    print(f"\nmodel: {body['model']} ({body['weight_bytes'] / 1e9:.2f} GB); bandwidth of the bound: "
          f"{f'{bw / 1e9:.0f} GB/s' if bw else 'none'}")
    print("| method | KV | context | N | decode ms/step (median) | tok/s | x N=1 | bound ms (weights + KV) | "
          "of bound | weights-only ms | graphs captured / replayed |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in body["rows"]:
        ratio = f"{r['ratio_vs_batch_1']:.2f}" if r["ratio_vs_batch_1"] else "-"
        bound = (f"{r['bound_ms']:.2f} | {r['fraction_of_bound']:.0%} | {r['weights_bound_ms']:.2f}"
                 if "bound_ms" in r else "- | - | -")
        print(f"| {r['method']} | {r['mode']} | {r['context']:,} | {r['batch']} | {r['step_ms_median']:.2f} | "
              f"{r['tok_s']:.1f} | {ratio} | {bound} | {r['captures']} / {r['replays']} ({r.get('batch_replays', 0)} batched) |")

"""InfiniteHiP with the KV offloaded (host store + GPU mask / attention banks, paper Sec. 3.3): prefill L tokens,
decode N tokens with CUDA graphs, report prefill s, decode tok/s, GPU memory vs what a resident KV would take,
and the banks' hit ratios (prefill and decode separately).

    python -m bench offload-decode --contexts 131072 524288 --steps 64                 # random 8B-shaped bf16
    python -m bench offload-decode --model embedded --passkey --contexts 32768 --compare-resident
    python -m bench offload-decode --smoke                                              # CPU, tiny model

--model random8b: Llama-3.1-8B shape with RANDOM bf16 weights (tokens are noise).
--model embedded (or a .gguf file, ...): a real model; with --passkey the prompt is a passkey sample, reply checked.
--compare-resident also runs the resident engine (same prompt) and checks the greedy tokens are identical.
--fast-prefill (random8b only: decode timing at contexts whose real prefill would take most of a device session):
the prompt's K/V, landmark saliency and question-time selection are computed and written as in a real prefill, but the prefill's sparse
attention (pruning + block-sparse attention) is replaced by zeros. With random weights the cache is noise
either way; decode runs the real method. Reported as such wherever used.
--phase-times: where the prefill's time goes (synchronised wall time per phase: pruning stages, block-sparse
attention, saliency, KV writes, bank resolves), resident vs offloaded.
Bank sizes default to the worst case of one resolve call at the context (what the engine requires), the
attention bank at least --min-attention-bank tokens; the planner's summary line is printed at start-up.
"""

from __future__ import annotations

import contextlib
import cProfile
import dataclasses
import pstats
import statistics
import time

import torch

from bench.common import models
from bench.common.cli import add_method_flags, add_offload_flags, add_smoke_flag, banks_for, method_config
from bench.common.dense import decode_layerwise
from bench.common.gpu_profile import print_report, profile_region
from bench.common.instrument import use_fast_prefill
from bench.common.meta import record_engine
from bench.common.timing import sync
from infinitehip import EngineConfig, SamplingParams
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.cli.options import parse_int
from infinitehip.config.offload import OffloadConfig
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.model.loading import LoadedModel
from infinitehip.profiling import record_graph_replays, record_phases, stop_recording_graph_replays

PHASES: dict[str, float] = {}  # --phase-times: seconds per marked product phase (infinitehip/profiling.py)


def prompt_for(engine: LLMEngine, args, context: int) -> tuple[list[int], object | None]:
    if args.passkey:
        from infinitehip.eval.passkey import make_passkey_sample

        sample = make_passkey_sample(engine.tokenizer, context, args.depth, seed=context)
        return engine.encode_chat(sample.messages), sample
    return models.random_ids(engine.model_config.vocab_size, context, seed=0), None


def resolve_calls(engine) -> dict[str, int]:
    """Resolve calls so far per bank, all layers (each call advances its layer's device clock; syncs)."""
    return {bank.name: int(bank.clock.sum()) for bank in engine.cache.kv.banks}


def run_cell(loaded: LoadedModel, method: InfiniteHiPConfig, offload: OffloadConfig | None, context: int, args) -> dict:
    device = loaded.model.embed_tokens.weight.device if hasattr(loaded.model, "embed_tokens") else next(loaded.model.parameters()).device
    engine = LLMEngine(EngineConfig(method="infinitehip", device=str(device), dtype=args.dtype,
                                    max_context_tokens=context + args.steps + args.warmup_steps + 64,
                                    prefill_chunk_size=args.chunk, show_progress=True, max_num_seqs=1,
                                    cuda_graphs=not args.no_graphs, overlap_decode=not args.no_overlap,
                                    method_config=method, offload=offload),
                       loaded)
    record_engine(engine)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    setup_bytes = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    ids, sample = prompt_for(engine, args, context)
    seq = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=args.steps + args.warmup_steps + 1,
                                                 ignore_eos=True))
    sync(device)
    PHASES.clear()
    mode = "offloaded" if offload else "resident"
    region = profile_region(device, args.profile_rows, syncs=False) if args.profile_prefill else contextlib.nullcontext()
    with region as report:
        t0 = time.perf_counter()
        while seq.in_prefill or not seq.output_ids:
            engine.step()
        sync(device)
        prefill_s = time.perf_counter() - t0
    if report is not None:
        print_report(report, f"profile of the prefill ({mode})")
    phases = {k: v for k, v in PHASES.items() if v > 0}
    prefill_stats = engine.kv_stats()
    step_s, replay_events, host_prof, captures_before, clocks = [], [], None, 0, None
    profiled, step_report = contextlib.ExitStack(), None  # --profile-steps: the last steps, after the timed ones
    while not seq.is_finished:
        if len(step_s) == args.warmup_steps and offload is not None:
            engine.cache.reset_stats()  # decode hit ratios over the timed steps (graph replays included)
            clocks = resolve_calls(engine)  # the banks' device clocks count resolve calls, graph replays included
        if len(step_s) == args.warmup_steps:
            graphs = engine.runner.graph_decoder
            captures_before = graphs.captures if graphs else 0
        if len(step_s) == args.warmup_steps and (args.host_profile or args.graph_times):
            replay_events = record_graph_replays()
        if len(step_s) == args.warmup_steps and args.host_profile:
            host_prof = cProfile.Profile()
            host_prof.enable()
        if args.profile_steps and len(step_s) == args.warmup_steps + args.steps - args.profile_steps:
            step_report = profiled.enter_context(profile_region(device, args.profile_rows, syncs=False))
        t = time.perf_counter()
        engine.step()
        step_s.append(time.perf_counter() - t)
    graph_ms, by_key = [], {}
    if replay_events:
        stop_recording_graph_replays()
        sync(device)
        timed_events = replay_events[: args.steps - args.profile_steps]
        graph_ms = [r.ms for r in timed_events]
        print(f"{len(graph_ms)} of the timed decode steps replayed a graph: GPU time per replay "
              f"{statistics.fmean(graph_ms):.2f} ms (min {min(graph_ms):.2f}, max {max(graph_ms):.2f})")
        # per method key (refresh pattern, group, kept rows): what each kind of step costs
        for ms, r in zip(graph_ms, timed_events):
            by_key.setdefault(str(r.key[1] if r.key else None), []).append(ms)
        for key, times in sorted(by_key.items()):
            print(f"  method key {key}: {len(times)} replays, {statistics.fmean(times):.2f} ms each")
    if host_prof is not None:
        host_prof.disable()
        print("host profile of the timed decode steps (cProfile slows the host: their times are not the table's):")
        pstats.Stats(host_prof).sort_stats("tottime").print_stats(args.profile_rows)
    profiled.close()
    if step_report is not None:
        print_report(step_report, f"profile of the last {args.profile_steps} decode steps ({mode})")
    # the profiled steps (the last profile_steps) are slowed by the profiler: not timed
    timed = step_s[args.warmup_steps : len(step_s) - args.profile_steps] or step_s
    decode_stats = engine.kv_stats()
    after_warmup = len(step_s) - args.warmup_steps
    resolves = {bank: (n - clocks[bank]) / after_warmup for bank, n in resolve_calls(engine).items()} if clocks else {}
    graphs = engine.runner.graph_decoder
    text = engine.tokenizer.decode(seq.output_ids, skip_special_tokens=True) if engine.tokenizer is not None else ""
    out = dict(
        mode="offloaded" if offload is not None else "resident", context=len(ids), prefill_s=prefill_s,
        step_ms=statistics.fmean(timed) * 1e3, graph_ms=statistics.fmean(graph_ms) if graph_ms else None,
        graph_ms_by_key={k: statistics.fmean(v) for k, v in by_key.items()},
        captures_in_timed=graphs.captures - captures_before if graphs else 0, tokens=list(seq.output_ids),
        passkey=sample.is_correct(text) if sample is not None else None,
        answer=sample.answer if sample is not None else None, output=text,
        # what a resident cache in the model's dtype would hold (an FP8 store is half of it, on the host)
        resident_kv_gb=2 * loaded.config.num_layers * loaded.config.num_kv_heads * loaded.config.head_dim
        * torch.empty(0, dtype=getattr(torch, args.dtype)).element_size() * len(ids) / 1e9,
        peak_gpu_gb=torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else 0.0,
        setup_gpu_gb=setup_bytes / 1e9,
        bank_gb=(engine.cache.device_bytes - engine.cache.kv.store.device_bytes) / 1e9 if offload is not None else 0.0,
        store_gpu_gb=engine.cache.kv.store.device_bytes / 1e9 if offload is not None else 0.0,
        phases=phases,
        captures=graphs.captures if graphs else 0, replays=graphs.replays if graphs else 0,
        plan=engine.kv_plan.summary if engine.kv_plan is not None else "",
    )
    for bank, n in resolves.items():  # per decode step, all layers (every step after the warm-up)
        out[f"decode_{bank}_resolves_per_step"] = n
        # distinct slots the resolves requested and rows they copied from the store (misses), per step, all layers
        requested = decode_stats[bank].total_hits + decode_stats[bank].total_misses
        out[f"decode_{bank}_requested_per_step"] = requested / after_warmup
        out[f"decode_{bank}_copied_per_step"] = decode_stats[bank].total_misses / after_warmup
    for phase, stats in (("prefill", prefill_stats), ("decode", decode_stats)):
        for bank in ("mask", "attention"):
            out[f"{phase}_{bank}_hit"] = stats[bank].hit_ratio if stats else None
            out[f"{phase}_{bank}_overflows"] = sum(stats[bank].overflows) if stats else 0
    del engine, seq
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def add_arguments(p) -> None:
    p.add_argument("--contexts", type=parse_int, nargs="+", default=[131072])
    p.add_argument("--steps", type=int, default=None,
                   help="timed decode steps (default: two of the longest refresh interval, so every refresh pattern "
                        "is timed in its proportion)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="decode steps before timing (default: the longest refresh interval + 2, so every refresh "
                        "pattern's graph is captured before timing)")
    p.add_argument("--dense-layerwise", action="store_true",
                   help="GPU: the paper's layer-wise dense decode estimate at each context, measured after the runs")
    p.add_argument("--graph-times", action="store_true", help="GPU time of each graph replay (CUDA events)")
    models.add_model_flags(p)
    p.add_argument("--passkey", action="store_true", help="passkey prompt (a real model: not random8b)")
    p.add_argument("--repeat-resident", action="store_true",
                   help="run the resident engine twice as well: tells run-to-run non-determinism from offload effects")
    p.add_argument("--depth", type=float, default=0.5)
    p.add_argument("--chunk", type=parse_int, default=32768, help="prefill chunk")
    p.add_argument("--compare-resident", action="store_true", help="also run with the KV resident; tokens must match")
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--no-overlap", action="store_true",
                   help="one decode step at a time (EngineConfig.overlap_decode off: the host reads each token first)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--profile-steps", type=int, default=0, help="profile N decode steps after the timed ones (kernel "
                   "table; --steps counts them, they are not timed)")
    p.add_argument("--profile-rows", type=int, default=25)
    p.add_argument("--host-profile", action="store_true",
                   help="cProfile of the timed decode steps and the GPU time of each graph replay (CUDA events)")
    p.add_argument("--profile-prefill", action="store_true", help="kernel and host tables of the prefill")
    p.add_argument("--fast-prefill", action="store_true", help="random8b: prefill attention replaced by zeros (see above)")
    p.add_argument("--phase-times", action="store_true", help="synchronised wall time per prefill phase")
    add_smoke_flag(p, "tiny random model, 700 tokens, 8 steps, offloaded tokens == resident tokens")
    add_method_flags(p, preset="3k-fast")
    add_offload_flags(p)


def run(args, out) -> dict:
    if args.passkey and models.is_random(args.model):
        raise ValueError("--passkey needs a real model (random weights cannot answer)")
    if args.fast_prefill and not models.is_random(args.model):
        raise ValueError("--fast-prefill is for random weights only (a real model's answer needs the real prefill)")
    if args.fast_prefill:
        use_fast_prefill()
    if args.phase_times:
        record_phases(torch.device("cpu" if args.smoke else "cuda"), PHASES)
    if args.smoke:
        args.contexts, args.steps, args.warmup_steps, args.chunk = [700], 8, 2, 128
        args.dtype, args.compare_resident, args.no_graphs = "float32", True, True
        args.min_attention_bank = 0  # banks at the worst case of one call: evictions every step
        out.meta["device"] = "cpu"
        loaded = models.load("tiny", torch.device("cpu"), torch.float32)
        method = models.TINY_METHOD
    else:
        loaded = models.load(args.model, torch.device("cuda"), getattr(torch, args.dtype), args.model_cache_dir)
        method = method_config(args)
    longest_refresh = max(method.refresh_intervals)
    args.warmup_steps = longest_refresh + 2 if args.warmup_steps is None else args.warmup_steps
    args.steps = 2 * longest_refresh if args.steps is None else args.steps
    weights_gb = models.weights_gb(loaded)

    rows, failures = [], 0
    for context in args.contexts:
        offload = banks_for(method, context + args.steps + args.warmup_steps + 64, loaded.config.num_heads, args)
        print(f"context {context:,}: {offload}", flush=True)
        modes = [offload] + ([None] if args.compare_resident else []) + ([None, None] if args.repeat_resident else [])
        results = []
        for mode in modes:
            try:
                results.append(run_cell(loaded, method, mode, context, args))
            except torch.OutOfMemoryError as e:
                print(f"{'offloaded' if mode else 'resident'} at {context}: out of GPU memory ({str(e)[:160]})", flush=True)
                torch.cuda.empty_cache()
        for r in results:
            print({k: v for k, v in r.items() if k not in ("tokens", "phases")}, flush=True)
            if r["phases"]:
                print(f"prefill phases ({r['mode']}, {r['prefill_s']:.1f} s in all; nested phases overlap): "
                      + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(r["phases"].items(), key=lambda kv: -kv[1])),
                      flush=True)
        if args.compare_resident and len(results) >= 2:
            same = results[0]["tokens"] == results[1]["tokens"]
            failures += not same
            print(f"context {context:,}: offloaded tokens == resident tokens: {same}", flush=True)
        if args.repeat_resident and len(results) >= 2:
            a, b = results[-2:]
            print(f"context {context:,}: resident run 1 tokens == resident run 2 tokens: {a['tokens'] == b['tokens']}",
                  flush=True)
        rows += results

    device = out.meta["device"]
    print(f"\ndevice: {device}, torch {torch.__version__}; model: {loaded.source} ({weights_gb:.2f} GB weights); "
          f"preset {'tiny' if args.smoke else args.preset}; graphs {'off' if args.no_graphs else 'on'}; "
          f"prefill {'FAST (attention replaced by zeros)' if args.fast_prefill else 'real'}\n")
    print("| context | KV | prefill s | decode ms/step | tok/s | peak GPU GB | banks GB | store on GPU GB | resident KV GB | "
          "mask hit (prefill/decode) | attention hit (prefill/decode) | graphs | captures timed | graph GPU ms | passkey |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :-: |")
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    for r in rows:
        print(f"| {r['context']:,} | {r['mode']} | {r['prefill_s']:.1f} | {r['step_ms']:.2f} | {1e3 / r['step_ms']:.1f} | "
              f"{r['peak_gpu_gb']:.1f} | {r['bank_gb']:.2f} | {r['store_gpu_gb']:.2f} | {r['resident_kv_gb']:.2f} | "
              f"{fmt(r['prefill_mask_hit'])} / {fmt(r['decode_mask_hit'])} | "
              f"{fmt(r['prefill_attention_hit'])} / {fmt(r['decode_attention_hit'])} | {r['captures']}/{r['replays']} | "
              f"{r['captures_in_timed']} | {fmt(r['graph_ms'])} | {r['passkey']} |")
    if args.dense_layerwise:
        dense = decode_layerwise(loaded, args.contexts, torch.device("cpu" if args.smoke else "cuda"))
        print("\ndense decode, layer-wise (graph step without attention + layers x SDPA-flash decode of one layer):")
        print("| context | step without attention ms | one layer's SDPA ms | dense step ms | dense tok/s | offloaded ms/step | offloaded / dense speed |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for d in dense:
            ours = [r["step_ms"] for r in rows if r["context"] >= d["context"] and r["mode"] == "offloaded"][:1]
            tail = f"{ours[0]:.2f} | {d['dense_ms'] / ours[0]:.2f}x" if ours else "- | -"
            print(f"| {d['context']:,} | {d['rest_ms']:.2f} | {d['layer_ms']:.3f} | {d['dense_ms']:.2f} | "
                  f"{1e3 / d['dense_ms']:.1f} | {tail} |")
    out.meta.update(model=loaded.source, preset=None if args.smoke else args.preset,
                    method_config=None if args.smoke else dataclasses.asdict(method), fast_prefill=bool(args.fast_prefill))
    keep = [{k: v for k, v in r.items() if k not in ("tokens",)} for r in rows]
    overflows = sum(r[f"{ph}_{b}_overflows"] for r in rows for ph in ("prefill", "decode") for b in ("mask", "attention"))
    if overflows:
        print(f"ERROR: {overflows} resolve calls asked a bank for more rows than it holds")
    return dict(rows=keep, dense_layerwise=dense if args.dense_layerwise else None, ok=not (failures or overflows))

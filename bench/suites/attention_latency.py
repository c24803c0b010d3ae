"""Single-layer attention latency: InfiniteHiP vs dense FlashAttention (paper Table 19 style).

One attention layer with Llama-3-8B shapes (32 query heads, 8 KV heads, head_dim 128, bf16) over a
one-layer PagedKVCache holding T random tokens (keys without RoPE, as the engine stores them), for each
context T in --contexts:

Prefill = chunked prefill of the LAST --chunk (default 32K) queries at context T (queries at positions
T-chunk .. T-1, all T keys already cached).
  dense   torch SDPA with the FLASH_ATTENTION backend forced, keys/queries already rotated (dense needs
          no RoPE work at attention time). Timed as two calls, reported as their sum:
            (a) the chunk's queries over the T-chunk prefix keys, non-causal;
            (b) the causal chunk x chunk square.
          The merge of the two partial softmaxes (a few elementwise ops) is not included, so dense is
          slightly favoured.
  ours    the method's own building blocks: each pruning stage (`InfiniteHiPAttention._stage`, i.e.
          `run_stage`, including the child-block mapping), the block-sparse attention
          (`_attend_prefill`: key-list assembly + RoPE positions + kernel; the kernel alone is also shown),
          and the total as one real `InfiniteHiPAttention.prefill` call.
Decode = one query at position T-1 over T keys.
  dense   SDPA FLASH, 1 query x T keys (GQA); the achieved KV read bandwidth is printed as a sanity check.
  ours    per preset (--presets, default 3k 3k-fast 3k-flash):
          stage i    one `_stage` call with a 1-query block (what a refresh of stage i costs);
          BSA        `InfiniteHiPAttention.decode` with every stage cached (no refresh): key list + kernel;
          AR         `InfiniteHiPAttention.decode` with every stage refreshed each step (no mask caching);
          amortized (formula)  sum_i stage_i / refresh_intervals[i] + BSA;
          amortized (e2e)      the real mask-cache path: `decode` run for 2 x max(refresh interval) steps
                               from a fresh state (different random queries, same context), mean per step;
          GPU-only (CUDA graph, CUDA only): the device work of each stage (q rotation, candidate chunks,
                               chunk-scoring kernel, top-k, sort) and the BSA kernel captured in CUDA
                               graphs, i.e. without the eager Python/launch overhead and host syncs of the
                               method's glue code; "GPU-only amortized" = sum_i kernel_i / r_i + BSA kernel.
          The layer is a "late" layer (layer index >= 3: relative pruning RoPE, k3 = 2048) unless
          --layer-type early (chunk-indexed pruning RoPE, k3 = 4096).

Timing: CUDA events around each call, after an L2 flush (256 MB memset) and a device sync, so the eager
host overhead of each call is included (its own host syncs included); warm-up calls first; median of
several reps (mean for the e2e decode loop). CPU: time.perf_counter.

    python bench/attention_latency.py                                   # GPU, 128K..1M
    python bench/attention_latency.py --contexts 1048576 --output lat.json
    python bench/attention_latency.py --device cpu --contexts 16384 --impl reference --chunk 4096
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import platform
import statistics
import sys
import time
import traceback
from typing import Any, Callable

import torch
import torch.nn.functional as F

from infinitehip.attention.base import ForwardBatch, SequenceSlice
from infinitehip.attention.infinitehip import method as method_module
from infinitehip.attention.infinitehip.method import InfiniteHiPAttention
from infinitehip.attention.infinitehip.positions import scoring_positions
from infinitehip.attention.infinitehip.pruning import initial_chunks, query_blocks, sparse_limit, subdivide
from infinitehip.attention.infinitehip.scoring import chunk_scores, representative_scores
from infinitehip.attention.question_selection import question_chunks
from infinitehip.config.infinitehip import PRESETS, InfiniteHiPConfig
from infinitehip.config.model import ModelConfig
from infinitehip.kv.paged_cache import PagedKVCache
from infinitehip.model.rope import RotaryEmbedding, apply_rotary

# Llama-3-8B attention shapes; one layer. max_position_embeddings only matters for the "dynamic" RoPE
# styles (unused by the presets).
LLAMA3_8B_LAYER = ModelConfig(
    model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=1,
    num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
    max_position_embeddings=8192,
)
DENSE = "SDPA-flash"  # "SDPA (cpu)" in CPU mode, where the flash backend is not forced
MC = LLAMA3_8B_LAYER  # replaced in main() when --heads / --kv-heads shrink the layer (CPU check)
LAYER = 0  # the one layer of the cache; --layer-type decides whether the method treats it as early or late
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def log(msg: str = "") -> None:
    print(msg, flush=True)


# ---- timing ---------------------------------------------------------------------------------------------
class Timer:
    """Median latency (ms) of fn(): warm-up calls, then reps until min_reps and budget_s are reached."""

    def __init__(self, device: torch.device, warmup: int, min_reps: int, max_reps: int, budget_s: float,
                 flush_mb: int = 256):
        self.cuda = device.type == "cuda"
        self.warmup, self.min_reps, self.max_reps, self.budget_s = warmup, min_reps, max_reps, budget_s
        self.flush_buf = torch.empty(flush_mb << 20, dtype=torch.int8, device=device) if self.cuda and flush_mb else None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def once(self, fn: Callable[[], Any]) -> float:
        """One timed call (ms), cold L2, nothing queued before it."""
        if self.flush_buf is not None:
            self.flush_buf.zero_()
        self.sync()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def __call__(self, fn: Callable[[], Any], warmup: int | None = None) -> dict:
        warmup = self.warmup if warmup is None else warmup
        times: list[float] = []
        if warmup < 0:  # auto (CPU): a first call under 0.5 s is a warm-up, a slower one is the measurement
            first = self.once(fn)
            if first >= 500:
                times.append(first)
            warmup = 0
        for _ in range(warmup):
            fn()
        self.sync()
        while len(times) < self.max_reps and (len(times) < self.min_reps or sum(times) < self.budget_s * 1e3):
            times.append(self.once(fn))
        return {"ms": statistics.median(times), "min_ms": min(times), "reps": len(times)}


def time_graph(timer: Timer, fn: Callable[[], Any]) -> dict | None:
    """Median latency of fn captured in a CUDA graph (device time without eager host overhead)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile / allocate outside the capture
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    result = timer(graph.replay, warmup=2)
    del graph
    return result


def try_graph(timer: Timer, fn: Callable[[], Any] | None, what: str, errors: list[str]) -> dict | None:
    if fn is None:
        return {"ms": 0.0, "min_ms": 0.0, "reps": 0}  # nothing to run on the device
    try:
        return time_graph(timer, fn)
    except Exception as e:  # noqa: BLE001 - a failed capture must not end the benchmark
        errors.append(f"{what}: {type(e).__name__}: {e}")
        log(f"  [graph timing of {what} failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}]")
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        return None


@contextlib.contextmanager
def record_calls(module: Any, name: str):
    """Temporarily wrap module.name to record its (args, kwargs); yields (calls, original)."""
    original = getattr(module, name)
    calls: list[tuple[tuple, dict]] = []

    def recorder(*args, **kwargs):
        calls.append((args, kwargs))
        return original(*args, **kwargs)

    setattr(module, name, recorder)
    try:
        yield calls, original
    finally:
        setattr(module, name, original)


# ---- setup ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Context:
    T: int
    cache: PagedKVCache
    page_table: torch.Tensor
    k_dense: torch.Tensor | None  # [T, Hkv, d] rotated at original positions, contiguous
    v_dense: torch.Tensor | None


def build_context(T: int, args, device: torch.device, dtype: torch.dtype, rope: RotaryEmbedding) -> Context:
    mc = MC
    num_pages = -(-T // args.page_size)
    cache = PagedKVCache(1, num_pages, args.page_size, mc.num_kv_heads, mc.head_dim, dtype, device)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    if args.shuffle_pages:
        perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(args.seed + 1))
        page_table = perm.to(torch.int32).to(device)
    else:
        page_table = torch.arange(num_pages, dtype=torch.int32, device=device)
    k_dense = v_dense = None
    if not args.skip_dense:
        # Dense baseline input: keys rotated at their original positions once, in order, NHD layout.
        k_dense = torch.empty(T, mc.num_kv_heads, mc.head_dim, dtype=dtype, device=device)
        v_dense = torch.empty_like(k_dense)
        rope.ensure(T)
        slab = 1 << 16
        for s in range(0, T, slab):
            e = min(T, s + slab)
            slots = cache.slots(page_table, s, e)
            k_dense[s:e] = rope.apply_range(cache.flat_k(LAYER)[slots], s)
            v_dense[s:e] = cache.flat_v(LAYER)[slots]
    return Context(T, cache, page_table, k_dense, v_dense)


def method_config(name: str, args) -> InfiniteHiPConfig:
    cfg = PRESETS[name]
    # The cache has one layer (index 0): early_layers decides whether the method treats it as early or late.
    return dataclasses.replace(cfg, impl=args.impl, early_layers=1 if args.layer_type == "early" else 0)


# ---- dense ----------------------------------------------------------------------------------------------
def bench_dense(ctx: Context, q_prefill: torch.Tensor | None, q_decode: torch.Tensor, args, timer: Timer,
                rope: RotaryEmbedding, device: torch.device) -> dict:
    T, res = ctx.T, {}
    kd, vd = ctx.k_dense, ctx.v_dense
    with backend_ctx(device), torch.inference_mode():
        if q_prefill is not None:
            C = q_prefill.shape[0]
            qr = rope.apply_range(q_prefill, T - C)  # rotated once, outside the timing
            if T > C:
                res["prefill_prefix"] = timer(lambda: sdpa(qr, kd[: T - C], vd[: T - C], causal=False))
            else:
                res["prefill_prefix"] = {"ms": 0.0, "min_ms": 0.0, "reps": 0}
            res["prefill_square"] = timer(lambda: sdpa(qr, kd[T - C:], vd[T - C:], causal=True))
            res["prefill_ms"] = res["prefill_prefix"]["ms"] + res["prefill_square"]["ms"]
            del qr
        qd = rope.apply_range(q_decode, T - 1)
        res["decode"] = timer(lambda: sdpa(qd, kd, vd, causal=False))
        res["decode_us"] = res["decode"]["ms"] * 1e3
        kv_bytes = 2 * kd.numel() * kd.element_size()
        res["decode_kv_GBps"] = kv_bytes / (res["decode"]["ms"] * 1e-3) / 1e9
    return res


# ---- InfiniteHiP prefill -------------------------------------------------------------------------------
def bench_ours_prefill(ctx: Context, q: torch.Tensor, args, timer: Timer, rope: RotaryEmbedding) -> dict:
    T, C = ctx.T, q.shape[0]
    cfg = method_config(args.prefill_preset, args)
    method = InfiniteHiPAttention(MC, cfg)
    seq = SequenceSlice(0, 0, C, T - C, T - C, ctx.page_table, ctx.cache, method.new_state(), True)
    batch = ForwardBatch([seq], ctx.cache, rope, C)
    specs = method._specs(LAYER, decode=False)
    res: dict = {"preset": args.prefill_preset, "specs": [dataclasses.asdict(s) for s in specs]}

    with torch.inference_mode():
        if method.saliency is not None:
            # Landmark representatives read per-key saliency that the earlier chunks' queries left behind; this
            # bench has no earlier queries, so the context's saliency is random (the cost does not depend on it)
            # and the chunk's own update runs as in prefill (it is timed inside `total`).
            method._update_saliency(LAYER, q, seq, batch)
            total_sal, count_sal = method.saliency._sum[LAYER], method.saliency._count[LAYER]
            total_sal.uniform_()
            count_sal.fill_(1.0)
        # One pass through the pipeline, keeping every stage's output (the next stage's input).
        outs, blocks = [], None
        for spec in specs:
            blocks = query_blocks(q, seq.start_pos, spec.query_block_size)
            parent = outs[-1] if outs else None
            if parent is not None:
                rows = torch.arange(blocks.q.shape[0], device=q.device) * spec.query_block_size
                parent = parent.for_blocks(rows // parent.query_block_size)
            outs.append(method._stage(spec, blocks, parent, LAYER, seq, batch))
        final_blocks = blocks
        window_start = sparse_limit(final_blocks.last_position, cfg.sink_tokens, cfg.stream_tokens)

        def stage_fn(i: int):
            spec, prev = specs[i], (outs[i - 1] if i else None)

            def fn():
                b = query_blocks(q, seq.start_pos, spec.query_block_size)
                parent = prev
                if parent is not None:
                    rows = torch.arange(b.q.shape[0], device=q.device) * spec.query_block_size
                    parent = parent.for_blocks(rows // parent.query_block_size)
                return method._stage(spec, b, parent, LAYER, seq, batch)

            return fn

        res["stages"] = []
        for i in range(len(specs)):
            r = timer(stage_fn(i))
            o = outs[i]
            r["kept_chunks_max"] = int(o.chunk_starts.shape[1])
            res["stages"].append(r)

        bsa = lambda: method._attend_prefill(LAYER, q, seq, batch, outs[-1], final_blocks, window_start)
        with record_calls(method_module, "sparse_attention_prefill") as (calls, kernel):
            bsa()
        a, kw = calls[0]
        key_counts = a[6]
        res["keys_per_block_mean"] = float(key_counts.float().mean())
        res["keys_per_block_max"] = int(key_counts.max())
        res["bsa"] = timer(bsa)
        res["bsa_kernel"] = timer(lambda: kernel(*a, **kw))
        res["total"] = timer(lambda: method.prefill(LAYER, q, seq, batch))
    res["sum_of_parts_ms"] = sum(s["ms"] for s in res["stages"]) + res["bsa"]["ms"]
    res["prefill_ms"] = res["total"]["ms"]
    return res


# ---- InfiniteHiP decode --------------------------------------------------------------------------------
def stage_device_fn(method: InfiniteHiPAttention, spec, blocks, parent, seq: SequenceSlice, batch: ForwardBatch):
    """The device work of one `run_stage` call without its host syncs (for CUDA-graph timing): candidate chunks,
    query rotation, chunk scoring (SelectRep, or landmark representatives + representative scores), top-k and
    position sort. None when the stage keeps every candidate."""
    c = method.config
    rope = batch.rope
    limit = sparse_limit(blocks.last_position, c.sink_tokens, c.stream_tokens)
    if parent is None:
        starts0, lens0 = initial_chunks(limit, c.sink_tokens, spec.chunk_size)  # host sync: outside the graph
        candidates = lambda: (starts0, lens0)
    else:
        candidates = lambda: subdivide(parent, spec.chunk_size, limit)
    starts, lens = candidates()
    keep = spec.keep_tokens // spec.chunk_size
    if (int((lens > 0).sum(1).max()) if lens.numel() else 0) <= keep:
        return None
    pos = scoring_positions(spec.rope_style, blocks.positions, lens, c.stream_tokens, seq.context_len, method.trained_len)
    rope.ensure(int(pos.query_pos.max()) + 1)
    rope.ensure(int(pos.key_pos_base.max()) + (seq.context_len // pos.token_pos_group if pos.token_pos_group else 0) + 2)
    cos, sin = rope.cos, rope.sin  # held by the closure: the graph reads these exact tensors
    k_flat, impl, big = seq.cache.flat_k(LAYER), method._impl(blocks.q), torch.iinfo(torch.int64).max

    def fn():
        st, ln = candidates()
        q_rot = apply_rotary(blocks.q, cos[pos.query_pos][:, :, None], sin[pos.query_pos][:, :, None])
        if method.saliency is None:
            scores, _ = chunk_scores(q_rot, blocks.valid, k_flat, seq.page_table, seq.cache.page_size, st, ln,
                                     pos.key_pos_base, pos.token_pos_group, pos.left_offset, pos.right_offset,
                                     pos.rep_offset, cos, sin, impl=impl)
        else:  # landmark: most salient token per chunk (one block: no dedupe sort), then the scores kernel
            reps = method.saliency.representatives(LAYER, st, ln, seq.page_table, seq.cache.page_size, spec.chunk_size,
                                                   impl=impl)
            scores = representative_scores(q_rot, blocks.valid, k_flat, seq.page_table, seq.cache.page_size, reps, ln,
                                           pos.key_pos_base, pos.token_pos_group, pos.rep_offset, cos, sin, impl=impl)
        idx = torch.topk(scores, keep, dim=1).indices
        st, ln = st.gather(1, idx), ln.gather(1, idx)
        order = torch.argsort(torch.where(ln > 0, st, big), dim=1)
        return st.gather(1, order), ln.gather(1, order)

    return fn


def engine_graph_decode(method, state, seq, batch, q, intervals, timer, errors, what: str) -> dict:
    """Replay time of `method.decode` (the sync-free engine step) captured per refresh pattern; amortized over
    a cycle of lcm(intervals) steps, plus the all-refresh ("AR") pattern."""
    cycle = math.lcm(*intervals)
    steps_of: dict[tuple, list[int]] = {}
    for step in range(cycle):
        steps_of.setdefault(tuple(step % r == 0 for r in intervals), []).append(step)
    per_pattern = {}
    for pattern, steps in steps_of.items():
        def fn(step=steps[0]):
            state.decode_steps[LAYER] = step
            return method.decode(LAYER, q, [seq], batch)
        per_pattern[pattern] = try_graph(timer, fn, f"{what} engine graph {pattern}", errors)
    if any(t is None for t in per_pattern.values()):
        return {"engine_graph_patterns": {str(p): t for p, t in per_pattern.items()}}
    amortized = sum(per_pattern[p]["ms"] * len(s) for p, s in steps_of.items()) / cycle
    return {"engine_graph_patterns": {str(p): t for p, t in per_pattern.items()},
            "engine_graph_amortized_us": amortized * 1e3,
            "engine_graph_ar_us": per_pattern[tuple(True for _ in intervals)]["ms"] * 1e3}


def bench_ours_decode(ctx: Context, preset: str, q: torch.Tensor, args, timer: Timer, rope: RotaryEmbedding,
                      device: torch.device, errors: list[str]) -> dict:
    T = ctx.T
    cfg = method_config(preset, args)
    method = InfiniteHiPAttention(MC, cfg)
    state = method.new_state()
    seq = SequenceSlice(0, 0, 1, T - 1, T - 1, ctx.page_table, ctx.cache, state, False)
    batch = ForwardBatch([seq], ctx.cache, rope, 1)
    specs = method._specs(LAYER, decode=True)
    intervals = list(cfg.refresh_intervals)
    res: dict = {"preset": preset, "refresh_intervals": intervals, "specs": [dataclasses.asdict(s) for s in specs]}

    with torch.inference_mode():
        if cfg.question_tokens:  # question-time selection (made once per layer at the prompt's end): its chunks join
            # every decode step's key list; random question queries, the engine's op over the whole context
            gen = torch.Generator(device=device).manual_seed(args.seed + 11)
            question_q = torch.randn(cfg.question_tokens, *q.shape[1:], generator=gen, device=device, dtype=q.dtype)
            cs = cfg.chunk_sizes[-1]

            def select():
                return question_chunks(question_q, ctx.cache.flat_k(LAYER), ctx.page_table, ctx.cache.page_size,
                                       cfg.sink_tokens, T - cfg.stream_tokens, cfg.question_keep_tokens // cs, cs,
                                       cfg.question_window, cfg.stream_tokens, rope, "triton" if q.is_cuda else "reference")

            select()  # compiles
            res["question_selection_ms"] = timer.once(select)
            state.question[LAYER] = select()
        method.decode(LAYER, q, [seq], batch)  # step 0: fills every stage's cache (and compiles)
        blocks = query_blocks(q, seq.start_pos, 1)
        outs = []
        for i, spec in enumerate(specs):
            outs.append(method._stage(spec, blocks, outs[i - 1] if i else None, LAYER, seq, batch))

        res["stages"] = []
        for i, spec in enumerate(specs):
            prev = outs[i - 1] if i else None
            res["stages"].append(timer(lambda spec=spec, prev=prev: method._stage(spec, blocks, prev, LAYER, seq, batch)))

        def cached_step():  # no stage refreshes (every interval > 1): key list + BSA only
            state.decode_steps[LAYER] = 1
            return method.decode(LAYER, q, [seq], batch)

        def ar_step():  # every stage refreshes (step 0)
            state.decode_steps[LAYER] = 0
            return method.decode(LAYER, q, [seq], batch)

        res["bsa"] = timer(cached_step)
        res["ar"] = timer(ar_step)
        stage_ms = [s["ms"] for s in res["stages"]]
        res["bsa_us"] = res["bsa"]["ms"] * 1e3
        res["ar_us"] = res["ar"]["ms"] * 1e3
        res["other_ar_us"] = (res["ar"]["ms"] - sum(stage_ms) - res["bsa"]["ms"]) * 1e3
        res["amortized_formula_us"] = (sum(ms / r for ms, r in zip(stage_ms, intervals)) + res["bsa"]["ms"]) * 1e3
        if any(r == 1 for r in intervals):
            res["note"] = "a stage with refresh interval 1 refreshes in the 'BSA' (cached) path too"

        # Amortized end-to-end: the real mask-cache path from a fresh state.
        n_steps = args.e2e_steps or args.e2e_cycles * max(intervals)
        e2e_state = method.new_state()
        e2e_seq = SequenceSlice(0, 0, 1, T - 1, T - 1, ctx.page_table, ctx.cache, e2e_state, False)
        e2e_batch = ForwardBatch([e2e_seq], ctx.cache, rope, 1)
        e2e_state.question[LAYER] = state.question[LAYER]
        gen = torch.Generator(device=device).manual_seed(args.seed + 7)
        qs = torch.randn(n_steps, *q.shape, generator=gen, device=device, dtype=q.dtype)
        step_ms = [timer.once(lambda i=i: method.decode(LAYER, qs[i], [e2e_seq], e2e_batch)) for i in range(n_steps)]
        res["e2e_steps"] = n_steps
        res["e2e_refreshes"] = list(e2e_state.refreshes)
        res["amortized_e2e_us"] = statistics.fmean(step_ms) * 1e3
        res["e2e_step_us_median"] = statistics.median(step_ms) * 1e3
        res["e2e_step_us_max"] = max(step_ms) * 1e3

        # The engine's decode step itself (what GraphDecoder replays per layer): one CUDA graph per refresh
        # pattern of the preset, timed by replay and averaged over one refresh cycle.
        if device.type == "cuda" and not args.no_graphs:
            res.update(engine_graph_decode(method, state, seq, batch, q, intervals, timer, errors, f"T={T} {preset}"))

        # GPU-only: device work captured in CUDA graphs (no eager overhead).
        if device.type == "cuda" and not args.no_graphs:
            kernels = []
            for i, spec in enumerate(specs):
                fn = stage_device_fn(method, spec, blocks, outs[i - 1] if i else None, seq, batch)
                kernels.append(try_graph(timer, fn, f"T={T} {preset} stage {i + 1}", errors))
            with record_calls(method_module, "sparse_attention_decode") as (calls, kernel):
                cached_step()
            a, kw = calls[0]
            bsa_kernel = try_graph(timer, lambda: kernel(*a, **kw), f"T={T} {preset} BSA kernel", errors)
            res["stage_kernels"] = kernels
            res["bsa_kernel"] = bsa_kernel
            if bsa_kernel is not None and all(k is not None for k in kernels):
                res["gpu_only_amortized_us"] = (sum(k["ms"] / r for k, r in zip(kernels, intervals)) + bsa_kernel["ms"]) * 1e3
                res["gpu_only_ar_us"] = (sum(k["ms"] for k in kernels) + bsa_kernel["ms"]) * 1e3
    return res


# ---- reporting -------------------------------------------------------------------------------------------
def fmt(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fx(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def print_context_tables(T: int, C: int, dense: dict, ours_p: dict | None, ours_d: dict[str, dict]) -> None:
    log(f"\n### T = {T:,} tokens\n")
    if ours_p is not None or "prefill_ms" in dense:
        log(f"Prefill: the last {C:,}-query chunk (positions {T - C:,}..{T - 1:,}), ms\n")
        log("| component | ms | share of ours |\n| --- | ---: | ---: |")
        if "prefill_ms" in dense:
            log(f"| dense {DENSE}: {C:,} q x {T - C:,} prefix keys, non-causal | {fmt(dense['prefill_prefix']['ms'], 2)} | |")
            log(f"| dense {DENSE}: {C:,} x {C:,} causal square | {fmt(dense['prefill_square']['ms'], 2)} | |")
            log(f"| **dense total** | **{fmt(dense['prefill_ms'], 2)}** | |")
        if ours_p is not None:
            tot = ours_p["prefill_ms"]
            for i, (s, spec) in enumerate(zip(ours_p["stages"], ours_p["specs"])):
                log(f"| ours stage {i + 1} (b_q={spec['query_block_size']}, l_c={spec['chunk_size']}, "
                    f"k={spec['keep_tokens']}) | {fmt(s['ms'], 2)} | {s['ms'] / tot:.1%} |")
            log(f"| ours BSA (key lists + positions + kernel; {ours_p['keys_per_block_mean']:.0f} keys/block mean) "
                f"| {fmt(ours_p['bsa']['ms'], 2)} | {ours_p['bsa']['ms'] / tot:.1%} |")
            log(f"| &nbsp;&nbsp;of which BSA kernel | {fmt(ours_p['bsa_kernel']['ms'], 2)} | {ours_p['bsa_kernel']['ms'] / tot:.1%} |")
            log(f"| ours sum of parts | {fmt(ours_p['sum_of_parts_ms'], 2)} | |")
            log(f"| **ours total (InfiniteHiPAttention.prefill)** ({ours_p['preset']}) | **{fmt(tot, 2)}** | |")
            if "prefill_ms" in dense:
                log(f"| speedup dense / ours | {fx(ratio(dense['prefill_ms'], tot))} | |")
    if ours_d or "decode_us" in dense:
        presets = list(ours_d)
        log(f"\nDecode: 1 query at position {T - 1:,} over {T:,} keys, us\n")
        log("| component | " + " | ".join(presets or ["-"]) + " |")
        log("| --- |" + " ---: |" * max(1, len(presets)))

        def row(name: str, get) -> None:
            vals = []
            for p in presets or ["-"]:
                try:
                    vals.append(get(ours_d[p]) if presets else get(None))
                except (KeyError, TypeError, IndexError):
                    vals.append("n/a")
            log(f"| {name} | " + " | ".join(vals) + " |")

        if presets:
            row("refresh intervals", lambda r: "/".join(map(str, r["refresh_intervals"])))
        if "decode_us" in dense:
            row(f"dense {DENSE} ({dense['decode_kv_GBps']:.0f} GB/s KV read)", lambda r: fmt(dense["decode_us"]))
        if presets:
            n = len(next(iter(ours_d.values()))["stages"])
            for i in range(n):
                row(f"stage {i + 1} (one refresh)", lambda r, i=i: fmt(r["stages"][i]["ms"] * 1e3))
            row("BSA (decode with all stages cached)", lambda r: fmt(r["bsa_us"]))
            row("**AR total** (every stage refreshed)", lambda r: f"**{fmt(r['ar_us'])}**")
            row("&nbsp;&nbsp;other (AR - stages - BSA)", lambda r: fmt(r["other_ar_us"]))
            row("amortized, formula (sum stage_i/r_i + BSA)", lambda r: fmt(r["amortized_formula_us"]))
            row("**amortized, end-to-end** (mean over steps)", lambda r: f"**{fmt(r['amortized_e2e_us'])}** ({r['e2e_steps']} steps)")
            row("&nbsp;&nbsp;e2e stage refreshes", lambda r: "/".join(map(str, r["e2e_refreshes"])))
            if any("engine_graph_amortized_us" in r for r in ours_d.values()):
                row("**engine decode step, CUDA graph, amortized**", lambda r: f"**{fmt(r.get('engine_graph_amortized_us'))}**")
                row("engine decode step, CUDA graph, AR", lambda r: fmt(r.get("engine_graph_ar_us")))
            if any("stage_kernels" in r for r in ours_d.values()):
                for i in range(n):
                    row(f"GPU-only stage {i + 1} (CUDA graph)", lambda r, i=i: fmt(r["stage_kernels"][i]["ms"] * 1e3))
                row("GPU-only BSA kernel (CUDA graph)", lambda r: fmt(r["bsa_kernel"]["ms"] * 1e3))
                row("GPU-only AR", lambda r: fmt(r.get("gpu_only_ar_us")))
                row("**GPU-only amortized**", lambda r: f"**{fmt(r.get('gpu_only_amortized_us'))}**")
            if "decode_us" in dense:
                d = dense["decode_us"]
                row("speedup vs dense: e2e amortized", lambda r: f"{fx(ratio(d, r['amortized_e2e_us']))}")
                row("speedup vs dense: AR", lambda r: f"{fx(ratio(d, r['ar_us']))}")
                row("**speedup vs dense: engine graph amortized**", lambda r: f"**{fx(ratio(d, r.get('engine_graph_amortized_us')))}**")
                row("speedup vs dense: engine graph AR", lambda r: f"{fx(ratio(d, r.get('engine_graph_ar_us')))}")
                if any("gpu_only_amortized_us" in r for r in ours_d.values()):
                    row("speedup vs dense: GPU-only amortized", lambda r: f"{fx(ratio(d, r.get('gpu_only_amortized_us')))}")


def summarize(results: list[dict], fast: str, targets: tuple[float, float]) -> None:
    log("\n## Summary\n")
    log(f"| T | dense prefill ms | ours prefill ms | speedup | dense decode us | ours decode ({fast} amortized eager) us "
        f"| speedup | ours decode ({fast}, engine CUDA graph, amortized) us | speedup | engine graph AR us | speedup |")
    log("| ---: |" + " ---: |" * 10)
    for r in results:
        d, p, dec = r.get("dense", {}), r.get("ours_prefill"), r.get("ours_decode", {}).get(fast)
        dp, op = d.get("prefill_ms"), p["prefill_ms"] if p else None
        dd = d.get("decode_us")
        oe = dec["amortized_e2e_us"] if dec else None
        og = dec.get("engine_graph_amortized_us") if dec else None
        oar = dec.get("engine_graph_ar_us") if dec else None
        log(f"| {r['T']:,} | {fmt(dp, 2)} | {fmt(op, 2)} | {fx(ratio(dp, op))} | {fmt(dd)} | {fmt(oe)} | "
            f"{fx(ratio(dd, oe))} | {fmt(og)} | {fx(ratio(dd, og))} | {fmt(oar)} | {fx(ratio(dd, oar))} |")
    log(f"\nours prefill = one InfiniteHiPAttention.prefill call; dense prefill = {DENSE} prefix (non-causal) + causal "
        "square, summed. Decode 'amortized e2e' and 'AR' run the method's eager code (Python glue, host syncs, "
        "kernel launches); 'engine CUDA graph' = the same InfiniteHiPAttention.decode captured once per refresh "
        "pattern and replayed (what the engine's GraphDecoder runs), amortized over a refresh cycle.")
    last = results[-1] if results else None
    if last is None:
        return
    d, p, dec = last.get("dense", {}), last.get("ours_prefill"), last.get("ours_decode", {}).get(fast)
    dec_target, pre_target = targets
    log(f"\nTargets at T = {last['T']:,} (paper: 1M):")
    sp = ratio(d.get("prefill_ms"), p["prefill_ms"] if p else None)
    if sp is not None:
        log(f"- prefill speedup >= {pre_target:g}x: {sp:.2f}x -> {'MET' if sp >= pre_target else 'NOT met'}")
    if dec is not None and d.get("decode_us"):
        se = ratio(d["decode_us"], dec["amortized_e2e_us"])
        log(f"- decode speedup >= {dec_target:g}x ({fast}, amortized end-to-end, eager method code): {se:.2f}x -> "
            f"{'MET' if se >= dec_target else 'NOT met'}")
        sg = ratio(d["decode_us"], dec.get("engine_graph_amortized_us"))
        if sg is not None:
            log(f"- decode speedup >= {dec_target:g}x ({fast}, engine decode step replayed from CUDA graphs, amortized): "
                f"{sg:.2f}x -> {'MET' if sg >= dec_target else 'NOT met'}")


# ---- main -------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[131072, 262144, 524288, 1048576])
    parser.add_argument("--chunk", type=int, default=32768, help="prefill chunk (queries) at the end of the context")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--impl", default=None, choices=["triton", "reference"], help="default: triton on cuda, reference on cpu")
    parser.add_argument("--presets", nargs="+", default=["3k", "3k-fast", "3k-flash"])
    parser.add_argument("--prefill-preset", default="3k")
    parser.add_argument("--fast-preset", default="3k-fast", help="preset used in the summary / decode target")
    parser.add_argument("--layer-type", choices=["late", "early"], default="late")
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--shuffle-pages", action="store_true", help="random page table instead of the identity")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--min-reps", type=int, default=None)
    parser.add_argument("--max-reps", type=int, default=None)
    parser.add_argument("--budget-s", type=float, default=None, help="time budget per measurement")
    parser.add_argument("--e2e-steps", type=int, default=None, help="decode steps of the e2e loop (default: cycles x max interval)")
    parser.add_argument("--e2e-cycles", type=int, default=None, help="refresh cycles of the e2e loop (default 2 on cuda, 1 on cpu)")
    parser.add_argument("--heads", type=int, default=None, help="query heads (default 32 on cuda, 8 on cpu)")
    parser.add_argument("--kv-heads", type=int, default=None, help="kv heads (default 8 on cuda, 2 on cpu)")
    parser.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph (GPU-only) measurements")
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--decode-target", type=float, default=20.0)
    parser.add_argument("--prefill-target", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="write every number to this JSON file")
    args = parser.parse_args()

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("CUDA is not available; use --device cpu --contexts 16384 --impl reference --chunk 4096")
    dtype = DTYPES[args.dtype or ("bfloat16" if cuda else "float32")]
    args.impl = args.impl or ("triton" if cuda else "reference")
    warmup = args.warmup if args.warmup is not None else (2 if cuda else -1)  # -1: auto (see Timer)
    min_reps = args.min_reps or (5 if cuda else 1)
    max_reps = args.max_reps or (50 if cuda else 1)
    args.e2e_cycles = args.e2e_cycles or (2 if cuda else 1)
    global MC, DENSE
    DENSE = "SDPA-flash" if cuda else "SDPA (cpu)"
    MC = dataclasses.replace(LLAMA3_8B_LAYER, num_heads=args.heads or (32 if cuda else 8),
                             num_kv_heads=args.kv_heads or (8 if cuda else 2))
    budget = args.budget_s if args.budget_s is not None else (1.0 if cuda else 0.5)
    for p in args.presets + [args.prefill_preset]:
        if p not in PRESETS:
            sys.exit(f"unknown preset {p!r}; available: {', '.join(PRESETS)}")
    contexts = sorted(args.contexts)
    if not args.skip_prefill and min(contexts) < args.chunk:
        sys.exit(f"every context must hold the prefill chunk ({args.chunk}); got {min(contexts)}")

    torch.manual_seed(args.seed)
    mc = MC
    timer = Timer(device, warmup, min_reps, max_reps, budget)
    rope = RotaryEmbedding(mc, max(contexts) + 1, device)
    header = {
        "device": torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine()),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__ if cuda else None,
        "dtype": str(dtype).removeprefix("torch."),
        "impl": args.impl,
        "shapes": {"num_heads": mc.num_heads, "num_kv_heads": mc.num_kv_heads, "head_dim": mc.head_dim},
        "args": vars(args),
        "timing": {"warmup": warmup, "min_reps": min_reps, "max_reps": max_reps, "budget_s": budget,
                   "l2_flush": cuda, "stat": "median (e2e decode: mean over steps)"},
    }
    log(f"# Attention latency: InfiniteHiP vs dense (one Llama-3-8B-style layer: {mc.num_heads} q heads, "
        f"{mc.num_kv_heads} kv heads, d={mc.head_dim}, {header['dtype']})\n")
    log(f"device {header['device']}, torch {torch.__version__}, impl {args.impl}, page size {args.page_size} "
        f"({'shuffled' if args.shuffle_pages else 'identity'} page table), {args.layer_type} layer, "
        f"prefill chunk {args.chunk}")
    if not cuda:
        log("CPU mode: functional check only; timings on a shared CPU are meaningless. Dense uses the default SDPA "
            "backend (no flash forcing), no CUDA graphs, 1 rep, and by default 8/2 heads instead of 32/8 "
            "(same GQA group, same code path) so that it runs in about a minute.")

    results, errors = [], []
    out = {"header": header, "results": results, "errors": errors}

    def dump() -> None:
        if args.output:
            with open(args.output, "w") as f:
                json.dump(out, f, indent=1, default=str)

    for T in contexts:
        t0 = time.perf_counter()
        ctx = build_context(T, args, device, dtype, rope)
        gen = torch.Generator(device=device).manual_seed(args.seed + T)
        q_prefill = None if args.skip_prefill else torch.randn(args.chunk, mc.num_heads, mc.head_dim, generator=gen,
                                                                device=device, dtype=dtype)
        q_decode = torch.randn(1, mc.num_heads, mc.head_dim, generator=gen, device=device, dtype=dtype)
        r: dict = {"T": T, "chunk": args.chunk}

        def attempt(what: str, fn: Callable[[], Any]) -> Any:
            """Run one part; a failure is reported and recorded, and the run goes on with the next part."""
            try:
                return fn()
            except Exception as e:  # noqa: BLE001
                errors.append(f"T={T} {what}: {type(e).__name__}: {e}")
                log(f"\n[T={T} {what} FAILED]\n{traceback.format_exc()}")
                with contextlib.suppress(Exception):
                    torch.cuda.synchronize() if cuda else None
                return None

        if not args.skip_dense:
            r["dense"] = attempt("dense", lambda: bench_dense(ctx, q_prefill, q_decode, args, timer, rope, device)) or {}
            ctx.k_dense = ctx.v_dense = None  # free before ours runs
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        r["ours_prefill"] = None if args.skip_prefill else attempt(
            "ours prefill", lambda: bench_ours_prefill(ctx, q_prefill, args, timer, rope))
        r["ours_decode"] = {}
        if not args.skip_decode:
            for preset in args.presets:
                d = attempt(f"ours decode {preset}",
                            lambda: bench_ours_decode(ctx, preset, q_decode, args, timer, rope, device, errors))
                if d is not None:
                    r["ours_decode"][preset] = d
        r["wall_s"] = time.perf_counter() - t0
        results.append(r)
        print_context_tables(T, args.chunk, r.get("dense", {}), r["ours_prefill"], r["ours_decode"])
        log(f"\n(T = {T:,}: {r['wall_s']:.1f} s wall)")
        dump()
        ctx = q_prefill = q_decode = None  # free before the next length
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()

    summarize(results, args.fast_preset, (args.decode_target, args.prefill_target))
    if errors:
        log("\nErrors:\n" + "\n".join(f"- {e}" for e in errors))
    dump()
    if args.output:
        log(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()

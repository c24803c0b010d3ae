"""The measured pieces of the attention-latency and hip-attn suites: one layer's paged KV cache of T random tokens
(build_context), the dense SDPA baseline (bench_dense), and InfiniteHiP's prefill and decode by their parts
(bench_ours_prefill, bench_ours_decode); attention_latency.py says what each measures.

MC and DENSE are set by the suite before a run (the layer's shape, the dense backend's label)."""

from __future__ import annotations

import dataclasses
import math
import statistics

import torch

from bench.common.dense import backend_ctx, sdpa
from bench.common.instrument import record_calls
from bench.common.timing import Timer, try_graph
from infinitehip.attention.base import ForwardBatch, SequenceSlice
from infinitehip.attention.methods.infinitehip import method as method_module
from infinitehip.attention.methods.infinitehip.config import PRESETS, InfiniteHiPConfig
from infinitehip.attention.methods.infinitehip.method import InfiniteHiPAttention
from infinitehip.attention.methods.infinitehip.positions import scoring_positions
from infinitehip.attention.methods.infinitehip.pruning import (
    host_limit, initial_chunks, query_blocks, sparse_limit, subdivide,
)
from infinitehip.attention.methods.infinitehip.scoring.op import chunk_scores, representative_scores
from infinitehip.attention.common.question_selection import question_chunks
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
        if method.saliency is not None:  # the chunk's landmark saliency update alone, and in its CPU formulation
            def update(impl: str):
                return lambda: method.saliency.update(LAYER, q, seq.start_pos, seq.page_table, seq.cache, rope,
                                                      impl=impl)

            res["saliency"] = timer(update(method._impl(q)))
            res["saliency_cpu_formulation"] = timer(update("cpu"))
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
        starts0, lens0 = initial_chunks(limit, c.sink_tokens, spec.chunk_size,
                                        host_limit(blocks.last, c.sink_tokens, c.stream_tokens))
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

"""Validation mode of KV offloading (issue 4 item 5): the engine with the KV in a host store behind small GPU
banks must produce exactly the resident engine's logits and greedy tokens, prefill and decode, with banks
small enough that every step evicts and misses; the bank statistics must add up; requests and configurations
that cannot run offloaded are refused (before anything is allocated) with errors naming the setting."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from infinitehip import SamplingParams
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.attention.methods.infinitehip.graph_hooks import PrunedStepKey
from infinitehip.attention.methods.infinitehip.offload_access import check_offload
from infinitehip.config.offload import OffloadConfig
from infinitehip.kv.offload import planner
from infinitehip.kv.offload.paged import OffloadedAccessError, OffloadedPagedCache
from infinitehip.kv.offload.planner import CapacityError
from infinitehip.kv.offload.store import to_storage_dtype
from infinitehip.kv.paged_cache import PagedKVCache
from tests.conftest import closure_graph_decoder, engine_for_dir, random_ids, record_step_logits
from tests.attention.test_infinitehip_method import SMALL

HEADS = 4  # query heads of the tiny models (tests/conftest.py)
CONTEXT = 800  # max_context_tokens: the banks are sized to the worst case of one resolve call at this context
# A mask bank of 5 chunks' representatives (stages still scored in several groups of chunks) for the tests whose
# subject is not the mask bank: with the smallest one (1 chunk) the offloaded prefill alone scores ~6,000 groups
# of one chunk, each its own resolve call (~10 s per run of 700 tokens); the misses tests keep the smallest one.
FEW_GROUPS = 5 * HEADS


def _smallest_banks(config: InfiniteHiPConfig, num_heads: int, seqs: int = 1, context: int = CONTEXT,
                    mask_bank: int | None = None, stage_prefill: bool = False) -> OffloadConfig:
    """The smallest banks check_offload accepts (the mask bank: one chunk's representatives), or mask_bank.
    Prefill through the banks unless stage_prefill (the default of OffloadConfig, tested on its own below), so
    these tests keep covering the banks' prefill path."""
    need = check_offload(config, OffloadConfig(mask_bank_tokens=1 << 30, attention_bank_tokens=1 << 30), context,
                         num_heads, seqs)
    return OffloadConfig(offload_enabled=True, mask_bank_tokens=mask_bank or need.mask_tokens,
                         attention_bank_tokens=need.attention_tokens, stage_prefill=stage_prefill)


def _count_decode_groups(monkeypatch):
    """Per decode stage refresh: (candidate chunks N, chunks per group G); the mask-bank resolve calls' distinct slots."""
    from infinitehip.attention.methods.infinitehip import offload_access

    groups, inner = [], offload_access.RepresentativeKeys.score_in_fixed_groups

    def spy(self, reps, lens, chunk_size, score):
        groups.append((reps.shape[1], self.chunks_per_group(chunk_size, reps.shape[2])))
        return inner(self, reps, lens, chunk_size, score)

    monkeypatch.setattr(offload_access.RepresentativeKeys, "score_in_fixed_groups", spy)
    return groups


def _generate(path, config, offload, prompts, steps, method="infinitehip", graphs=False, on_engine=None,
              arrivals=None, **kw):
    """Greedy decode (arrivals: the engine step at which each prompt arrives, default all at once); -> (outputs,
    logits per step, bank stats after each step, engine)."""
    engine = engine_for_dir(path, None, config, offload, method=method, max_context_tokens=CONTEXT,
                            prefill_chunk_size=kw.pop("prefill_chunk_size", 128), max_num_seqs=len(prompts), **kw)
    if on_engine is not None:
        on_engine(engine)
    if graphs:
        closure_graph_decoder(engine)
    logits, stats = record_step_logits(engine), []
    arrivals, seqs, step = arrivals or [0] * len(prompts), {}, 0
    steps = steps if isinstance(steps, list) else [steps] * len(prompts)  # tokens to decode, per prompt
    while len(seqs) < len(prompts) or engine.has_work:
        for i, p in enumerate(prompts):
            if arrivals[i] == step:
                seqs[i] = engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=steps[i], ignore_eos=True))
        if engine.has_work:
            engine.step()
            stats.append(engine.kv_stats())
        step += 1
    return [seqs[i].output_ids for i in range(len(prompts))], logits, stats, engine


def _assert_same(a, b):
    assert a[0] == b[0]
    assert len(a[1]) == len(b[1])
    for x, y in zip(a[1], b[1]):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def _count_requests(engine, per_call=False):
    """Distinct valid slots each resolve call of the engine's offloaded KV requests, summed per (bank, layer)
    (per_call: listed per call)."""
    kv, counts = engine.cache.kv, {}
    for name in ("mask", "attention"):
        inner = getattr(kv, f"resolve_{name}")

        def spy(layer, slots, inner=inner, name=name):
            valid = slots.reshape(-1)
            n = int(valid[valid >= 0].unique().numel())
            if per_call:
                counts.setdefault((name, layer), []).append(n)
            else:
                counts[name, layer] = counts.get((name, layer), 0) + n
            return inner(layer, slots)

        setattr(kv, f"resolve_{name}", spy)
    return counts


# Each refresh pattern and each group size once: (6, 3, 2) with groups of 1 chunk, the third combination, added
# nothing the other two do not check (~7 s).
@pytest.mark.parametrize("refresh,mask_bank", [((4, 2, 1), None), ((6, 3, 2), 20)])
def test_offloaded_engine_equals_resident_with_misses_every_step(tiny_llama_dir, monkeypatch, refresh, mask_bank):
    """Mask bank of one chunk's representatives (4 tokens: 4 heads) or of 5 chunks' (20), far below a stage's
    (stage 0: 11 chunks of 64 x 4 heads, stages 1-2: 32 x 4): every refreshed decode stage runs in several groups
    (of 1 or 5 chunks, the last one shorter), and the top chunks over all groups equal the resident ones."""
    config = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": refresh})
    prompt, steps = random_ids(700, seed=21), 16
    resident = _generate(tiny_llama_dir, config, None, [prompt], steps)
    offload = _smallest_banks(config, HEADS, mask_bank=mask_bank)
    assert offload.mask_bank_tokens == (mask_bank or HEADS)
    groups = _count_decode_groups(monkeypatch)
    counts = []  # the engine's distinct slots per resolve call
    ours = _generate(tiny_llama_dir, config, offload, [prompt], steps,
                     on_engine=lambda engine: counts.append(_count_requests(engine, per_call=True)))
    _assert_same(ours, resident)
    G = offload.mask_bank_tokens // HEADS
    assert groups and all(g == G for _, g in groups)
    assert {n for n, _ in groups} == {11, 32} and all(-(-n // G) > 1 for n, _ in groups)  # several groups per stage
    assert 0 < max(max(v) for (name, _), v in counts[0].items() if name == "mask") <= offload.mask_bank_tokens
    assert resident[2][-1] is None
    engine = ours[3]
    assert isinstance(engine.cache, OffloadedPagedCache) and engine.kv_plan is not None
    stats = [(s["mask"], s["attention"]) for s in ours[2]]
    mask, attention = stats[-1]
    for bank in (mask, attention):
        assert bank.total_hits > 0 and bank.total_misses > 0 and not any(bank.overflows)
    # Far more rows went through each bank than it holds: rows were evicted and read again.
    assert mask.total_misses > 2 * offload.mask_bank_tokens and attention.total_misses > 2 * offload.attention_bank_tokens
    # Every decode step (after the prompt: the last `steps - 1` entries, decode steps 0, 1, ...) that refreshes a
    # stage misses and hits in the attention bank; the others resolve nothing: they reuse the rows the last
    # refresh resolved, plus the new token's (decode_rows.py).
    grew = [(after[1].total_misses > before[1].total_misses, after[1].total_hits > before[1].total_hits)
            for before, after in zip(stats[-steps:-1], stats[-steps + 1:])]
    refreshes = [any(step % r == 0 for r in refresh) for step in range(len(grew))]
    assert grew == [(r, r) for r in refreshes] and all(refreshes) == (min(refresh) == 1)


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_store_equals_a_resident_engine_whose_kv_is_rounded_to_fp8(tiny_llama_dir, monkeypatch, kv_dtype):
    """An FP8 host store behind model-dtype banks (misses upcast in the copy) reads exactly what a resident cache
    holding FP8-rounded K/V would: same logits, same tokens, with misses every step."""
    config = InfiniteHiPConfig(**SMALL)
    prompt, steps = random_ids(700, seed=23), 8
    fp8 = OffloadConfig(kv_dtype=kv_dtype).torch_kv_dtype(torch.float32)
    write = PagedKVCache.write

    def rounded_write(self, layer, slots, k, v):
        write(self, layer, slots, to_storage_dtype(k, fp8).to(k.dtype), to_storage_dtype(v, fp8).to(v.dtype))

    monkeypatch.setattr(PagedKVCache, "write", rounded_write)
    resident = _generate(tiny_llama_dir, config, None, [prompt], steps)
    monkeypatch.undo()
    exact = _generate(tiny_llama_dir, config, None, [prompt], steps)
    assert any(not torch.equal(x, y) for x, y in zip(resident[1], exact[1]))  # the rounding is visible
    offload = dataclasses.replace(_smallest_banks(config, HEADS, mask_bank=FEW_GROUPS), kv_dtype=kv_dtype)
    ours = _generate(tiny_llama_dir, config, offload, [prompt], steps)
    assert ours[3].cache.kv.store.dtype == fp8 and ours[3].cache.kv.dtype == torch.float32
    _assert_same(ours, resident)
    assert ours[2][-1]["attention"].total_misses > 2 * offload.attention_bank_tokens
    assert ours[3].kv_plan.summary.endswith(", FP8 " + kv_dtype.split("_")[1])


def test_store_layers_the_planner_spills_give_the_resident_output(tiny_llama_dir, monkeypatch):
    """A host budget for half the layers: the planner puts the other half of the store in device memory (on CPU
    spilling is off in the engine, since both budgets are the same memory: forced on here, with a large device
    budget), the cache is built that way, and the output is still the resident one."""
    config = InfiniteHiPConfig(**SMALL)
    prompt, steps = random_ids(700, seed=27), 6
    resident = _generate(tiny_llama_dir, config, None, [prompt], steps)
    offload = dataclasses.replace(_smallest_banks(config, HEADS, mask_bank=FEW_GROUPS), host_memory_fraction=1.0)
    probe = engine_for_dir(tiny_llama_dir, None, config, offload, method="infinitehip", max_context_tokens=CONTEXT,
                           prefill_chunk_size=128, max_num_seqs=1)  # _generate's engine: its plan and cache
    layers, tokens = probe.kv_plan.num_layers, probe.cache.num_slots
    host = (layers // 2) * tokens * probe.kv_plan.layer_bytes_per_token
    plan_capacity = planner.plan_capacity
    monkeypatch.setattr(planner, "host_available_bytes", lambda: host)
    # (args 5, 6: gpu_free, host_available; on CPU the engine passes host memory as both)
    monkeypatch.setattr(planner, "plan_capacity",
                        lambda *a, **kw: plan_capacity(*a[:5], 1 << 40, *a[6:], **{**kw, "spill": True}))
    ours = _generate(tiny_llama_dir, config, offload, [prompt], steps)
    store = ours[3].cache.kv.store
    assert store.device_layers == layers - layers // 2 > 0
    assert ours[3].kv_plan.store_device_layers(tokens) == store.device_layers
    # the planner counted the method's landmark saliency (H query heads + a count, fp32, per slot and layer)
    assert ours[3].kv_plan.gpu_bytes_per_token == 2 * layers * 4 + layers * (HEADS + 1) * 4
    assert ours[3].kv_plan.layout(tokens).startswith(f"KV store: {tokens:,} tokens: {layers // 2} layers in host "
                                                     f"memory (0.0 GiB), {store.device_layers} in GPU memory")
    _assert_same(ours, resident)


def test_bank_statistics_count_every_distinct_requested_slot(tiny_llama_dir):
    config = InfiniteHiPConfig(**SMALL)
    offload = _smallest_banks(config, HEADS, mask_bank=FEW_GROUPS)
    engine = engine_for_dir(tiny_llama_dir, None, config, offload, method="infinitehip", max_context_tokens=CONTEXT,
                            prefill_chunk_size=128, max_num_seqs=1)
    counts = _count_requests(engine)
    engine.add_request(random_ids(650, seed=22), SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    while engine.has_work:
        engine.step()
    stats = engine.kv_stats()
    for name in ("mask", "attention"):
        for layer in range(engine.model_config.num_layers):
            got = stats[name].hits[layer] + stats[name].misses[layer]
            assert got == counts[name, layer] > 0, (name, layer)
    engine.cache.reset_stats()
    assert engine.kv_stats()["attention"].total_misses == 0


def test_offloaded_batched_decode_equals_resident(tiny_llama_dir):
    """Two sequences decoding together: one attention-bank call serves both key lists (banks sized for two)."""
    config = InfiniteHiPConfig(**SMALL)
    prompts = [random_ids(700, seed=23), random_ids(300, seed=24)]
    resident = _generate(tiny_llama_dir, config, None, prompts, 6)
    ours = _generate(tiny_llama_dir, config, _smallest_banks(config, HEADS, seqs=2, mask_bank=FEW_GROUPS), prompts, 6)
    _assert_same(ours, resident)
    assert not any(ours[2][-1]["attention"].overflows)


@pytest.mark.parametrize("one_graph", [False, True])
def test_an_offloaded_batch_decodes_from_one_graph_only_when_asked(tiny_llama_dir, one_graph):
    """OffloadConfig.batch_decode_graph: two offloaded sequences in different refresh phases replay one graph of both
    (else each one's graph in turn, with the bank rows a sequence alone keeps) and decode the resident tokens and
    logits either way (each refreshing by its own phase: a graph keyed by the union of their patterns would not)."""
    config = InfiniteHiPConfig(**SMALL)
    # the first decodes alone, beside the second in different refresh phases, then alone again
    prompts, steps = [random_ids(700, seed=23), random_ids(520, seed=24)], [30, 10]
    room = dict(kv_cache_tokens=2 * CONTEXT, arrivals=[0, 7])
    resident = _generate(tiny_llama_dir, config, None, prompts, steps, **room)
    offload = dataclasses.replace(_smallest_banks(config, HEADS, seqs=2, mask_bank=FEW_GROUPS),
                                  batch_decode_graph=one_graph)
    ours = _generate(tiny_llama_dir, config, offload, prompts, steps, graphs=True, **room)
    _assert_same(ours, resident)
    decoder = ours[3].runner.graph_decoder
    assert decoder.replays > 0 and (decoder.batch_replays > 0) == one_graph
    assert not any(ours[2][-1]["attention"].overflows)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
def test_an_offloaded_batch_from_one_real_cuda_graph_decodes_the_resident_tokens(tiny_llama_dir):
    """Real CUDA graphs (a replay runs no Python: the banks' holders are what `after_batch_replay` leaves): the first
    sequence decodes alone (keeping its bank rows), then beside the second in one graph, then alone again, where it
    must resolve its list anew; the greedy tokens of the resident engine."""
    config = InfiniteHiPConfig(**SMALL)
    prompts, steps = [random_ids(700, seed=23), random_ids(520, seed=24)], [40, 12]
    room = dict(kv_cache_tokens=2 * CONTEXT, arrivals=[0, 7], device="cuda")
    resident = _generate(tiny_llama_dir, config, None, prompts, steps, cuda_graphs=False, **room)
    offload = dataclasses.replace(_smallest_banks(config, HEADS, seqs=2, mask_bank=FEW_GROUPS), batch_decode_graph=True)
    ours = _generate(tiny_llama_dir, config, offload, prompts, steps, cuda_graphs=True, **room)
    assert ours[0] == resident[0]
    decoder = ours[3].runner.graph_decoder
    assert decoder.batch_replays > 0 and decoder.replays > decoder.batch_replays + 10


def test_an_offloaded_batch_replay_leaves_no_bank_held(tiny_llama_dir):
    """A replay runs no Python, so the resolves of an offloaded batch's graph (every key list; the representatives
    where any sequence refreshed) reset no holder: `after_batch_replay` does, or a sequence decoding alone next
    would read the rows it kept before the batch moved them."""
    engine = engine_for_dir(tiny_llama_dir, None, InfiniteHiPConfig(**SMALL),
                            _smallest_banks(InfiniteHiPConfig(**SMALL), HEADS, seqs=2), method="infinitehip",
                            max_context_tokens=CONTEXT, max_num_seqs=2)
    kv, seqs = engine.cache.kv, [SimpleNamespace(cache=engine.cache)] * 2
    quiet = PrunedStepKey((False, False, False), 0, kept=True, masks=True, offloaded=True)
    refreshing = PrunedStepKey((False, False, True), 0, kept=False, masks=False, offloaded=True)
    for keys, masks_released in (([quiet, quiet], False), ([quiet, refreshing], True)):
        kv.hold_attention("alone")
        for layer in range(len(kv.mask_holders)):
            kv.hold_mask(layer, "alone")
        engine.method.after_batch_replay(seqs, keys)
        assert not kv.holds_attention("alone")
        assert all(kv.holds_mask(layer, "alone") != masks_released for layer in range(len(kv.mask_holders)))


def test_offloaded_question_time_selection_equals_resident(tiny_llama_dir, monkeypatch):
    """Question-time selection scans the offloaded store (not the banks) and gives the resident tokens and logits;
    the question's chunks join every decode step's key list inside the smallest attention bank check_offload
    accepts."""
    from infinitehip.kv.offload.paged import OffloadedPagedCache as Cache

    config = InfiniteHiPConfig(**{**SMALL, "question_tokens": 24, "question_keep_tokens": 32, "question_window": 3})
    prompt, steps = random_ids(700, seed=25), 8
    resident = _generate(tiny_llama_dir, config, None, [prompt], steps)
    scans, inner = [], Cache.scan_k
    monkeypatch.setattr(Cache, "scan_k", lambda self, *a: scans.append(a[3] - a[2]) or inner(self, *a))
    offload = _smallest_banks(config, HEADS, mask_bank=FEW_GROUPS)
    assert offload.attention_bank_tokens == _smallest_banks(InfiniteHiPConfig(**SMALL), HEADS).attention_bank_tokens + 32
    ours = _generate(tiny_llama_dir, config, offload, [prompt], steps)
    _assert_same(ours, resident)
    # Two passes (one segment each) over the candidates [sink, first question query + 1 - stream) of every layer.
    candidates = (700 - 24 + 1 - SMALL["stream_tokens"]) - SMALL["sink_tokens"]
    assert scans == [candidates] * (2 * ours[3].model_config.num_layers)
    assert not any(ours[2][-1]["attention"].overflows)


@pytest.mark.parametrize("kv_dtype,prompt_len", [("auto", 700), ("fp8_e4m3", 700), ("fp8_e4m3", 642)])
def test_staged_prefill_equals_resident_and_resolves_nothing_while_prefilling(tiny_llama_dir, monkeypatch, kv_dtype,
                                                                             prompt_len):
    """OffloadConfig.stage_prefill: each prefill chunk reads its layer's keys from one GPU copy of the context
    (landmark saliency, question-time selection, the three stages) and, where its key lists are longer than the
    context, its values as well (block-sparse attention), so the banks are not asked for a row until decode; a
    short last chunk (642 = 5 x 128 + 2 queries: one query block) reads its few keys through the attention bank
    instead, without staging the values. Tokens and logits equal the resident engine's (FP8: the resident cache
    rounded to FP8)."""
    config = InfiniteHiPConfig(**{**SMALL, "question_tokens": 24, "question_keep_tokens": 32, "question_window": 3})
    prompt, steps = random_ids(prompt_len, seed=27), 8
    if kv_dtype != "auto":  # the resident reference holds FP8-rounded K/V (as the previous test)
        fp8, write = OffloadConfig(kv_dtype=kv_dtype).torch_kv_dtype(torch.float32), PagedKVCache.write
        monkeypatch.setattr(PagedKVCache, "write", lambda self, layer, slots, k, v: write(
            self, layer, slots, to_storage_dtype(k, fp8).to(k.dtype), to_storage_dtype(v, fp8).to(v.dtype)))
    resident = _generate(tiny_llama_dir, config, None, [prompt], steps)
    monkeypatch.undo()
    offload = dataclasses.replace(_smallest_banks(config, HEADS, stage_prefill=True), kv_dtype=kv_dtype)
    counts: list[dict] = []
    ours = _generate(tiny_llama_dir, config, offload, [prompt], steps,
                     on_engine=lambda engine: counts.append(_count_requests(engine, per_call=True)))
    _assert_same(ours, resident)
    first_decode = next(i for i, s in enumerate(ours[2]) if s["attention"].total_hits + s["attention"].total_misses)
    short_last_chunk = prompt_len % 128 < 8  # the step that ends the prompt (and samples) reads through the bank
    assert first_decode == len(ours[2]) - steps + 1 - short_last_chunk  # the other prompt steps resolved nothing
    assert counts[0] and not any(any(ours[2][-1][b].overflows) for b in ("mask", "attention"))


def test_offloaded_graph_decode_equals_resident_and_does_not_sync(tiny_llama_dir, monkeypatch):
    """The graph decode path (ClosureRecorder: graph semantics on CPU) with offloading on gives the resident eager
    tokens and logits. While a step replays, the offload path (K/V writes, bank resolves, key-access tables)
    never reads a tensor on the host (item / tolist / bool / int / float would sync a CUDA stream). The CPU
    reference kernels of the method itself may (the Triton ones do not): only the offload entry points are watched."""
    import infinitehip.attention.methods.infinitehip.decode_rows as decode_rows
    from infinitehip.attention.methods.infinitehip import offload_access
    from infinitehip.engine.graph_decode import ClosureRecorder
    from infinitehip.kv.offload.offloaded import OffloadedKV

    config = InfiniteHiPConfig(**SMALL)
    prompt, steps = random_ids(700, seed=15), 14
    resident = _generate(tiny_llama_dir, config, None, [prompt], steps)
    state = {"replaying": False, "inside": 0, "watched": 0}

    def watch(fn):
        def wrapped(*args, **kwargs):
            state["inside"] += 1
            state["watched"] += state["replaying"]
            try:
                return fn(*args, **kwargs)
            finally:
                state["inside"] -= 1
        return wrapped

    for owner, name in ((OffloadedKV, "write"), (OffloadedKV, "resolve_mask"), (OffloadedKV, "resolve_attention"),
                        (OffloadedPagedCache, "_gather"), (OffloadedPagedCache, "token_table"),
                        (offload_access.RepresentativeKeys, "__call__"), (decode_rows, "decode_attention_rows"),
                        (decode_rows.DecodeRows, "append"), (OffloadedKV, "copy_to_spare")):
        monkeypatch.setattr(owner, name, watch(getattr(owner, name)))

    def unwatched(fn):  # the method's own scoring kernel, called back by the grouping
        def wrapped(*args):
            inside, state["inside"] = state["inside"], 0
            try:
                return fn(*args)
            finally:
                state["inside"] = inside
        return wrapped

    grouping = offload_access.RepresentativeKeys.score_in_fixed_groups  # decode's groups of chunks (host ints only)
    monkeypatch.setattr(offload_access.RepresentativeKeys, "score_in_fixed_groups",
                        watch(lambda self, reps, lens, c, score: grouping(self, reps, lens, c, unwatched(score))))
    for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
        def guarded(self, *args, _inner=getattr(torch.Tensor, name), _name=name, **kwargs):
            if state["replaying"] and state["inside"]:
                raise AssertionError(f"host sync (Tensor.{_name}) in the offload path of a replayed decode step")
            return _inner(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, guarded)
    replay = ClosureRecorder.replay

    def strict_replay(self):
        state["replaying"] = True
        try:
            return replay(self)
        finally:
            state["replaying"] = False

    monkeypatch.setattr(ClosureRecorder, "replay", strict_replay)
    groups = _count_decode_groups(monkeypatch)
    # A mask bank of 3 chunks' representatives: the stages' groups (static slices) are part of the captured step.
    ours = _generate(tiny_llama_dir, config, _smallest_banks(config, HEADS, mask_bank=3 * HEADS), [prompt], steps, graphs=True)
    _assert_same(ours, resident)
    decoder = ours[3].runner.graph_decoder
    assert decoder.captures == 3 and decoder.replays == steps - 1 - 1 - 3
    assert state["watched"] > 0
    assert groups and all(g == 3 and n > g for n, g in groups)


def test_offloaded_prefill_logits_equal_resident_with_dense_shortcut(tiny_llama_dir):
    """prompt_logits over several chunks: the dense shortcut while nothing is pruned (its reads go through the
    attention bank in pieces), then pruned chunks in query-block groups; logits of every position match."""
    config = InfiniteHiPConfig(**{**SMALL, "dense_when_unpruned": True})
    ids = random_ids(600, seed=25)
    resident = engine_for_dir(tiny_llama_dir, None, config, method="infinitehip", max_context_tokens=CONTEXT,
                              prefill_chunk_size=96, max_num_seqs=1).prompt_logits(ids)
    engine = engine_for_dir(tiny_llama_dir, None, config, _smallest_banks(config, HEADS), method="infinitehip",
                            max_context_tokens=CONTEXT, prefill_chunk_size=96, max_num_seqs=1)
    from infinitehip.attention.methods.infinitehip import offload_access

    calls = {"stages": 0, "groups": 0, "attend": 0, "block_groups": 0}
    inner_stage, inner_groups = offload_access.RepresentativeKeys.score_in_groups, offload_access.prefill_attention_in_groups

    def stage(self, *args):
        calls["stages"] += 1
        return inner_stage(self, *args)

    def groups(cache, layer, page_table, tokens, counts, block_size, n, attend):
        calls["attend"] += 1

        def counted(*args):
            calls["block_groups"] += 1
            return attend(*args)
        return inner_groups(cache, layer, page_table, tokens, counts, block_size, n, counted)

    inner_call = offload_access.RepresentativeKeys.__call__

    def call(self, reps, lens):
        calls["groups"] += 1
        return inner_call(self, reps, lens)

    import infinitehip.attention.methods.infinitehip.method as method_module
    with pytest.MonkeyPatch.context() as m:
        m.setattr(offload_access.RepresentativeKeys, "score_in_groups", stage)
        m.setattr(offload_access.RepresentativeKeys, "__call__", call)
        m.setattr(method_module, "prefill_attention_in_groups", groups)
        logits = engine.prompt_logits(ids)
    torch.testing.assert_close(logits, resident, rtol=1e-5, atol=1e-5)
    assert engine.kv_stats()["attention"].total_misses > 0
    # Some stages and some chunks' attention did not fit their bank at once: they ran in several groups.
    assert calls["groups"] > calls["stages"] > 0 and calls["block_groups"] > calls["attend"] > 0


def test_dense_offloaded_equals_resident(tiny_llama_dir):
    offload = OffloadConfig(offload_enabled=True, mask_bank_tokens=8, attention_bank_tokens=64)
    prompt = random_ids(300, seed=26)
    resident = _generate(tiny_llama_dir, None, None, [prompt], 5, method="dense")
    ours = _generate(tiny_llama_dir, None, offload, [prompt], 5, method="dense")
    _assert_same(ours, resident)
    assert ours[2][-1]["attention"].total_misses > 300


def test_request_beyond_the_planned_capacity_is_refused_before_allocation(tiny_llama_dir, monkeypatch):
    config, context = InfiniteHiPConfig(**SMALL), 1100
    offload = OffloadConfig(**{**_smallest_banks(config, HEADS, context=context).__dict__, "host_memory_fraction": 1.0})
    build = lambda kv_tokens: engine_for_dir(tiny_llama_dir, None, config, offload, method="infinitehip",  # noqa: E731
                                             max_context_tokens=context, max_num_seqs=1, kv_cache_tokens=kv_tokens)
    per_token = build(None).kv_plan.host_bytes_per_token
    # Host memory for 1000 tokens: 960 in pages of 64. A KV of 900 tokens (15 pages) fits.
    monkeypatch.setattr(planner, "host_available_bytes", lambda: 1000 * per_token)
    engine = build(900)
    assert engine.kv_plan.max_tokens == 960 and engine.kv_plan.limited_by == "host"
    with pytest.raises(CapacityError, match=r"request \(prompt 900 \+ max_tokens 124\) needs 1,024 KV tokens but the "
                                            r"offloaded KV capacity is 960 tokens"):
        engine.add_request(random_ids(900, seed=1), SamplingParams(max_tokens=124))
    assert not engine.has_work and engine.scheduler.allocator.num_in_use == 0
    # A KV cache larger than the plan: refused when the engine is built, before the store is allocated.
    allocated = []
    monkeypatch.setattr(OffloadedPagedCache, "__init__", lambda *a, **k: allocated.append(1))
    with pytest.raises(CapacityError, match=r"needs 1,024 KV tokens .* capacity is 960 tokens \(limited by host"):
        build(1000)
    assert not allocated


def test_configurations_that_cannot_run_offloaded_are_refused(tiny_llama_dir):
    on = OffloadConfig(offload_enabled=True, mask_bank_tokens=4096, attention_bank_tokens=4096)
    with pytest.raises(ValueError, match="method 'streaming' does not support KV offloading"):
        engine_for_dir(tiny_llama_dir, None, None, on, method="streaming", max_context_tokens=CONTEXT)
    with pytest.raises(ValueError, match="representative='landmark'"):
        engine_for_dir(tiny_llama_dir, None, InfiniteHiPConfig(**SMALL, representative="bisection"), on,
                       method="infinitehip", max_context_tokens=CONTEXT)
    with pytest.raises(CapacityError, match="attention_bank_tokens=100 .* max_num_seqs=1"):
        engine_for_dir(tiny_llama_dir, None, InfiniteHiPConfig(**SMALL), OffloadConfig(offload_enabled=True, attention_bank_tokens=100),
                       method="infinitehip", max_context_tokens=CONTEXT, max_num_seqs=1)
    with pytest.raises(ValueError, match="kv_dtype='fp8_e4m3' needs offload_enabled"):
        engine_for_dir(tiny_llama_dir, None, InfiniteHiPConfig(**SMALL), OffloadConfig(offload_enabled=False, kv_dtype="fp8_e4m3"),
                       method="infinitehip", max_context_tokens=CONTEXT)
    engine = engine_for_dir(tiny_llama_dir, None, InfiniteHiPConfig(**SMALL), _smallest_banks(InfiniteHiPConfig(**SMALL), HEADS),
                            method="infinitehip", max_context_tokens=CONTEXT, max_num_seqs=1)
    with pytest.raises(OffloadedAccessError, match="offloaded"):
        engine.cache.flat_k(0)


def test_offload_flags_reach_the_engine_config():
    from infinitehip.cli.main import build_parser
    from infinitehip.cli.options import dataclass_from_args

    args = build_parser().parse_args(["generate", "--prompt", "x", "--method", "infinitehip", "--offload-enabled", "true",
                                      "--mask-bank-tokens", "4096", "--attention-bank-tokens", "8192",
                                      "--offload-impl", "reference", "--impl", "triton"])
    cfg = dataclass_from_args(OffloadConfig, args)
    assert (cfg.offload_enabled, cfg.mask_bank_tokens, cfg.attention_bank_tokens, cfg.offload_impl) == (True, 4096, 8192, "reference")
    assert args.impl == "triton"  # the method's --impl is a different flag

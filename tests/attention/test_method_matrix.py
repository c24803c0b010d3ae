"""The method matrix: properties every registered attention method keeps (tiny random Llama-3 model, fp32, CPU).

Per method, over `METHODS`:
  - within its budgets: deterministic, dense's output, pages freed; dense's prompt and token log-probabilities;
  - prefill/decode consistency: greedy decode steps equal the logits of a chunked prefill re-run over prompt +
    generated tokens, with settings under which the method's budgets are exceeded (the sparse path engages);
  - batched requests equal requests alone;
  - no future key read: a prompt position's logits do not depend on later prompt tokens;
  - clear config errors: an unknown or misplaced setting, and an out-of-range value of every field, name the field;
  - over the context limit: an error, never a silent truncation (except `truncate`, whose job it is);
  - declared capabilities (attention/capabilities.py): their required hooks written and doing what the engine relies
    on; a method declaring none runs with the safe defaults.
"""

from __future__ import annotations

import dataclasses
import logging
import typing

import pytest
import torch

from infinitehip import LLM, SamplingParams
from infinitehip.attention.base import AttentionMethod
from infinitehip.attention.capabilities import (CacheCompaction, GraphDecode, KVOffload, PrefixCaching,
                                                TensorParallelHeads, TokenizerBinding, accept_offload, kv_scratch_tokens,
                                                kv_token_limit, prefix_reuse_of, supports)
from infinitehip.attention.methods.cascade.config import CascadeConfig
from infinitehip.attention.methods.dense.method import causal_sdpa
from infinitehip.attention.methods.hip.config import HiPConfig
from infinitehip.attention.methods.infinipot.config import InfiniPotConfig
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.attention.registry import method_class
from infinitehip.attention.methods.streaming.config import StreamingConfig
from infinitehip.attention.methods.tokenselect.config import TokenSelectConfig
from infinitehip.attention.methods.truncate.config import TruncateConfig
from infinitehip.config.methods import METHODS
from infinitehip.config.model import ModelConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.engine.llm_engine import ContextLengthError
from infinitehip.engine.prefix_pages import prefix_policy
from infinitehip.kv.prefix_reuse import PrefixReuse
from tests.conftest import closure_graph_decoder, engine_for_dir, generate_greedy, random_ids, record_step_logits

# Budgets far below the matrix's 200-token prompts, so every method's sparse / evicting / truncating path runs.
# Selection made per query token (query blocks of 1, every decode step refreshing its selection): the setting in
# which a method's decode step is specified to attend what a one-query prefill block attends. With blocks (and
# mask refresh intervals / selection caches) decode is by design not recomputation-exact: see BLOCKED below.
_IH = dict(sink_tokens=16, stream_tokens=64, chunk_sizes=(64, 16, 4), keep_tokens=(512, 128, 32),
           early_last_keep_tokens=64, early_layers=1, landmark_window=48, question_tokens=0)
_HIP = dict(top_k_tokens=16, key_block_size=2, sink_tokens=4, window_tokens=16, dense_layers=1)
_TS = dict(select_tokens=24, sink_tokens=8, local_tokens=16, question_tokens=0)
PER_TOKEN = {
    "dense": None,
    "streaming": StreamingConfig(sink_tokens=4, window_tokens=60, eviction_batch_tokens=40),
    "truncate": TruncateConfig(window_tokens=100, head_share=0.25),
    # Pot of 160 slots: the prompt alone fills it (distillations in prefill and after decode steps).
    # "in the re on at": a catalyst prompt of 5 ids inside the tiny vocabulary (embedded tokenizer).
    "infinipot": InfiniPotConfig(pot_tokens=160, compressed_tokens=48, catalyst_prompt="in the re on at",
                                 question_tokens=0, pool_tokens=1),
    # No selection cache (a hit reuses an older step's selection) and no vote pooling: pooled votes tie between
    # neighbours, and which of tied candidates top-k keeps depends on the scoring's shape (a prefill chunk of 8
    # rows vs 19 rows changed a logit by 1e-3), so pooling is exact only up to tie-breaking.
    "tokenselect": TokenSelectConfig(**_TS, query_block_size=1, selection_cache=False, vote_pool_size=1),
    "infinitehip": InfiniteHiPConfig(**_IH, query_block_sizes=(1, 1, 1), refresh_intervals=(1, 1, 1)),
    # within the tiny model's trained length (4096) every context here: exact, as dense (test_auto.py: past it)
    "auto": InfiniteHiPConfig(**_IH, query_block_sizes=(1, 1, 1), refresh_intervals=(1, 1, 1),
                              dense_within_trained=True),
    # 4 sinks + 3 sub-caches of 16 + a 24-token stride: the 200-token prompt pushes several strides (prefill chunks
    # of 48 are cut at the stride's end), and decode pushes its staged tokens when the stride fills.
    "cascade": CascadeConfig(sink_tokens=4, cache_tokens=52, num_subcaches=3, stride_tokens=24),
    # 4 sinks + a 16-token window + 8 blocks of 2 keys from the hierarchy (a block selects once its candidates span
    # 32 keys, from position 51); layer 0 dense; every decode step refreshes its selection.
    "hip": HiPConfig(**_HIP, query_block_size=1, refresh_interval=1),
}
# Prefill query blocks sharing one selection made with the block's mean query (TokenSelect Sec. 4.2, InfiniteHiP's
# query_block_sizes): a position's selection depends on the later queries of its block, so prefix invariance holds
# at block granularity only. Blocks start at multiples of the block size when the prefill chunk is a multiple of it.
BLOCKED = {
    "tokenselect": (TokenSelectConfig(**_TS, query_block_size=32), 32),
    "infinitehip": (InfiniteHiPConfig(**_IH, query_block_sizes=(32, 16, 8), refresh_intervals=(4, 2, 1)), 32),
    "hip": (HiPConfig(**_HIP, query_block_size=32, refresh_interval=8), 32),
}


def test_matrix_covers_every_registered_method():
    assert set(PER_TOKEN) == set(METHODS)


def _engine(path, method, config=None, tokenizer=None, **kw):
    return engine_for_dir(path, tokenizer, config, method=method, **{"max_context_tokens": 2048, **kw})


# ---- within the budgets: dense ------------------------------------------------------------------------------
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_short_input_is_deterministic_dense_and_frees_pages(tiny_llama_dir, tokenizer, method):
    """Input within every method's budgets: greedy output equals dense's, twice the same; all pages freed."""
    ids = random_ids(120, seed=6)
    dense = generate_greedy(_engine(tiny_llama_dir, "dense"), ids, 8).output_ids
    engine = _engine(tiny_llama_dir, method, tokenizer=tokenizer)  # infinipot encodes its catalyst prompt
    allocator = engine.scheduler.allocator
    first = generate_greedy(engine, ids, 8)
    assert allocator.num_free == allocator.num_pages
    second = generate_greedy(engine, ids, 8)
    assert first.output_ids == second.output_ids == dense
    assert first.dropped_prompt_tokens == 0
    assert allocator.num_free == allocator.num_pages


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_gives_prompt_and_token_logprobs(tiny_llama_dir, tokenizer, method):
    """Log-probabilities come from the method that prefills and decodes: within its budgets they are dense's, in
    prefill chunks of 48 (boundaries inside the prompt), one per prompt token after the first and per output token."""
    ids = random_ids(120, seed=9)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2, prompt_logprobs=1)

    def run(name):
        engine = _engine(tiny_llama_dir, name, tokenizer=tokenizer, prefill_chunk_size=48)
        seq = engine.add_request(ids, params)
        while engine.has_work:
            engine.step()
        return seq

    dense, ours = run("dense"), run(method)
    assert [e.token for e in ours.prompt_logprobs] == ids[1:] and len(ours.output_logprobs) == 4
    got = torch.tensor([e.logprob for e in ours.prompt_logprobs + ours.output_logprobs])
    want = torch.tensor([e.logprob for e in dense.prompt_logprobs + dense.output_logprobs])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


# ---- beyond the budgets -------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_decode_equals_prefill_recomputed(tiny_llama_dir, tokenizer, method):
    """Each greedy decode step's logits equal those of a chunked prefill re-run over the prompt (as the method kept
    it: truncate's head + tail) + the tokens generated so far, and its token is their argmax. Holds exactly for the
    evicting caches too: streaming's window and infinipot's distillations happen at the same cache fill whether the
    tokens arrive in a prefill chunk (chunks are capped by the room left) or one per decode step."""
    ids, n = random_ids(200, seed=11), 12
    make = lambda: _engine(tiny_llama_dir, method, PER_TOKEN[method], tokenizer, prefill_chunk_size=48)
    engine = make()
    steps = record_step_logits(engine)
    seq = generate_greedy(engine, ids, n)
    decoded = torch.cat([logits[-1:] for logits in steps])  # the last prompt row, then one row per decode step
    full = seq.prompt_ids + seq.output_ids[:-1]
    recomputed = make().prompt_logits(full)[len(seq.prompt_ids) - 1 :]
    assert decoded.shape == recomputed.shape == (n, 512)
    torch.testing.assert_close(decoded, recomputed, rtol=0, atol=5e-4)
    assert recomputed.argmax(-1).tolist() == seq.output_ids
    # Not vacuous: the method's own path ran (truncate dropped tokens; the others differ from dense attention).
    if method == "truncate":
        assert seq.dropped_prompt_tokens == 100
    elif method != "dense":
        dense = _engine(tiny_llama_dir, "dense", prefill_chunk_size=48).prompt_logits(full)[len(ids) - 1 :]
        if method == "auto":  # within the trained length: dense's logits (test_auto.py: pruned past it)
            torch.testing.assert_close(recomputed, dense, rtol=0, atol=5e-4)
        else:
            assert (recomputed - dense).abs().max() > 1e-2


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_batched_requests_equal_requests_alone(tiny_llama_dir, tokenizer, method):
    """Sequences sharing steps (prefill chunks next to decode tokens) get what each gets alone."""
    prompts = [random_ids(150, seed=7), random_ids(90, seed=8)]
    make = lambda: _engine(tiny_llama_dir, method, tokenizer=tokenizer, prefill_chunk_size=64)
    alone = [generate_greedy(make(), ids, 6).output_ids for ids in prompts]
    engine = make()
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    seqs = [engine.add_request(ids, params) for ids in prompts]
    while engine.has_work:
        engine.step()
    assert [s.output_ids for s in seqs] == alone


def _prefix_case(path, tokenizer, method, config, chunk):
    """Logits of two 200-token prompts sharing their first 150 tokens (the change inside a prefill chunk)."""
    a = random_ids(200, seed=12)
    b = a[:150] + random_ids(50, seed=13)
    make = lambda: _engine(path, method, config, tokenizer, prefill_chunk_size=chunk)
    return make().prompt_logits(a), make().prompt_logits(b)


@pytest.mark.parametrize("chunk", [64, 256])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_reads_no_future_key(tiny_llama_dir, tokenizer, method, chunk):
    """Prefix invariance of prefill (chunks of 64: the change mid-chunk; 256: one chunk): with selections per query
    token, the logits of every position before the first changed token are bit-for-bit the same. (truncate's
    prompt_logits reads the prompt whole, i.e. dense.)"""
    a, b = _prefix_case(tiny_llama_dir, tokenizer, method, PER_TOKEN[method], chunk)
    assert torch.equal(a[:150], b[:150])
    assert (a[150:] - b[150:]).abs().max() > 1e-2  # the later positions do see the change


@pytest.mark.parametrize("method", sorted(BLOCKED))
def test_block_selection_reads_no_key_beyond_its_block(tiny_llama_dir, method):
    """With prefill query blocks sharing a selection, positions of blocks before the changed token's block keep
    their logits."""
    config, block = BLOCKED[method]
    a, b = _prefix_case(tiny_llama_dir, None, method, config, 64)
    bound = 150 - 150 % block
    assert torch.equal(a[:bound], b[:bound])
    assert (a[150:] - b[150:]).abs().max() > 1e-2


@pytest.mark.parametrize("method", sorted(set(METHODS) - {"truncate"}))
def test_every_method_but_truncate_rejects_an_over_long_prompt(tiny_llama_dir, tokenizer, method):
    engine = _engine(tiny_llama_dir, method, PER_TOKEN[method], tokenizer, max_context_tokens=256)
    with pytest.raises(ContextLengthError, match="Nothing was truncated"):
        engine.add_request(random_ids(300), SamplingParams(max_tokens=4))


# ---- configuration errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_rejects_unknown_and_misplaced_settings(method):
    """By name (LLM(...) resolves its settings before loading anything) and on the config class itself."""
    with pytest.raises(ValueError, match="unknown setting 'sink_tokenz'"):
        LLM(method=method, sink_tokenz=4)
    other = next(n for n, s in sorted(METHODS.items())
                 if n != method and s.config_cls not in (None, METHODS[method].config_cls))  # auto shares infinitehip's
    own = {f.name for f in dataclasses.fields(METHODS[method].config_cls)} if METHODS[method].config_cls else set()
    foreign = next(f.name for f in dataclasses.fields(METHODS[other].config_cls) if f.name not in own)
    with pytest.raises(ValueError, match=rf"{foreign}: not a setting of method '{method}'"):
        LLM(method=method, **{foreign: 1})
    config_cls = METHODS[method].config_cls
    if config_cls is not None:
        with pytest.raises(TypeError, match="sink_tokenz"):
            config_cls(sink_tokenz=4)


def _out_of_range(cls, f):
    """A value no setting of the field's type accepts: a huge negative number, a tuple of them, a name no choice
    has, empty text; None for bool fields (no value is out of range)."""
    hint = typing.get_type_hints(cls)[f.name]
    if hint is bool:
        return None
    if f.name in getattr(cls, "CHOICES", {}):
        return "nope"
    base = {typing.get_origin(hint)} | set(typing.get_args(hint)) if typing.get_origin(hint) else {hint}
    if tuple in base:
        return tuple(-(10**6) for _ in getattr(cls(), f.name))
    if base & {int, float}:
        return -(10**6)
    if str in base:
        return " "
    raise AssertionError(f"{cls.__name__}.{f.name}: no out-of-range value known for {hint}")


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_config_rejects_out_of_range_values_naming_the_field(method):
    """Every non-bool field of the method's config, set out of range by name (LLM(method=..., field=...)), raises
    ValueError naming that field. dense has no settings (nothing to check)."""
    config_cls = METHODS[method].config_cls
    if config_cls is None:
        assert method == "dense"
        return
    checked = 0
    for f in dataclasses.fields(config_cls):
        bad = _out_of_range(config_cls, f)
        if bad is None:
            continue
        with pytest.raises(ValueError, match=f.name):
            LLM(method=method, **{f.name: bad})
        checked += 1
    assert checked >= 2


# ---- declared capabilities ----------------------------------------------------------------------------------
CAPABILITIES = (GraphDecode, KVOffload, PrefixCaching, CacheCompaction, TokenizerBinding, TensorParallelHeads)
ROOMY_BANKS = OffloadConfig(offload_enabled=True, mask_bank_tokens=1 << 40, attention_bank_tokens=1 << 40)
OFFLOAD_REFUSED = r"method '\w+' does not support KV offloading \(offload-enabled\); use method 'infinitehip' \(or 'dense'"


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_declared_capabilities_do_what_the_engine_relies_on(tiny_llama_dir, tokenizer, method):
    """Each capability's required hooks are the method's own; sizes, offloading, prefix caching and head reductions
    are what the declarations say, and so is the engine built with the method."""
    cls = method_class(method)
    declared = [cap for cap in CAPABILITIES if supports(cls, cap)]
    for cap in declared:
        for hook in cap.__abstractmethods__:
            assert getattr(cls, hook) is not getattr(cap, hook), f"{method}: {cap.__name__}.{hook} not written"
    engine = _engine(tiny_llama_dir, method, PER_TOKEN[method], tokenizer)
    m = engine.method
    limit, scratch = kv_token_limit(m), kv_scratch_tokens(m)
    if CacheCompaction in declared:
        assert isinstance(limit, int) and 0 < limit < engine.max_context_tokens and scratch >= 0
    else:  # the class's sizes, which the engine reads before building it, hold no limit either
        sizing = cls.kv_sizing(engine.model_config.method_view(), PER_TOKEN[method], tokenizer)
        assert (limit, scratch, sizing.kv_token_limit, sizing.kv_scratch_tokens) == (None, 0, None, 0)
    if KVOffload in declared:
        accept_offload(m, ROOMY_BANKS, 2048, 2)
    else:
        with pytest.raises(ValueError, match=OFFLOAD_REFUSED):
            accept_offload(m, ROOMY_BANKS, 2048, 2)
    reuse = prefix_reuse_of(m)
    if PrefixCaching in declared:
        assert isinstance(reuse, PrefixReuse)
        if reuse.needs_snapshot:  # private tails: their per-slot state must be kept and restored
            assert cls.prefix_snapshot is not PrefixCaching.prefix_snapshot
            assert cls.restore_prefix is not PrefixCaching.restore_prefix
    else:
        assert reuse is None
    assert (engine.prefix is not None) == (PrefixCaching in declared and CacheCompaction not in declared)
    if TensorParallelHeads in declared:  # single-process: the reduction is the identity
        scores = torch.randn(3, 5)
        assert m.parallel is None and m.reduce_heads(scores, "sum") is scores


@pytest.mark.parametrize("method", sorted(m for m in METHODS if supports(method_class(m), GraphDecode)))
def test_every_graph_decode_method_keys_steps_and_replays_what_eager_decodes(tiny_llama_dir, tokenizer, method):
    """Decode through graphs (CUDA-graph semantics on CPU): every step's key is hashable or None and is the key the
    eager engine's state gives before that step, so the host counters a replay advances by hand follow a real step
    (with selections refreshed every few steps, BLOCKED's configs, where the counters say which stages refresh);
    the tokens are the eager engine's."""
    ids, config = random_ids(200, seed=14), BLOCKED[method][0] if method in BLOCKED else PER_TOKEN[method]
    eager_engine = _engine(tiny_llama_dir, method, config, tokenizer)
    eager_keys, decode = [], eager_engine.method.decode

    def keyed_decode(layer, q, seqs, batch):
        if layer == 0:
            eager_keys.append(eager_engine.method.graph_key(seqs[0]))
        return decode(layer, q, seqs, batch)

    eager_engine.method.decode = keyed_decode
    eager = generate_greedy(eager_engine, ids, 10).output_ids
    engine = _engine(tiny_llama_dir, method, config, tokenizer)
    graphs = closure_graph_decoder(engine, min_bucket=256)
    keys, key = [], graphs.key
    graphs.key = lambda seq: keys.append(key(seq)) or keys[-1]
    assert generate_greedy(engine, ids, 10).output_ids == eager
    assert len(keys) == len(eager_keys) == 9 and all(k is None or hash(k) is not None for k in keys)
    assert [None if k is None else k[1] for k in keys] == eager_keys  # (capacity bucket, method key)
    if method == "infinitehip":  # beyond the budgets: a graph per refresh pattern
        assert graphs.replays > 0 and len({k for k in keys if k is not None}) > 1
    # one exact graph (auto: within the trained length; cascade: every step over its whole cache, masked), replayed
    # from step 2 on
    if method in ("dense", "auto", "cascade"):
        assert None not in keys and len(set(keys)) == 1 and graphs.replays == len(keys) - 1


class _PlainAttention(AttentionMethod):
    """Causal attention declaring no capability (the core alone)."""

    name = "plain"

    def prefill(self, layer, q, seq, batch):
        k, v = seq.cache.read(layer, seq.context_slots)
        return causal_sdpa(batch.rope.apply_range(q, seq.start_pos), batch.rope.apply_range(k, 0), v, seq.start_pos)


def test_a_method_declaring_no_capability_gets_the_safe_defaults(tiny_llama_dir, caplog):
    """Offloading refused with the clear error, prefix caching off with its note, one slot per token, no graphs and
    nothing run after a step: it decodes dense's tokens through an engine with a graph decoder."""
    view = ModelConfig.from_dir(tiny_llama_dir).method_view()
    plain = _PlainAttention(view)
    with pytest.raises(ValueError, match=OFFLOAD_REFUSED.replace(r"\w+", "plain")):
        accept_offload(plain, ROOMY_BANKS, 2048, 2)
    with caplog.at_level(logging.INFO, logger="infinitehip.engine.prefix_pages"):
        assert prefix_policy(True, plain, False, 64, 256) is None
    assert "prefix caching off: method 'plain': the method does not declare how its state follows a reused prefix" \
        in caplog.text
    assert (kv_token_limit(plain), kv_scratch_tokens(plain)) == (None, 0)
    assert plain.own_kv_sizing().default_max_context_tokens == view.max_position_embeddings
    ids = random_ids(120, seed=15)
    dense = generate_greedy(_engine(tiny_llama_dir, "dense"), ids, 6).output_ids
    engine = _engine(tiny_llama_dir, "dense", enable_prefix_caching=False)
    engine.method = engine.runner.method = _PlainAttention(engine.model_config)
    graphs = closure_graph_decoder(engine, min_bucket=256)
    assert generate_greedy(engine, ids, 6).output_ids == dense
    assert graphs.captures == graphs.replays == 0

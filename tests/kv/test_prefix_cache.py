"""Automatic prefix caching on the embedded model: a reused prefix gives exactly the greedy tokens of a run with
caching off (partial pages, concurrent sharers, eviction, preemption), for every method that supports reuse."""

from __future__ import annotations

import logging

import pytest
import torch

from infinitehip import EngineConfig, SamplingParams
from infinitehip.config.methods import method_spec
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.kv.prefix_cache import PrefixCachingAllocator, page_hashes
from infinitehip.model.gguf_convert import default_cache_root
from infinitehip.model.loading import LoadedModel, load_model

# Small settings so a ~300-token prompt goes through each method's sparse paths (selection, landmarks, question).
METHODS = {
    "dense": None,
    "truncate": method_spec("truncate").config(window_tokens=4096),
    "infinitehip": method_spec("infinitehip").config(
        sink_tokens=16, stream_tokens=48, query_block_sizes=(32, 16, 8), chunk_sizes=(64, 16, 4),
        keep_tokens=(128, 64, 32), early_last_keep_tokens=32, refresh_intervals=(4, 2, 1), early_layers=1,
        landmark_window=48, question_tokens=8, question_keep_tokens=32, question_window=3),
    "tokenselect": method_spec("tokenselect").config(select_tokens=48, sink_tokens=8, local_tokens=32, query_block_size=16,
                                                     question_tokens=8, question_select_tokens=32),
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def embedded() -> LoadedModel:
    return load_model(None, default_cache_root(), torch.device("cpu"), torch.float32)


def _engine(loaded, method="dense", **config) -> LLMEngine:
    config = {"max_context_tokens": 1024, "page_size": 16, "prefill_chunk_size": 64, **config}
    return LLMEngine(EngineConfig(device="cpu", dtype="float32", show_progress=False, method=method,
                                  method_config=METHODS[method], **config), loaded)


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(100, 49000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run(engine, prompts, params=GREEDY):
    seqs = [engine.add_request(p, params) for p in prompts]
    while engine.has_work:
        engine.step()
    return seqs


# Three prefill chunks of 64; the second and third request's rests fit one step together, so each is computed
# in the chunk it gets when run alone (chunk-dependent methods compare exactly only under the same chunking).
DOC = _ids(192, 1)
Q1, Q2, Q3 = DOC + _ids(20, 2), DOC + _ids(21, 3), DOC + _ids(23, 4)
Q4 = DOC[:180] + _ids(30, 5)  # shares 180 tokens: 11 full pages of 16 and 4 tokens of the next


def test_page_hashes_chain_their_predecessors():
    a, b = page_hashes(list(range(40)), 16), page_hashes([0] + list(range(1, 40)), 16)
    assert a == b and len(a) == 2
    c = page_hashes([1] + list(range(1, 40)), 16)
    assert c[0] != a[0] and c[1] != a[1]  # same second page, different first: a different prefix
    assert page_hashes(list(range(40)), 16, a[0], start=1) == a[1:]


def test_allocator_refcounts_and_lru_eviction():
    a = PrefixCachingAllocator(4, 2)
    pages = a.allocate(3)
    for i, h in enumerate(page_hashes([1, 2, 3, 4, 5, 6], 2)):
        assert a.register(pages[i], h)
    a.take(pages[:2])  # a second sequence shares the first two
    a.free(list(pages))
    assert a.num_free == 2 and a.match(page_hashes([1, 2, 3, 4, 5, 6], 2)) == pages  # the third stays cached
    a.release(pages[:2])
    assert a.num_free == 4 and a.stats.evictions == 0
    # Freed last-first: the tail page is the oldest, evicted first, and the head survives longest.
    assert a.allocate(2) and a.stats.evictions == 1
    assert a.match(page_hashes([1, 2, 3, 4, 5, 6], 2)) == pages[:2]


# The infinitehip and tokenselect cases take ~3.5 minutes each on the 2-core machine (the embedded model's 30
# layers, five requests, their selection on CPU): make test-all. tests/kv/test_prefix_cache_offload.py keeps an
# infinitehip hit in make test.
SLOW_REUSE = ("infinitehip", "tokenselect")


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW_REUSE else m
                                    for m in sorted(METHODS)])
def test_second_request_reuses_the_prefix_with_the_same_greedy_tokens(embedded, method):
    off = _engine(embedded, method, enable_prefix_caching=False)
    assert off.prefix is None and not isinstance(off.scheduler.allocator, PrefixCachingAllocator)
    expected = [s.output_ids for q in (Q2, Q3, Q4) for s in _run(off, [q])]
    on = _engine(embedded, method)
    assert on.prefix is not None
    (first,) = _run(on, [Q1])
    assert first.cached_prompt_tokens == 0
    prefilled = []
    step = on.step
    on.step = lambda *a: (lambda out: (prefilled.append(out[1]), out)[1])(step(*a))
    # Two requests at once share the cached pages (a reference each) and each computes only its own rest.
    second, third = on.add_request(Q2, GREEDY), on.add_request(Q3, GREEDY)
    on.step()
    assert second.page_table[:4] == third.page_table[:4]
    assert on.scheduler.allocator.refs(second.page_table[0]) == 2
    while on.has_work:
        on.step()
    assert sum(prefilled) == len(Q2) + len(Q3) - 2 * 192
    (fourth,) = _run(on, [Q4])
    assert [second.output_ids, third.output_ids, fourth.output_ids] == expected
    assert second.cached_prompt_tokens == third.cached_prompt_tokens == 192
    # A prefix ending inside a page: its full pages (176 tokens), or the prefill-chunk grid for the methods whose
    # selection depends on the chunk.
    assert fourth.cached_prompt_tokens == (176 if method in ("dense", "truncate") else 128)
    stats = on.prefix_cache_stats()
    assert stats.hits == 2 * 192 + fourth.cached_prompt_tokens
    assert stats.queries == sum(map(len, (Q1, Q2, Q3, Q4)))


def test_eviction_under_a_small_cache_keeps_outputs_exact(embedded):
    """10 pages of 16: a second document evicts the first one's tail pages (least recently released first); asking
    the first again reuses its surviving head and recomputes the rest."""
    doc_a, doc_b = _ids(96, 11), _ids(96, 12)
    qa1, qb, qa2 = doc_a + _ids(8, 13), doc_b + _ids(8, 14), doc_a + _ids(9, 15)
    off = _engine(embedded, kv_cache_tokens=160, enable_prefix_caching=False)
    expected = [_run(off, [q])[0].output_ids for q in (qb, qa2)]
    on = _engine(embedded, kv_cache_tokens=160)
    _run(on, [qa1])
    assert on.scheduler.allocator.num_cached_pages == 6
    (b,) = _run(on, [qb])
    stats = on.prefix_cache_stats()
    assert b.cached_prompt_tokens == 0 and stats.evictions == 3  # 4 never-used pages, then 3 of doc_a's 6
    (a,) = _run(on, [qa2])
    assert [b.output_ids, a.output_ids] == expected
    assert a.cached_prompt_tokens == 3 * 16  # doc_a's head survived
    assert on.scheduler.allocator.num_free == on.scheduler.allocator.num_pages


def test_a_hit_that_does_not_fit_with_its_copies_is_computed_from_scratch(embedded):
    """infinitehip copies the landmark-saliency tail pages of a hit (their sources stay referenced meanwhile): in a
    cache that holds the prompt but not the hit plus its copies, the second request is admitted without the hit
    (it used to wait forever) and gives the tokens of a run with caching off."""
    doc = _ids(256, 11)
    prompts = [doc + _ids(20, 12), doc + _ids(20, 13)]
    tokens = 256 + 20 + GREEDY.max_tokens
    plain = _run(_engine(embedded, "infinitehip", enable_prefix_caching=False), [prompts[1]])[0].output_ids
    engine = _engine(embedded, "infinitehip", kv_cache_tokens=-(-tokens // 16) * 16 + 16)
    first, = _run(engine, [prompts[0]])
    second, = _run(engine, [prompts[1]])
    assert second.output_ids == plain and second.cached_prompt_tokens == 0


def test_preemption_while_pages_are_shared(embedded):
    """Three sequences share a cached 32-token prefix in a 10-page cache and cannot all grow to 80 tokens: the newest
    is preempted (its references dropped, the shared pages stay with the others) and recomputed from the cache."""
    doc = _ids(32, 21)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompts = [doc + _ids(8, s) for s in (22, 23, 24)]
    off = _engine(embedded, kv_cache_tokens=1024, enable_prefix_caching=False)
    expected = [s.output_ids for s in _run(off, prompts, params)]
    on = _engine(embedded, kv_cache_tokens=160)
    _run(on, [doc + _ids(8, 25)], SamplingParams(temperature=0.0, max_tokens=1))
    preempted, schedule = [], on.scheduler.schedule

    def spy():
        plan, admitted, gone = schedule()
        preempted.extend(gone)
        return plan, admitted, gone

    on.scheduler.schedule = spy
    seqs = _run(on, prompts, params)
    assert [s.output_ids for s in seqs] == expected
    assert preempted and all(s.cached_prompt_tokens == 32 for s in seqs)
    allocator = on.scheduler.allocator
    assert allocator.num_free == allocator.num_pages and all(allocator.refs(p) == 0 for p in range(allocator.num_pages))


def test_methods_without_reuse_turn_caching_off_with_a_log_line(embedded, caplog):
    from infinitehip.attention.methods.streaming.config import StreamingConfig

    METHODS["streaming"] = StreamingConfig(sink_tokens=4, window_tokens=60, eviction_batch_tokens=40)
    try:
        with caplog.at_level(logging.INFO, logger="infinitehip.engine.prefix_pages"):
            engine = _engine(embedded, "streaming")
    finally:
        del METHODS["streaming"]
    assert engine.prefix is None and engine.prefix_cache_stats() is None
    assert "prefix caching off: method 'streaming'" in caplog.text


def test_disk_round_trip_through_server_restarts_and_mismatch_refused(embedded, tmp_path):
    """Ask, stop the server (the cache is saved), start a new engine and server on the same directory (loaded), ask
    again on the document: the same answer, the document not prefilled. A file of another KV layout is refused."""
    import openai

    from infinitehip.config.server import ServerConfig
    from infinitehip.server.app import PREFIX_CACHE_FILE, create_app
    from tests.server.test_server import ServerThread

    def ask(engine, prompt):
        with ServerThread(create_app(engine, ServerConfig(prefix_cache_dir=str(tmp_path)))) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
            model = client.models.list().data[0].id
            return client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0)

    first = ask(_engine(embedded), Q1)
    assert (tmp_path / PREFIX_CACHE_FILE).exists() and first.usage.prompt_tokens_details.cached_tokens == 0
    restarted = _engine(embedded)
    prefilled, step = [], restarted.step
    restarted.step = lambda *a: (lambda out: (prefilled.append(out[1]), out)[1])(step(*a))
    second = ask(restarted, Q2)
    expected = _run(_engine(embedded, enable_prefix_caching=False), [Q2])[0].output_ids
    assert second.choices[0].text == restarted.tokenizer.decode(expected, skip_special_tokens=True)
    assert second.usage.prompt_tokens_details.cached_tokens == 192 and sum(prefilled) == len(Q2) - 192
    with pytest.raises(ValueError, match="page_size"):
        _engine(embedded, page_size=32).load_prefix_cache(tmp_path / PREFIX_CACHE_FILE)


def test_llm_outputs_report_the_cached_prompt_tokens(embedded):
    """The Python API says how much of each prompt came from the cache (vLLM's RequestOutput.num_cached_tokens)."""
    from infinitehip import LLM

    llm = LLM.from_engine(_engine(embedded))
    (first,) = llm.generate([Q1], GREEDY)
    (second,) = llm.generate([Q2], GREEDY)
    assert (first.num_cached_tokens, second.num_cached_tokens) == (0, 192)
    (plain,) = LLM.from_engine(_engine(embedded, enable_prefix_caching=False)).generate([Q2], GREEDY)
    assert plain.num_cached_tokens == 0 and plain.token_ids == second.token_ids

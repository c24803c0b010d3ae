"""Several sequences decoding in one CUDA graph (engine/graph_decode.py; graph semantics on CPU through the closure
recorder, real graphs on a GPU): sequences of different lengths, so different capacity buckets and refresh phases,
decode the greedy tokens each decodes alone, and their steps replay graphs of the whole batch."""

from __future__ import annotations

import pytest
import torch

from infinitehip.attention.methods.hip.config import HiPConfig
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from tests.attention.test_infinitehip_method import SMALL
from tests.conftest import closure_graph_decoder, engine_for_dir, random_ids, run_staggered

# hip: every sequence here selects (from position 51); refreshes every 4 steps, so the sequences' phases differ
CONFIGS = {"dense": None, "infinitehip": InfiniteHiPConfig(**SMALL),
           "hip": HiPConfig(top_k_tokens=16, key_block_size=2, query_block_size=8, sink_tokens=4, window_tokens=16,
                            refresh_interval=4, dense_layers=1)}
# KV room for every sequence at once (a preempted sequence's recomputed prefill would end its chunks elsewhere)
ROOMY = dict(max_context_tokens=2048, kv_cache_tokens=4 * 2048, prefill_chunk_size=2048, max_num_seqs=4)


def _engine(path, method: str, graphs: bool, device: str = "cpu"):
    # Each prompt prefilled as one chunk, alone or beside others: infinitehip's pruned prefill depends on where
    # chunks end, which a shared token budget would move; the subject here is decode.
    engine = engine_for_dir(path, None, CONFIGS[method], method=method, device=device, **ROOMY,
                            cuda_graphs=graphs and device == "cuda")
    if graphs and device == "cpu":
        closure_graph_decoder(engine)
    return engine


def _decode(engine, requests: list[tuple[list[int], int, int]]) -> list[list[int]]:
    """requests: (prompt, tokens to decode, engine step at which it arrives) -> each one's greedy tokens."""
    return [s.output_ids for s in run_staggered(engine, requests)]


def _alone(path, method: str, requests, device: str = "cpu") -> list[list[int]]:
    return [_decode(_engine(path, method, False, device), [(p, n, 0)]) for p, n, _ in requests]


# 700 and 300 tokens: buckets 1024 and 512 (the batch's graphs sized for the larger); 505 crosses the 512 bucket
# while decoding and arrives 3 steps later (another refresh phase); sequences finish at different steps, so the
# batch shrinks to new compositions.
REQUESTS = [(random_ids(700, seed=31), 14, 0), (random_ids(300, seed=32), 10, 0), (random_ids(505, seed=33), 12, 3)]


def _record_graph_steps(decoder) -> list[tuple[tuple[int, ...], object]]:
    """(sequence ids, method key: a batch's, each sequence's) of every graph step the decoder runs from now on."""
    calls, step = [], decoder.step
    decoder.step = lambda seqs, tokens, key, own=None: calls.append((tuple(s.seq_id for s in seqs), own or key[1])) \
        or step(seqs, tokens, key, own)
    return calls


@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_a_batch_decodes_from_one_graph_the_tokens_of_each_sequence_alone(tiny_llama_dir, method):
    alone = [ids[0] for ids in _alone(tiny_llama_dir, method, REQUESTS)]
    engine = _engine(tiny_llama_dir, method, True)
    decoder = engine.runner.graph_decoder
    calls = _record_graph_steps(decoder)
    assert _decode(engine, REQUESTS) == alone
    assert decoder.batch_replays >= 1
    if method == "dense":  # one method key: every decode-only step is one graph of all its sequences
        assert {len(ids) for ids, _ in calls} == {1, 2, 3} and decoder.batch_replays >= 6
    # every composition that ended took its graphs with it (a sequence's release drops them)
    assert not decoder._graphs and not decoder._pools


# Refresh intervals 8/4/2: sequences arriving a step or two apart refresh different stages in the same step
PHASED = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": (8, 4, 2)})


def _phased(path):
    return engine_for_dir(path, None, PHASED, method="infinitehip", **ROOMY)


def test_sequences_in_different_refresh_phases_decode_in_one_graph(tiny_llama_dir):
    """Infinitehip's method key says which stages a step refreshes; sequences in different phases still decode in one
    graph (each one's refreshes masked by its own pattern), keyed by the union of their patterns, so graphs replay more
    often than they are captured; every sequence's tokens are those it decodes alone."""
    requests = [(random_ids(700, seed=31), 24, 0), (random_ids(600, seed=32), 24, 1), (random_ids(650, seed=34), 24, 2)]
    alone = [_decode(_phased(tiny_llama_dir), [(p, n, 0)])[0] for p, n, _ in requests]
    e = _phased(tiny_llama_dir)
    decoder = closure_graph_decoder(e)
    calls = _record_graph_steps(decoder)
    assert _decode(e, requests) == alone
    batched = [(ids, keys) for ids, keys in calls if len(ids) > 1]
    # one graph of every sequence, some refreshing and some not in the same step
    assert any(len(ids) == 3 for ids, _ in batched)
    mixed = [keys for _, keys in batched if len({key[0] for key in keys}) > 1]
    assert mixed and all(any(any(key[0]) for key in keys) for keys in mixed)
    assert decoder.batch_replays > 0 and decoder.replays > decoder.captures


def test_a_batch_at_different_phases_captures_one_graph_per_union_of_patterns(tiny_llama_dir):
    """Three sequences at different refresh phases decode together for several of their longest refresh cycles: a
    composition and bucket captures at most one graph per union of their patterns (with nested intervals: which of
    the stages refreshes at all), not one per tuple of patterns, and each sequence decodes its tokens alone."""
    requests = [(random_ids(700, seed=41), 30, 0), (random_ids(600, seed=42), 30, 1), (random_ids(650, seed=43), 30, 3)]
    alone = [_decode(_phased(tiny_llama_dir), [(p, n, 0)])[0] for p, n, _ in requests]
    e = _phased(tiny_llama_dir)
    decoder = closure_graph_decoder(e)
    steps, step = [], decoder.step

    def record(seqs, tokens, key, own=None):
        before = decoder.captures
        out = step(seqs, tokens, key, own)
        steps.append((tuple(s.seq_id for s in seqs), key, own, decoder.captures > before))
        return out

    decoder.step = record
    assert _decode(e, requests) == alone
    batched = [(ids, key[0]) for ids, key, own, _ in steps if len(ids) == 3]
    assert len(batched) >= 2 * 8
    for at in set(batched):
        mine = [(key, own, captured) for ids, key, own, captured in steps if (ids, key[0]) == at]
        unions = {key[1] for key, _, _ in mine}
        assert all(k[0] == "union" for k in unions) and len(unions) <= 4
        assert sum(captured for _, _, captured in mine) <= len(unions)
        # keyed by the tuple of patterns (as before) the same steps would have captured once per distinct tuple
        assert len({tuple(k[0] for k in own) for _, own, _ in mine}) > len(unions)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_a_batch_replayed_from_real_cuda_graphs_decodes_each_sequences_tokens(tiny_llama_dir, method):
    """Real CUDA graphs of a batch (no host copy inside a capture, every buffer alive while its graph is): the greedy
    tokens of the sequences decoded one by one without graphs."""
    alone = [ids[0] for ids in _alone(tiny_llama_dir, method, REQUESTS, device="cuda")]
    engine = _engine(tiny_llama_dir, method, True, device="cuda")
    assert _decode(engine, REQUESTS) == alone
    decoder = engine.runner.graph_decoder
    # dense: one key a composition, so every decode-only step of two or three sequences after the first replays;
    # infinitehip: a graph per union of the batch's refresh patterns, few of them seen within these few steps, so
    # its steps capture and at least one replays
    assert decoder.batch_replays >= (3 if method == "dense" else 1)


def test_a_composition_keeps_at_most_its_graph_limit_least_recently_replayed_out(tiny_llama_dir):
    """With room for two graphs a composition, the third capture drops the one replayed longest ago; the tokens stay
    those of each sequence alone."""
    requests = [(random_ids(700, seed=31), 16, 0), (random_ids(600, seed=32), 16, 1)]
    alone = [_decode(_phased(tiny_llama_dir), [(p, n, 0)])[0] for p, n, _ in requests]
    e = _phased(tiny_llama_dir)
    decoder = closure_graph_decoder(e)
    decoder.max_graphs_per_composition = 2
    sizes = []
    step = decoder.step
    decoder.step = lambda seqs, tokens, key, own=None: (step(seqs, tokens, key, own),
                                                        sizes.append(len(decoder._graphs[tuple(s.seq_id for s in seqs)])))[0]
    assert _decode(e, requests) == alone
    assert sizes and max(sizes) == 2 and decoder.captures > 2


def test_a_union_keyed_stage_scores_only_the_sequences_refreshing_it(tiny_llama_dir, monkeypatch):
    """A stage in the union runs for every sequence of the graph, but the ones not refreshing it get empty
    candidates (the scoring kernels read nothing for them); the refreshing ones get the scores an unmasked call
    gives. Fails if the mask empties the wrong rows or none."""
    from infinitehip.attention.methods.infinitehip import decode_batch

    requests = [(random_ids(700, seed=51), 12, 0), (random_ids(600, seed=52), 12, 1), (random_ids(650, seed=53), 12, 3)]
    inner, seen = decode_batch.stage_scores, []

    def checked(*args, active=None, **kwargs):
        out = inner(*args, active=active, **kwargs)
        if active is not None and not bool(active.all()):
            scores, _, lens, _ = out
            whole, _, whole_lens, _ = inner(*args, active=None, **kwargs)
            assert not bool(lens[~active].any())  # the others' candidates emptied
            torch.testing.assert_close(scores[active], whole[active])
            assert bool((lens[active] == whole_lens[active]).all())
            seen.append(int(active.sum()))
        return out

    monkeypatch.setattr(decode_batch, "stage_scores", checked)
    e = _phased(tiny_llama_dir)
    closure_graph_decoder(e)
    _decode(e, requests)
    assert seen  # some step refreshed a stage for part of the batch only

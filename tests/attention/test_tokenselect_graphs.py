"""TokenSelect's decode from CUDA graphs (tokenselect/graph_hooks.py; graph semantics on CPU through the closure
recorder, real graphs on a GPU): the greedy tokens and logits of graph decode are the eager engine's, for one
sequence and for a batch of sequences at different lengths, over steps where the Selection Cache hits and misses;
the static key lists (tokenselect/decode_lists.py) are the eager list code's, padded."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from infinitehip import SamplingParams
from infinitehip.attention.methods.tokenselect import method as method_module
from infinitehip.attention.methods.tokenselect.config import TokenSelectConfig
from infinitehip.attention.methods.tokenselect.decode_lists import decode_key_list, top_tokens, union_below
from infinitehip.attention.methods.tokenselect.graph_hooks import GRAPH_KEY
from tests.conftest import (decode_graph_keys, engine_for_dir, engine_with_graphs, random_ids, record_step_logits,
                            run_staggered)

# Sparse (32 of ~700 candidates), with question-time selection joining every step's. Threshold 0: the tiny random
# model's successive queries are nearly orthogonal, so about half the steps reuse their layer's selection.
CONFIG = TokenSelectConfig(select_tokens=32, sink_tokens=8, local_tokens=16, query_block_size=32, question_tokens=16,
                           question_select_tokens=16, vote_pool_size=5, selection_cache_threshold=0.0)
ROOMY = dict(max_context_tokens=2048, kv_cache_tokens=4 * 2048, prefill_chunk_size=2048, max_num_seqs=4)
# 700 and 300 tokens: buckets 1024 and 512 (a batch's graph sized for the larger); 505 crosses 512 while decoding
# and arrives 3 steps later; the sequences finish at different steps (new compositions).
BATCH = [(random_ids(700, seed=31), 12, 0), (random_ids(300, seed=32), 10, 0), (random_ids(505, seed=33), 12, 3)]


def _run(path, requests, graphs: bool, config: TokenSelectConfig = CONFIG, device: str = "cpu"):
    """requests: (prompt, tokens, arrival step) -> (greedy tokens, each step's logits, Selection Cache stats of
    each sequence, the graph decoder or None)."""
    engine, decoder = engine_with_graphs(path, config, "tokenselect", graphs, device, **ROOMY)
    logits = record_step_logits(engine)
    seqs = run_staggered(engine, requests)
    return [s.output_ids for s in seqs], logits, [engine.method.stats(s.method_state) for s in seqs], decoder


def _assert_same(eager, graph):
    assert graph[0] == eager[0]
    assert len(graph[1]) == len(eager[1])
    for e, g in zip(eager[1], graph[1]):  # bit-for-bit here; a tolerance for other CPUs' kernels
        torch.testing.assert_close(g, e, rtol=0, atol=1e-5)
    assert graph[2] == eager[2]  # the same hits and misses per sequence
    assert all(s["hits"] > 0 and s["misses"] > 0 for s in graph[2])


def test_one_sequence_decodes_from_graphs_the_eager_tokens_and_logits(tiny_llama_dir):
    requests = BATCH[:1]
    eager, graph = _run(tiny_llama_dir, requests, False), _run(tiny_llama_dir, requests, True)
    _assert_same(eager, graph)
    decoder = graph[3]
    # token 1 from the prefill, the first decode step eager (it allocates the rows), the second captured
    assert decoder.captures == 1 and decoder.replays == 12 - 3


def test_a_batch_at_different_lengths_decodes_from_one_graph_the_eager_tokens_and_logits(tiny_llama_dir):
    eager, graph = _run(tiny_llama_dir, BATCH, False), _run(tiny_llama_dir, BATCH, True)
    _assert_same(eager, graph)
    assert graph[3].batch_replays >= 1
    alone = [_run(tiny_llama_dir, [(p, n, 0)], False)[0][0] for p, n, _ in BATCH]
    assert graph[0] == alone


def test_graph_key_waits_for_the_rows_and_stays_eager_with_a_probe_or_host_reading_impls(tiny_llama_dir):
    engine = engine_for_dir(tiny_llama_dir, None, CONFIG, method="tokenselect", **ROOMY)
    keys = decode_graph_keys(engine)
    seq = engine.add_request(random_ids(300, seed=5), SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    while engine.has_work:
        engine.step()
    assert keys == [None, GRAPH_KEY, GRAPH_KEY]  # the first decode step allocates the rows
    reference = engine_for_dir(tiny_llama_dir, None, dataclasses.replace(CONFIG, impl="reference"),
                               method="tokenselect", **ROOMY).method
    assert not reference.graph_capturable()
    assert seq.method_state.rows is not None


# ---- static lists vs the eager list code --------------------------------------------------------------------
def _sorted_sample(gen, low: int, high: int, n: int) -> torch.Tensor:
    return (torch.randperm(max(0, high - low), generator=gen)[: min(n, max(0, high - low))] + low).sort().values


def test_static_lists_are_the_eager_lists_padded():
    gen = torch.Generator().manual_seed(3)
    method = method_module.TokenSelectAttention.__new__(method_module.TokenSelectAttention)
    method.config = TokenSelectConfig(select_tokens=12, sink_tokens=4, local_tokens=8, question_select_tokens=6)
    sink, k, q_width, width = 4, 12, 6, 96
    positions = torch.tensor([2, 10, 30, 60, 95])
    starts = torch.tensor([4, 4, 23, 20, 40])  # windows: inside the sink, fresh, stretched by reused steps
    rows = []
    for p, ws in zip(positions.tolist(), starts.tolist()):
        selected = _sorted_sample(gen, sink, ws, k)
        question = _sorted_sample(gen, sink, p + 1, q_width)  # some at or past the window start: dropped
        rows.append((selected, question))
    pad = lambda t, n: torch.nn.functional.pad(t, (0, n - t.numel()), value=7)  # padding of any value is unread
    sel = torch.stack([pad(s, k) for s, _ in rows])
    ques = torch.stack([pad(q, q_width) for _, q in rows])
    num_sel = torch.tensor([s.numel() for s, _ in rows])
    num_q = torch.tensor([q.numel() for _, q in rows])
    union, num_union = union_below(sel, num_sel, ques, num_q, starts)
    tokens, counts = decode_key_list(union, num_union, starts, positions, sink, width)
    for b, ((s, q), p, ws) in enumerate(zip(rows, positions.tolist(), starts.tolist())):
        want_union = method_module.union_below(s, q, ws)
        assert union[b, : int(num_union[b])].tolist() == want_union.tolist()
        want = method.key_list(want_union, ws, p)
        assert tokens[b, : int(counts[b])].tolist() == want.tolist()
        assert (tokens[b, int(counts[b]) :] == 0).all()


def test_top_tokens_are_the_top_votes_ties_to_the_lower_index_whatever_the_width():
    gen = torch.Generator().manual_seed(4)
    votes = torch.rand(3, 40, generator=gen)
    counts = torch.tensor([40, 25, 5])
    votes[1, 25:] = votes[2, 5:] = float("-inf")
    votes[0, 10:20] = 2.0  # a plateau of ties (as pooled votes make) across the top-k boundary
    got = top_tokens(votes, counts, 8)
    assert got[0].tolist() == list(range(10, 18))
    assert set(got[1].tolist()) == set(votes[1].topk(8).indices.tolist())
    assert got[2].tolist() == list(range(8))  # every candidate fits: all of them, then padding
    wider = torch.nn.functional.pad(votes, (0, 100), value=float("-inf"))
    assert torch.equal(top_tokens(wider, counts, 8), got)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
def test_real_cuda_graphs_decode_the_eager_tokens(tiny_llama_dir):
    eager = _run(tiny_llama_dir, BATCH, False, device="cuda")
    graph = _run(tiny_llama_dir, BATCH, True, device="cuda")
    assert graph[0] == eager[0] and graph[3].replays > 0 and graph[3].batch_replays >= 1

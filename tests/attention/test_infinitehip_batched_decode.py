"""A decode batch of `infinitehip` (attention/methods/infinitehip/decode_batch.py, deferred_saliency.py): its sequences'
query queueing, saliency updates and stage refreshes run once per pool for the whole batch, and every sequence still
gets the greedy tokens and the attention output of each decode step that it gets decoding alone. Sequences of
different lengths arrive at different steps, so their refresh phases differ (some refresh a stage in a step where
others do not)."""

from __future__ import annotations

import pytest
import torch

from infinitehip import SamplingParams
from infinitehip.attention.methods.infinitehip import deferred_saliency
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.attention.methods.infinitehip.decode_pool import DecodePools
from tests.attention.test_infinitehip_method import SMALL
from tests.conftest import engine_for_dir, random_ids

# KV room for every sequence at once, each prompt prefilled as one chunk (pruned prefill depends on where chunks end)
ROOMY = dict(max_context_tokens=2048, kv_cache_tokens=4 * 2048, prefill_chunk_size=2048, max_num_seqs=4)


def _decode(path, config, requests, first_rows: int = 16):
    """requests: (prompt, tokens, arrival step) decoded in one engine -> (tokens per request,
    {(request, position, layer): decode attention output [H, d]}, decode batch sizes seen). first_rows: the first
    pool's rows (decode_pool.py; fewer than the batch: its sequences in several pools)."""
    engine = engine_for_dir(path, None, config, method="infinitehip", **ROOMY)
    method, recorded, sizes, ids = engine.method, {}, [], {}
    method.pools = DecodePools(first_rows)
    inner = method.decode

    def recording(layer, q, seqs, batch):
        out = inner(layer, q, seqs, batch)
        sizes.append(len(seqs))
        for i, s in enumerate(seqs):
            recorded[ids[s.seq_id], s.start_pos, layer] = out[i].clone()
        return out

    method.decode = recording
    seqs, step = {}, 0
    while engine.has_work or len(seqs) < len(requests):
        for r, (prompt, n, at) in enumerate(requests):
            if at == step:
                seqs[r] = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
                ids[seqs[r].seq_id] = r
        engine.step()
        step += 1
    return [seqs[r].output_ids for r in range(len(requests))], recorded, sizes


def _alone(path, config, requests):
    tokens, recorded = [], {}
    for r, (prompt, n, _) in enumerate(requests):
        out, rec, _ = _decode(path, config, [(prompt, n, 0)])
        tokens += out
        recorded.update({(r, *key[1:]): v for key, v in rec.items()})
    return tokens, recorded


def _check(path, config, requests, rtol, atol, first_rows: int = 16):
    alone, rec_alone = _alone(path, config, requests)
    together, rec, sizes = _decode(path, config, requests, first_rows)
    assert together == alone
    assert max(sizes) == len(requests)  # the batch held every sequence at some step
    assert rec.keys() == rec_alone.keys()
    for key in rec:
        torch.testing.assert_close(rec[key], rec_alone[key], rtol=rtol, atol=atol, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("overrides,first_rows", [
    ({}, 16),
    ({}, 1),  # pools of 1, 1, 2 rows: the batch's sequences in several pools, batched per pool
    ({"refresh_intervals": (8, 4, 2), "question_tokens": 16, "question_keep_tokens": 32}, 16),  # the question's chunks
    ({"refresh_intervals": (8, 4, 2), "question_tokens": 16, "question_keep_tokens": 32}, 2),
    ({"representative": "bisection", "head_aggregation": "zscore"}, 16),
    ({"late_pruning_rope": "dynamic"}, 16),  # scored by token position: refreshes one sequence at a time
])
def test_batched_decode_equals_each_sequence_alone(tiny_llama_dir, overrides, first_rows):
    config = InfiniteHiPConfig(**{**SMALL, **overrides})
    requests = [(random_ids(700, seed=41), 10, 0), (random_ids(300, seed=42), 8, 0), (random_ids(505, seed=43), 9, 3)]
    _check(tiny_llama_dir, config, requests, rtol=1e-5, atol=1e-5, first_rows=first_rows)


def test_batched_decode_through_the_triton_kernels_equals_each_sequence_alone(tiny_llama_dir):
    """The same with the Triton kernels (interpreted on CPU): batched queue, saliency, salient tokens, representative
    scores and top chunks."""
    config = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": (4, 2, 2), "impl": "triton"})
    requests = [(random_ids(200, seed=44), 5, 0), (random_ids(160, seed=45), 4, 1)]
    _check(tiny_llama_dir, config, requests, rtol=1e-5, atol=1e-5)


def test_a_batch_queues_its_queries_in_one_call_per_layer(tiny_llama_dir, monkeypatch):
    """Three sequences decoding together: one queue call per layer and step for all of them, not one per sequence."""
    calls = []
    inner = deferred_saliency.queue_queries
    monkeypatch.setattr(deferred_saliency, "queue_queries", lambda q, *a, **kw: calls.append(q.shape[0]) or inner(q, *a, **kw))
    config = InfiniteHiPConfig(**SMALL)
    requests = [(random_ids(400, seed=46), 4, 0), (random_ids(300, seed=47), 4, 0), (random_ids(350, seed=48), 4, 0)]
    _decode(tiny_llama_dir, config, requests)
    assert 3 in calls and set(calls) <= {1, 3}

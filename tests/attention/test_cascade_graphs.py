"""The cascade's decode from CUDA graphs (cascade/graph_hooks.py, cascade/decode.py; graph semantics on CPU through
the closure recorder, real graphs on a GPU): the greedy tokens and every step's logits of graph decode are the
eager engine's bit for bit, for one sequence and a staggered batch, over decode steps that push the stride several
times (sub-caches filling, then evicting); one graph is captured and replayed for all of them; a replay reads no
host bookkeeping of the schedule and no device value back; the static decode attends exactly the keys the prefill
path lists."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import pytest
import torch

from infinitehip import SamplingParams
from infinitehip.attention.methods.cascade.config import CascadeConfig
from infinitehip.attention.methods.cascade.decode import step_keys
from infinitehip.attention.methods.cascade.graph_hooks import GRAPH_KEY
from infinitehip.attention.methods.cascade.schedule import CascadeSchedule
from infinitehip.engine.graph_decode import ClosureRecorder
from tests.conftest import (closure_graph_decoder, decode_graph_keys, engine_for_dir, engine_with_graphs, random_ids,
                            record_step_logits, run_staggered)

# 2 sinks + 5 sub-caches of 6 + a 6-token stride (38 slots): decode pushes every 6 steps; the cache fills after 89
# pushes, so the sub-caches fill (the held slots change) while the first ones already evict.
FILLING = CascadeConfig(sink_tokens=2, cache_tokens=32, num_subcaches=5, stride_tokens=6)
# 4 sinks + 3 sub-caches of 16 + a 24-token stride (76 slots): full after the first push, every push evicts.
FULL = CascadeConfig(sink_tokens=4, cache_tokens=52, num_subcaches=3, stride_tokens=24)
ROOMY = dict(max_context_tokens=2048, kv_cache_tokens=4 * 2048, prefill_chunk_size=48, max_num_seqs=4)
ONE = {"filling": (FILLING, [(random_ids(41, seed=3), 40, 0)]), "full": (FULL, [(random_ids(130, seed=4), 70, 0)])}
# 30 tokens: within FILLING's 38 slots (its first push comes in decode); 70 and 45: past them. Arrivals at steps
# 0, 0 and 5, ends apart (the batch changes composition).
BATCH = [(random_ids(30, seed=31), 30, 0), (random_ids(70, seed=32), 24, 0), (random_ids(45, seed=33), 28, 5)]


def _run(path, config: CascadeConfig, requests, graphs: bool, device: str = "cpu"):
    """requests: (prompt, tokens, arrival step) -> (greedy tokens, each step's logits, pushes each sequence's
    decode made, the graph decoder or None)."""
    engine, decoder = engine_with_graphs(path, config, "cascade", graphs, device, **ROOMY)
    # one step at a time (CUDA graphs on a GPU launch the next step ahead, so a late arrival joins a step later
    # than in the eager run and the steps' logits no longer line up; tests/engine/test_decode_ahead.py covers that)
    engine.ahead.enabled = False
    logits = record_step_logits(engine)
    decode_pushes: dict[int, int] = {}
    push = engine.method._push

    def counting_push(seq):
        if not seq.is_prefill:
            decode_pushes[seq.seq_id] = decode_pushes.get(seq.seq_id, 0) + 1
        return push(seq)

    engine.method._push = counting_push
    seqs = run_staggered(engine, requests)
    pushes = [decode_pushes.get(s.seq_id, 0) for s in seqs]
    return [s.output_ids for s in seqs], logits, pushes, decoder


def _assert_same(eager, graph):
    assert graph[0] == eager[0]
    assert len(graph[1]) == len(eager[1])
    for step, (e, g) in enumerate(zip(eager[1], graph[1])):
        torch.testing.assert_close(g, e, rtol=0, atol=0, msg=lambda m: f"step {step}: {m}")
    assert graph[2] == eager[2]


@pytest.mark.parametrize("case", sorted(ONE))
def test_one_sequence_decodes_from_graphs_the_eager_tokens_and_logits(tiny_llama_dir, case):
    config, requests = ONE[case]
    eager, graph = _run(tiny_llama_dir, config, requests, False), _run(tiny_llama_dir, config, requests, True)
    _assert_same(eager, graph)
    assert graph[2][0] >= 2  # the decode pushed the stride several times
    decoder, tokens = graph[3], requests[0][1]
    # token 1 from the prefill, the first decode step eager then captured, every later one replayed
    assert decoder.captures == 1 and decoder.replays == tokens - 2


def test_a_staggered_batch_decodes_from_one_graph_the_eager_tokens_and_logits(tiny_llama_dir):
    eager, graph = _run(tiny_llama_dir, FILLING, BATCH, False), _run(tiny_llama_dir, FILLING, BATCH, True)
    _assert_same(eager, graph)
    decoder = graph[3]
    assert min(graph[2]) >= 2 and decoder.batch_replays >= 10 and decoder.replays > decoder.captures
    alone = [_run(tiny_llama_dir, FILLING, [(p, n, 0)], False)[0][0] for p, n, _ in BATCH]
    assert graph[0] == alone


def test_steps_launched_ahead_decode_the_eager_tokens_and_logits(tiny_llama_dir):
    """Decode ahead (engine/decode_ahead.py): step n + 1 is launched before the host reads step n's tokens, after
    step n's push (the runner's after_forward follows each launch): the eager tokens and logits."""
    requests = [(p, n, 0) for p, n, _ in BATCH[:2]]
    eager = _run(tiny_llama_dir, FILLING, requests, False)
    engine = engine_for_dir(tiny_llama_dir, None, FILLING, method="cascade", **ROOMY)
    decoder = closure_graph_decoder(engine, min_bucket=256, ahead=True)
    logits, ahead = record_step_logits(engine), engine.runner.run_graph_ahead

    def recording(seqs):
        out = ahead(seqs)
        if out is not None:
            logits.append(out.clone())
        return out

    engine.runner.run_graph_ahead = recording
    greedy = lambda n: SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    seqs = [engine.add_request(p, greedy(n)) for p, n, _ in requests]
    launched = 0
    while engine.has_work:
        engine.step()
        launched += engine.ahead.pending is not None
    assert [s.output_ids for s in seqs] == eager[0]
    assert launched >= 20 and decoder.batch_replays >= 10
    assert len(logits) == len(eager[1])
    for step, (e, g) in enumerate(zip(eager[1], logits)):
        torch.testing.assert_close(g, e, rtol=0, atol=0, msg=lambda m: f"step {step}: {m}")


class _Replaying:
    active = False


class _GuardedRecorder(ClosureRecorder):
    """A replay during which the schedule's host state and device-to-host reads raise (what a CUDA graph could not
    see or do): the closure recorder re-runs Python, which would read the schedule as it is now."""

    def replay(self):
        _Replaying.active = True
        try:
            return super().replay()
        finally:
            _Replaying.active = False


@contextmanager
def _guarded(monkeypatch):
    get = CascadeSchedule.__getattribute__

    def schedule_attribute(self, name):
        if _Replaying.active:
            raise AssertionError(f"a graph replay read the schedule's {name}")
        return get(self, name)

    monkeypatch.setattr(CascadeSchedule, "__getattribute__", schedule_attribute)
    for name in ("item", "tolist", "__bool__"):
        inner = getattr(torch.Tensor, name)

        def host_read(self, *args, _inner=inner, _name=name, **kwargs):
            if _Replaying.active:
                raise AssertionError(f"a graph replay read a tensor back ({_name})")
            return _inner(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, host_read)
    yield


def test_a_replay_reads_no_schedule_and_no_device_value(tiny_llama_dir, monkeypatch):
    config, requests = ONE["filling"]
    want = _run(tiny_llama_dir, config, requests, False)[0]
    engine = engine_for_dir(tiny_llama_dir, None, config, method="cascade", **ROOMY)
    decoder = closure_graph_decoder(engine, min_bucket=256)
    decoder.recorder = _GuardedRecorder
    with _guarded(monkeypatch):
        assert [s.output_ids for s in run_staggered(engine, requests)] == want
    assert decoder.replays == requests[0][1] - 2


def test_static_decode_attends_the_keys_the_prefill_path_lists(tiny_llama_dir):
    """At every decode step (filling, then pushed several times) the visible slots and their positions are the
    prefill path's key list (method._keys: the held kept slots, the stride so far)."""
    engine = engine_for_dir(tiny_llama_dir, None, FILLING, method="cascade", **ROOMY)
    method, decode, checked = engine.method, engine.method.decode, []

    def checking(layer, q, seqs, batch):
        if layer == 0:
            keys = step_keys(batch, [s.state.decode_keys for s in seqs])
            for b, s in enumerate(seqs):
                method._keys(s.state, s.context_len, q.device)
                slots = torch.arange(s.context_len) if s.state.key_slots is None else s.state.key_slots
                assert torch.equal(keys.visible[b].nonzero()[:, 0], slots)
                assert torch.equal(keys.positions[b][slots], s.state.key_positions)
                assert torch.equal(keys.flat[b][slots], s.context_slots[slots])
                checked.append(s.state.schedule.counts.copy())
        return decode(layer, q, seqs, batch)

    method.decode = checking
    seq = engine.add_request(random_ids(41, seed=3), SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    while engine.has_work:
        engine.step()
    assert len(checked) == 39 and len({tuple(c) for c in checked}) >= 4  # the sub-caches' fill changed
    assert not seq.method_state.schedule.full


def test_graph_key_is_one_key_and_none_for_a_probe_or_the_reference_impl(tiny_llama_dir):
    engine = engine_for_dir(tiny_llama_dir, None, FULL, method="cascade", **ROOMY)
    keys = decode_graph_keys(engine)
    engine.add_request(random_ids(90, seed=5), SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    while engine.has_work:
        engine.step()
    assert keys == [GRAPH_KEY] * 4
    # impl "reference" decodes each token as a one-token chunk over host-made lists: every step eager
    reference = dataclasses.replace(FULL, impl="reference")
    ids, _, _, decoder = _run(tiny_llama_dir, reference, [(random_ids(90, seed=5), 30, 0)], True)
    assert decoder.captures == decoder.replays == 0
    assert ids == _run(tiny_llama_dir, FULL, [(random_ids(90, seed=5), 30, 0)], False)[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
def test_real_cuda_graphs_decode_the_eager_tokens(tiny_llama_dir):
    eager = _run(tiny_llama_dir, FILLING, BATCH, False, device="cuda")
    graph = _run(tiny_llama_dir, FILLING, BATCH, True, device="cuda")
    assert graph[0] == eager[0] and graph[3].replays > graph[3].captures and graph[3].batch_replays >= 1
    assert min(graph[2]) >= 2
    for e, g in zip(eager[1], graph[1]):  # the same kernels in and out of a graph
        torch.testing.assert_close(g, e, rtol=0, atol=1e-5)

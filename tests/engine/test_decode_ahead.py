"""Decode steps launched ahead (engine/decode_ahead.py), on the CPU under the tests' CUDA-graph stand-in: the same
tokens, text and finish reasons as one step at a time, with a finishing sequence's row of the step after it
dropped; launched for a lone greedy sequence and for a batch of greedy sequences decoding in one graph (sampling,
logprobs or a waiting request run one step at a time)."""

import pytest
import torch

from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.config.sampling import SamplingParams
from tests.attention.test_infinitehip_method import SMALL
from tests.conftest import closure_graph_decoder, engine_for_dir, random_ids

CONTEXT = 2048


def _engine(path, tokenizer, ahead: bool, **room):
    config = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": (8, 4, 2), "question_tokens": 16})
    engine = engine_for_dir(path, tokenizer, config, method="infinitehip", max_context_tokens=CONTEXT,
                            prefill_chunk_size=128, **room)
    closure_graph_decoder(engine, min_bucket=256, ahead=ahead)
    return engine


def _run(engine, requests):
    seqs = [engine.add_request(ids, params) for ids, params in requests]
    launched = 0
    while engine.has_work:
        engine.step()
        launched += engine.ahead.pending is not None
    return [(s.output_ids, s.output_text, s.finish_reason) for s in seqs], launched


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=["e"]),  # a stop string mid-answer
    SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True),
])
def test_steps_launched_ahead_give_the_same_answer(tiny_llama_dir, tokenizer, params):
    ids = random_ids(600, seed=3)
    want, none = _run(_engine(tiny_llama_dir, tokenizer, ahead=False), [(ids, params)])
    engine = _engine(tiny_llama_dir, tokenizer, ahead=True)
    got, launched = _run(engine, [(ids, params)])
    assert got == want and none == 0
    if params.max_tokens > 2 and not params.stop:
        assert launched >= params.max_tokens - 3  # every step but the first decode steps and the last went ahead
    assert engine.ahead.pending is None and not engine.scheduler.running


def test_not_launched_for_sampling_or_a_second_request(tiny_llama_dir, tokenizer):
    sampled = SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=1)
    engine = _engine(tiny_llama_dir, tokenizer, ahead=True)
    _, launched = _run(engine, [(random_ids(300, seed=4), sampled)])
    assert launched == 0
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    requests = [(random_ids(300, seed=5), greedy), (random_ids(200, seed=6), greedy)]
    want, _ = _run(_engine(tiny_llama_dir, tokenizer, ahead=False), requests)
    got, _ = _run(_engine(tiny_llama_dir, tokenizer, ahead=True), requests)
    assert got == want


def _run_arriving(engine, requests):
    """requests: (prompt, params, engine step at which it arrives) -> each one's (tokens, text, finish reason) and
    the sizes of the batches launched ahead."""
    seqs, step, sizes = {}, 0, []
    while engine.has_work or len(seqs) < len(requests):
        for r, (ids, params, at) in enumerate(requests):
            if at == step:
                seqs[r] = engine.add_request(ids, params)
        engine.step()
        step += 1
        if engine.ahead.pending is not None:
            sizes.append(len(engine.ahead.pending.seqs))
    return [(seqs[r].output_ids, seqs[r].output_text, seqs[r].finish_reason) for r in range(len(requests))], sizes


ROOM = dict(kv_cache_tokens=4 * CONTEXT, max_num_seqs=4)


def test_a_batch_launched_ahead_gives_each_sequence_its_answer(tiny_llama_dir, tokenizer):
    """Three greedy sequences at different refresh phases decode in one graph launched ahead; they finish at
    different steps (a length limit, a stop token), so rows are dropped from a step in flight and the rest
    decode on as a smaller batch; a request arriving mid-way runs its prefill one step at a time."""
    greedy = lambda n, **kw: SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)
    requests = [(random_ids(600, seed=11), greedy(30), 0), (random_ids(500, seed=12), greedy(30), 1),
                (random_ids(550, seed=13), greedy(24), 2), (random_ids(300, seed=14), greedy(8), 26)]
    unstopped, _ = _run_arriving(_engine(tiny_llama_dir, tokenizer, False, **ROOM), requests)
    # the second stops mid-answer at a token the host checks (a stop token, as EOS would): the step launched after
    # it holds its row for nothing, between the rows of the two others
    tokens = unstopped[1][0]
    at = next(i for i in range(12, len(tokens)) if tokens[i] not in tokens[:i])  # its first occurrence
    requests[1] = (requests[1][0], greedy(30, stop_token_ids=[tokens[at]]), 1)
    want, none = _run_arriving(_engine(tiny_llama_dir, tokenizer, False, **ROOM), requests)
    assert want[1][2] == "stop" and len(want[1][0]) == at + 1
    engine = _engine(tiny_llama_dir, tokenizer, True, **ROOM)
    got, sizes = _run_arriving(engine, requests)
    assert got == want and not none
    assert sizes.count(3) >= 4 and 2 in sizes  # batches of three went ahead, and of two once one finished
    assert engine.ahead.pending is None and not engine.scheduler.running


def test_a_batch_with_a_sampled_sequence_is_not_launched_ahead(tiny_llama_dir, tokenizer):
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    sampled = SamplingParams(temperature=0.8, max_tokens=10, ignore_eos=True, seed=2)
    requests = [(random_ids(400, seed=15), greedy, 0), (random_ids(300, seed=16), sampled, 0)]
    want, _ = _run_arriving(_engine(tiny_llama_dir, tokenizer, False, **ROOM), requests)
    got, sizes = _run_arriving(_engine(tiny_llama_dir, tokenizer, True, **ROOM), requests)
    assert got == want
    assert all(n == 1 for n in sizes)  # only the greedy one, once the sampled one has finished


@pytest.mark.skipif(not torch.cuda.is_available(), reason="real CUDA graphs")
def test_real_cuda_graphs_launched_ahead_decode_the_same_tokens(tiny_llama_dir):
    """On a GPU: a batch of three greedy sequences (one arriving late, ends apart) replayed from real CUDA graphs
    with the next step launched ahead decodes the tokens of the same graphs one step at a time."""
    config = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": (8, 4, 2), "question_tokens": 16})
    greedy = lambda n: SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)  # noqa: E731
    requests = [(random_ids(600, seed=21), greedy(30), 0), (random_ids(500, seed=22), greedy(20), 0),
                (random_ids(300, seed=23), greedy(16), 6)]
    runs = []
    for ahead in (False, True):
        engine = engine_for_dir(tiny_llama_dir, None, config, method="infinitehip", device="cuda", cuda_graphs=True,
                                max_context_tokens=CONTEXT, prefill_chunk_size=128, **ROOM)
        assert engine.runner.graph_decoder is not None
        engine.ahead.enabled = ahead
        got, sizes = _run_arriving(engine, requests)
        runs.append(([tokens for tokens, _, _ in got], sizes, engine.runner.graph_decoder.replays))
    (want, none, _), (got, sizes, replays) = runs
    assert got == want and not none and replays > 0
    assert max(sizes) >= 2  # a batch of several went ahead

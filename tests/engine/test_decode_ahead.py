"""Decode steps launched ahead (engine/decode_ahead.py), on the CPU under the tests' CUDA-graph stand-in: the same
tokens, text and finish reasons as one step at a time, with the step after a finishing one dropped; launched only
for a lone greedy sequence (a second request, sampling or logprobs run one step at a time)."""

import pytest

from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.config.sampling import SamplingParams
from tests.attention.test_infinitehip_method import SMALL
from tests.conftest import closure_graph_decoder, engine_for_dir, random_ids

CONTEXT = 2048


def _engine(path, tokenizer, ahead: bool):
    config = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": (8, 4, 2), "question_tokens": 16})
    engine = engine_for_dir(path, tokenizer, config, method="infinitehip", max_context_tokens=CONTEXT,
                            prefill_chunk_size=128)
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

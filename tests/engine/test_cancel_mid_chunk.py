"""A sequence cancelled while its prefill chunk runs (a client gone, LLMEngine.request_cancel from another thread)
stops at the next layer: the layers after it never run, the step keeps nothing, abort frees every page, and the
engine's next answers equal a fresh engine's."""

from __future__ import annotations

from infinitehip import SamplingParams
from tests.conftest import engine_for_dir, generate_greedy, random_ids

PROMPT = random_ids(200, seed=5)


def _engine(tiny_llama_dir, tokenizer):
    return engine_for_dir(tiny_llama_dir, tokenizer, max_context_tokens=512, page_size=16, prefill_chunk_size=256)


def test_cancel_inside_a_chunk_stops_at_the_next_layer(tiny_llama_dir, tokenizer):
    engine = _engine(tiny_llama_dir, tokenizer)
    allocator = engine.scheduler.allocator
    free = allocator.num_free
    seq = engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    layers_run, method = [], engine.runner.method
    inner = method.__call__

    class Watching(type(method)):  # the method itself, observed: the cancel arrives while layer 0 runs
        def __call__(self, layer, q, k, v, batch):
            layers_run.append(layer)
            if layer == 0:
                engine.request_cancel(seq)
            return inner(layer, q, k, v, batch)

    method.__class__ = Watching
    try:
        assert engine.step() == ([], 0)
    finally:
        method.__class__ = Watching.__bases__[0]
    assert layers_run == [0] and engine.model_config.num_layers > 1
    assert seq.num_computed == 0  # nothing of the chunk counted
    engine.abort(seq)
    assert allocator.num_free == free and not engine.has_work
    again = generate_greedy(engine, PROMPT, 6).output_ids
    assert again == generate_greedy(_engine(tiny_llama_dir, tokenizer), PROMPT, 6).output_ids


def test_a_step_with_a_live_sequence_is_not_stopped(tiny_llama_dir, tokenizer):
    """Only a step of cancelled sequences stops: one that also runs a live sequence goes on."""
    engine = _engine(tiny_llama_dir, tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    gone = engine.add_request(PROMPT[:100], params)
    live = engine.add_request(PROMPT[100:], params)
    engine.request_cancel(gone)
    outputs, prefilled = engine.step()
    assert prefilled == 200 and {o.seq.seq_id for o in outputs} == {gone.seq_id, live.seq_id}
    engine.abort(gone)
    while engine.has_work:
        engine.step()
    alone = generate_greedy(_engine(tiny_llama_dir, tokenizer), PROMPT[100:], 3).output_ids
    assert live.output_ids == alone

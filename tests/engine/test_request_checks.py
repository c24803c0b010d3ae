"""What the engine checks of a request before it runs: token ids inside the vocabulary (an id past the embedding
would fail the whole step), and an omitted max_tokens bounded by the KV cache instead of refused for it."""

from __future__ import annotations

import pytest

from infinitehip import SamplingParams
from tests.conftest import engine_for_dir, random_ids


def _engine(tiny_llama_dir, tokenizer, **config):
    return engine_for_dir(tiny_llama_dir, tokenizer, **{"max_context_tokens": 512, "page_size": 16, **config})


def test_token_ids_outside_the_vocabulary_are_refused(tiny_llama_dir, tokenizer):
    engine = _engine(tiny_llama_dir, tokenizer)
    vocab = engine.model_config.vocab_size
    for prompt in ([1, 2, vocab], [-1, 2]):
        with pytest.raises(ValueError, match=rf"prompt token ids must be in \[0, {vocab}\)"):
            engine.add_request(prompt, SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="stop_token_ids must be token ids"):
        engine.add_request([1, 2], SamplingParams(max_tokens=2, stop_token_ids=(vocab,)))
    assert not engine.has_work


def test_omitted_max_tokens_takes_what_the_kv_cache_leaves(tiny_llama_dir, tokenizer):
    engine = _engine(tiny_llama_dir, tokenizer, kv_cache_tokens=128)
    assert engine.max_context_tokens == 512 and engine.max_sequence_tokens == 128
    prompt = random_ids(40)
    assert engine.check_request(prompt, None) == (prompt, 128 - 40)
    with pytest.raises(ValueError, match="lower max_tokens or raise kv-cache-tokens"):
        engine.check_request(prompt, 100)  # asked for: refused, never cut
    assert _engine(tiny_llama_dir, tokenizer).check_request(prompt, None) == (prompt, 512 - 40)


def test_over_length_message_counts_the_completion_asked(tiny_llama_dir, tokenizer):
    engine = _engine(tiny_llama_dir, tokenizer)
    with pytest.raises(ValueError, match=r"requested 520 tokens \(512 in the prompt, 8 for the completion\)"):
        engine.check_request(random_ids(512), 8)
    with pytest.raises(ValueError, match=r"requested at least 513 tokens \(512 in the prompt, at least 1 for"):
        engine.check_request(random_ids(512), None)

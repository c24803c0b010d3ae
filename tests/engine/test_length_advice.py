"""What the engine says about a request's length: a refusal at the trained length names the methods that read past
it; dense past the trained length warns on every request; the embedded SmolLM2 says once that long prose is past
what it reads reliably."""

from __future__ import annotations

import logging

import pytest

from infinitehip import EngineConfig, SamplingParams
from infinitehip.config.methods import METHODS
from infinitehip.engine.length_advice import AUTO_METHOD, EMBEDDED_PROSE_TOKENS
from infinitehip.engine.llm_engine import ContextLengthError, LLMEngine
from tests.conftest import engine_for_dir, random_ids

PAST_TRAINED = "past the model's trained length"


def _admit(engine, n: int, max_tokens: int = 4) -> None:
    """Queue a request of n prompt tokens and drop it: the warnings come on admission, before any step."""
    engine.abort(engine.add_request(random_ids(n, seed=n), SamplingParams(max_tokens=max_tokens)))


def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


def test_dense_refusal_at_the_trained_length_names_the_methods_that_read_past_it(tiny_llama_dir):
    engine = engine_for_dir(tiny_llama_dir, method="dense")
    trained = engine.model_config.max_position_embeddings
    assert engine.max_context_tokens == trained
    methods = engine.length_advice.long_context_methods
    assert "infinitehip" in methods and "tokenselect" in methods
    assert "dense" not in methods and "truncate" not in methods
    with pytest.raises(ContextLengthError) as refused:
        engine.check_request(random_ids(trained + 50), 4)
    message = str(refused.value)
    assert all(name in message for name in methods) and f"trained length ({trained} tokens)" in message
    if AUTO_METHOD in METHODS:
        assert repr(AUTO_METHOD) in message
    sparse = engine_for_dir(tiny_llama_dir, method="infinitehip", max_context_tokens=trained)
    with pytest.raises(ContextLengthError, match="Raise max-context-tokens"):  # it reads past: a larger limit does
        sparse.check_request(random_ids(trained + 50), 4)


def test_dense_past_the_trained_length_warns_on_every_request(tiny_llama_dir, caplog):
    engine = engine_for_dir(tiny_llama_dir, method="dense", max_context_tokens=8192)
    trained = engine.model_config.max_position_embeddings
    with caplog.at_level(logging.WARNING, logger="infinitehip"):
        _admit(engine, trained - 100)  # prompt and max_tokens inside the trained positions
        _admit(engine, trained + 100)
        _admit(engine, trained + 200)
        _admit(engine, trained - 2, max_tokens=8)  # its completion crosses the trained length
    warned = _warnings(caplog, PAST_TRAINED)
    assert len(warned) == 3, warned
    assert f"prompt {trained + 100} + max_tokens 4" in warned[0]
    assert all(name in warned[0] for name in engine.length_advice.long_context_methods)
    assert not _warnings(caplog, "SmolLM2")  # not the embedded model
    caplog.clear()
    sparse = engine_for_dir(tiny_llama_dir, method="streaming", max_context_tokens=8192)
    with caplog.at_level(logging.WARNING, logger="infinitehip"):
        _admit(sparse, trained + 100)
    assert not _warnings(caplog, PAST_TRAINED)


def test_the_embedded_model_says_once_that_long_prose_is_past_what_it_reads(caplog):
    engine = LLMEngine(EngineConfig(method="dense", show_progress=False))  # the warning is the model's, any method
    with caplog.at_level(logging.WARNING, logger="infinitehip"):
        _admit(engine, EMBEDDED_PROSE_TOKENS - 96)
        assert not caplog.records
        _admit(engine, EMBEDDED_PROSE_TOKENS + 100)
        _admit(engine, EMBEDDED_PROSE_TOKENS + 200)
    (warned,) = _warnings(caplog, "SmolLM2")
    assert "make install-gemma" in warned and "gemma3-270m" in warned and f"{EMBEDDED_PROSE_TOKENS + 100}" in warned
    assert not _warnings(caplog, PAST_TRAINED)  # inside its trained 8K

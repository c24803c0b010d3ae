"""`auto`, the default method: within the model's trained length it reads as `dense` does (the same logits at
every step, prefill and decode); past it, where dense refuses, InfiniteHiP's pruned stages read the chunks whose
context exceeds the trained length, and only those."""

from __future__ import annotations

import pytest
import torch

from conftest import engine_for_dir, generate_greedy, random_ids, record_step_logits
from infinitehip.attention.methods.infinitehip.method import InfiniteHiPAttention
from infinitehip.config.engine import EngineConfig
from infinitehip.config.methods import method_spec
from infinitehip.engine.llm_engine import ContextLengthError

TRAINED = 4096  # the tiny Llama's max_position_embeddings (conftest TINY_CONFIGS["llama3"])


def test_auto_is_the_default_method():
    assert EngineConfig().method == "auto"
    assert method_spec("auto").config().dense_within_trained
    assert not method_spec("infinitehip").config().dense_within_trained


@pytest.mark.parametrize("prompt_tokens", [300, 2500])
def test_within_the_trained_length_auto_equals_dense(tiny_llama_dir, prompt_tokens):
    ids = random_ids(prompt_tokens, seed=3)
    runs = {}
    for method in ("dense", "auto"):
        engine = engine_for_dir(tiny_llama_dir, method=method, max_context_tokens=TRAINED, prefill_chunk_size=1024)
        logits = record_step_logits(engine)
        seq = generate_greedy(engine, ids, 6)
        runs[method] = (seq.output_ids, torch.cat([x[-1:] for x in logits]))
    assert runs["auto"][0] == runs["dense"][0]
    torch.testing.assert_close(runs["auto"][1], runs["dense"][1], rtol=1e-4, atol=1e-4)


def test_past_the_trained_length_auto_prunes_only_the_chunks_beyond_it(tiny_llama_dir, monkeypatch):
    ids = random_ids(TRAINED + 1500, seed=5)
    dense = engine_for_dir(tiny_llama_dir, method="dense", prefill_chunk_size=1024)
    with pytest.raises(ContextLengthError):
        dense.add_request(ids, __import__("infinitehip").SamplingParams(max_tokens=4))
    pruned_contexts = []
    stage = InfiniteHiPAttention._stage

    def spy(self, spec, blocks, parent, layer, seq, *args, **kwargs):
        pruned_contexts.append(seq.context_len)
        return stage(self, spec, blocks, parent, layer, seq, *args, **kwargs)

    monkeypatch.setattr(InfiniteHiPAttention, "_stage", spy)
    engine = engine_for_dir(tiny_llama_dir, method="auto", max_context_tokens=8192, prefill_chunk_size=1024)
    seq = generate_greedy(engine, ids, 4)
    assert len(seq.output_ids) == 4
    assert pruned_contexts and min(pruned_contexts) > TRAINED  # chunks within the trained length ran exactly
    assert max(pruned_contexts) == len(ids)  # the prompt's last chunk was pruned

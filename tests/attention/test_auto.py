"""`auto`, the default method: up to half the model's trained length it reads as `dense` does (the same logits at
every step, prefill and decode); past that, InfiniteHiP's pruned stages read the chunks whose context exceeds the
share, and only those, within the trained length too; dense still refuses past the trained length."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import engine_for_dir, generate_greedy, random_ids, record_step_logits
from infinitehip.attention.methods.infinitehip.method import InfiniteHiPAttention
from infinitehip.config.engine import EngineConfig
from infinitehip.config.methods import method_spec
from infinitehip.engine.llm_engine import ContextLengthError

TRAINED = 4096  # the tiny Llama's max_position_embeddings (conftest TINY_CONFIGS["llama3"])
EXACT = TRAINED // 2  # auto's exact span: half the trained length (auto/presets.py AUTO_DENSE_SHARE)


def test_auto_is_the_default_method():
    assert EngineConfig().method == "auto"
    assert method_spec("auto").config().dense_within_trained
    assert not method_spec("infinitehip").config().dense_within_trained
    assert method_spec("auto").config().dense_within_share * TRAINED == EXACT


def test_dense_within_share_is_checked():
    with pytest.raises(ValueError, match="dense_within_share"):
        dataclasses.replace(method_spec("auto").config(), dense_within_share=0.0)
    with pytest.raises(ValueError, match="dense_within_share"):
        dataclasses.replace(method_spec("auto").config(), dense_within_share=1.5)


@pytest.mark.parametrize("prompt_tokens", [300, EXACT - 6])
def test_within_the_exact_share_auto_equals_dense(tiny_llama_dir, prompt_tokens):
    ids = random_ids(prompt_tokens, seed=3)
    runs = {}
    for method in ("dense", "auto"):
        engine = engine_for_dir(tiny_llama_dir, method=method, max_context_tokens=TRAINED, prefill_chunk_size=1024)
        logits = record_step_logits(engine)
        seq = generate_greedy(engine, ids, 6)
        runs[method] = (seq.output_ids, torch.cat([x[-1:] for x in logits]))
    assert runs["auto"][0] == runs["dense"][0]
    torch.testing.assert_close(runs["auto"][1], runs["dense"][1], rtol=1e-4, atol=1e-4)


def spy_pruned_contexts(monkeypatch) -> list[int]:
    """The context length of every pruning stage InfiniteHiP runs from here on."""
    pruned_contexts = []
    stage = InfiniteHiPAttention._stage

    def spy(self, spec, blocks, parent, layer, seq, *args, **kwargs):
        pruned_contexts.append(seq.context_len)
        return stage(self, spec, blocks, parent, layer, seq, *args, **kwargs)

    monkeypatch.setattr(InfiniteHiPAttention, "_stage", spy)
    return pruned_contexts


def test_between_the_share_and_the_trained_length_auto_prunes_and_the_share_is_a_setting(tiny_llama_dir,
                                                                                       monkeypatch):
    """Past half the trained length auto prunes (dense would still accept the prompt); with dense_within_share 1
    it reads that prompt as dense does."""
    ids = random_ids(EXACT + 900, seed=4)
    pruned = spy_pruned_contexts(monkeypatch)
    engine = engine_for_dir(tiny_llama_dir, method="auto", max_context_tokens=TRAINED, prefill_chunk_size=1024)
    generate_greedy(engine, ids, 2)
    assert pruned and min(pruned) > EXACT and max(pruned) == len(ids)
    pruned.clear()
    whole = dataclasses.replace(method_spec("auto").config(), dense_within_share=1.0)
    runs = {}
    for method, config in (("dense", None), ("auto", whole)):
        engine = engine_for_dir(tiny_llama_dir, method=method, method_config=config, max_context_tokens=TRAINED,
                                prefill_chunk_size=1024)
        logits = record_step_logits(engine)
        runs[method] = (generate_greedy(engine, ids, 4).output_ids, torch.cat([x[-1:] for x in logits]))
    assert not pruned
    assert runs["auto"][0] == runs["dense"][0]
    torch.testing.assert_close(runs["auto"][1], runs["dense"][1], rtol=1e-4, atol=1e-4)


def test_past_the_trained_length_auto_prunes_only_the_chunks_beyond_the_share(tiny_llama_dir, monkeypatch):
    ids = random_ids(TRAINED + 1500, seed=5)
    dense = engine_for_dir(tiny_llama_dir, method="dense", prefill_chunk_size=1024)
    with pytest.raises(ContextLengthError):
        dense.add_request(ids, __import__("infinitehip").SamplingParams(max_tokens=4))
    pruned_contexts = spy_pruned_contexts(monkeypatch)
    engine = engine_for_dir(tiny_llama_dir, method="auto", max_context_tokens=8192, prefill_chunk_size=1024)
    seq = generate_greedy(engine, ids, 4)
    assert len(seq.output_ids) == 4
    assert pruned_contexts and min(pruned_contexts) > EXACT  # chunks within the exact share ran exactly
    assert max(pruned_contexts) == len(ids)  # the prompt's last chunk was pruned


def test_auto_decode_replays_graphs_within_and_past_the_trained_length(tiny_llama_dir):
    """Graph decode (CUDA-graph semantics on CPU): the steps within the exact share replay one exact graph (dense's
    paged op, no host state), the steps past it switch to the pruned keys; tokens and logits are the eager engine's."""
    from conftest import closure_graph_decoder
    from infinitehip.attention.methods.infinitehip.graph_hooks import EXACT_STEP

    ids, steps = random_ids(EXACT - 4, seed=8), 10

    def run(graphs: bool):
        engine = engine_for_dir(tiny_llama_dir, method="auto", max_context_tokens=8192, prefill_chunk_size=1024)
        keys = []
        if graphs:
            decoder = closure_graph_decoder(engine, min_bucket=256)
            key = decoder.key
            decoder.key = lambda seq: keys.append(key(seq)) or keys[-1]
        logits = record_step_logits(engine)
        seq = generate_greedy(engine, ids, steps)
        return seq.output_ids, torch.cat([x[-1:] for x in logits]), keys, engine.runner.graph_decoder

    eager_ids, eager_logits, _, _ = run(False)
    ids_g, logits_g, keys, decoder = run(True)
    assert ids_g == eager_ids
    torch.testing.assert_close(logits_g, eager_logits, rtol=1e-5, atol=1e-5)
    method_keys = [None if k is None else k[1] for k in keys]
    exact = [k == EXACT_STEP for k in method_keys]
    assert exact[:3] == [True] * 3 and not any(exact[5:])  # within: exact; past EXACT: pruned (or eager)
    assert decoder.replays >= 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
@pytest.mark.parametrize("method", ["dense", "auto"])
def test_cuda_graph_decode_equals_eager_on_the_gpu(tiny_llama_dir, method):
    """Real CUDA graphs of dense's paged decode op (dense, and auto within its exact share): captured, replayed,
    the same greedy tokens as the eager engine."""
    ids = random_ids(600, seed=9)
    runs = {}
    for graphs in (False, True):
        engine = engine_for_dir(tiny_llama_dir, method=method, device="cuda", max_context_tokens=2048,
                                prefill_chunk_size=256, cuda_graphs=graphs)
        runs[graphs] = (generate_greedy(engine, ids, 24).output_ids, engine.runner.graph_decoder)
    assert runs[True][0] == runs[False][0]
    decoder = runs[True][1]
    assert decoder is not None and decoder.captures >= 1 and decoder.replays >= 20


# Both prompts end 8 tokens past the grid, where the two rules part: a hit of 1792 or 1536, of 2304 or 2048.
@pytest.mark.parametrize("prompt_tokens, end_tokens", [(7 * 256 + 8, 1), (9 * 256 + 8, 32)])
def test_the_question_is_kept_whole_only_where_auto_selects_at_the_prompt_end(tiny_llama_dir, prompt_tokens,
                                                                             end_tokens):
    """Within the exact share nothing is selected at the prompt's end: the last chunk and a prefix hit follow the
    grid as dense's do; past it the question's 32 queries stay in the last chunk and out of a prefix hit."""
    engine = engine_for_dir(tiny_llama_dir, max_context_tokens=TRAINED, prefill_chunk_size=256, page_size=16)
    assert engine.method.name == "auto" and engine.method.prompt_end_tokens(prompt_tokens) == end_tokens
    doc = random_ids(prompt_tokens - 8, seed=5)
    generate_greedy(engine, doc, 2)
    chunks, run = [], engine.runner.run
    engine.runner.run = lambda plan: (chunks.extend(n for _, n in plan.prefill), run(plan))[1]
    seq = generate_greedy(engine, doc + random_ids(8, seed=6), 2)
    grid = 256  # lcm(page 16, chunk 256): InfiniteHiP's prefix reuse is chunk-aligned
    assert seq.cached_prompt_tokens == (prompt_tokens - end_tokens) // grid * grid
    assert chunks[-1] >= min(end_tokens, prompt_tokens - seq.cached_prompt_tokens)

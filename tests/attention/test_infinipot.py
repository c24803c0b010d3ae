"""The `infinipot` method in the engine: a fixed KV pot (tiny random Llama-3 model, fp32), its distillation
against oracles recomputed with Hugging Face transformers, and the embedded model finding a passkey."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from infinitehip import LLM, EngineConfig, SamplingParams
from infinitehip.attention.methods.infinipot import method as infinipot_method
from infinitehip.attention.methods.infinipot.config import PRESETS, InfiniPotConfig
from infinitehip.attention.registry import create_method
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.eval.passkey import make_passkey_sample
from infinitehip.model.gguf_convert import default_cache_root
from infinitehip.model.loading import load_model
from tests.conftest import TINY_CONFIGS, engine_for_dir, random_ids

PAGE = 16
# Encodes (embedded tokenizer) to 5 ids below 512, inside the tiny models' vocabulary.
CATALYST = "in the re on at"
# The paper's mechanics (no question tail, per-token top-k) unless a test sets them: the oracles below follow them.
PAPER = dict(question_tokens=0, pool_tokens=1)
SMALL = InfiniPotConfig(pot_tokens=160, compressed_tokens=48, novelty_fraction=0.5, catalyst_prompt=CATALYST, **PAPER)


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    """(HF model with eager attention, so it returns attention probabilities; its saved directory)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(TINY_CONFIGS["llama3"](), attn_implementation="eager").eval()
    path = tmp_path_factory.mktemp("llama3_pot")
    model.save_pretrained(path)
    return model, path


def _engine(path, tokenizer, config=SMALL, method="infinipot", **kw):
    return engine_for_dir(path, tokenizer, config if method == "infinipot" else None, method=method,
                          **{"page_size": PAGE, "prefill_chunk_size": 64, "max_context_tokens": 8192, **kw})


def _run(engine, ids, max_tokens, on_step=lambda seq: None):
    """Greedy generation step by step -> (sequence, logits [1, vocab] of every sampling step)."""
    seq = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    logits, run = [], engine.runner.run

    def recording_run(plan):
        samplers, out = run(plan)
        logits.extend(out[i : i + 1].clone() for i, s in enumerate(samplers) if s is seq)
        return samplers, out

    engine.runner.run = recording_run
    while engine.has_work:
        engine.step()
        if not seq.is_finished:
            on_step(seq)
    return seq, logits


@pytest.fixture
def distillations(monkeypatch):
    """Records every distillation: the cache before it, the slots kept and what the pot held."""
    records = []
    compact = infinipot_method.compact_cache

    def recording_compact(cache, page_table, keep):
        S = int(keep.max()) + 1
        slots = cache.slots(page_table, 0, len(page_table) * cache.page_size)
        before = [(cache.read(layer, slots)) for layer in range(cache.num_layers)]
        compact(cache, page_table, keep)
        after = [(cache.read(layer, slots)) for layer in range(cache.num_layers)]
        records.append(dict(keep=keep.clone(), before=before, after=after, max_kept_slot=S - 1))

    monkeypatch.setattr(infinipot_method, "compact_cache", recording_compact)
    return records


def test_pot_is_never_exceeded_and_positions_restart_after_each_distillation(llama3, tokenizer, distillations):
    _, path = llama3
    engine = _engine(path, tokenizer)
    limit, C = engine.method.kv_token_limit, SMALL.compressed_tokens
    assert limit + engine.method.kv_scratch_tokens == SMALL.pot_tokens
    seen = []

    def check(seq):
        st = seq.method_state
        assert seq.num_cached <= limit and len(seq.page_table) * PAGE <= SMALL.pot_tokens
        held = st.slot_tokens[:, :, : seq.num_cached]
        assert (held.diff(dim=2) > 0).all()  # every head keeps its tokens in their original order
        if st.distillations:  # new tokens sit at slots C.. (positions C..), one after another
            new = held[:, :, C:]
            assert torch.equal(new, (seq.num_computed - new.shape[2] + torch.arange(new.shape[2])).expand_as(new))
        seen.append((seq.num_computed, seq.num_cached, st.distillations))

    seq, _ = _run(engine, random_ids(1000), max_tokens=150, on_step=check)
    prefill_cycles = [d for n, _, d in seen if n <= 1000][-1]
    assert prefill_cycles == (1000 - limit) // (limit - C) + 1 and seen[-1][2] > prefill_cycles  # decode distilled too
    assert {n for _, n, d in seen if d} >= {C}
    for r in distillations:  # slots 0..C-1 hold exactly the kept k/v, per head
        keep = r["keep"]
        assert keep.shape[2] == C and r["max_kept_slot"] < limit
        for layer, ((k0, v0), (k1, v1)) in enumerate(zip(r["before"], r["after"])):
            for h in range(keep.shape[1]):
                assert torch.equal(k1[:C, h], k0[keep[layer, h], h]) and torch.equal(v1[:C, h], v0[keep[layer, h], h])


def test_sink_tokens_are_kept_by_every_layer_and_head(llama3, tokenizer, distillations):
    _, path = llama3
    config = dataclasses.replace(SMALL, sink_tokens=4)
    engine = _engine(path, tokenizer, config)
    seq, _ = _run(engine, random_ids(700, seed=5), max_tokens=1)
    assert len(distillations) >= 3
    held = seq.method_state.slot_tokens[:, :, : config.compressed_tokens]
    assert torch.equal(held[:, :, :4], torch.arange(4).expand_as(held[:, :, :4]))  # slots 0..3: tokens 0..3
    assert (held[:, :, 4:] >= 4).all()
    # without sinks the catalyst's per-head scores drop some of them in some rows (this input, this model)
    seq, _ = _run(_engine(path, tokenizer), random_ids(700, seed=5), max_tokens=1)
    plain = seq.method_state.slot_tokens[:, :, : SMALL.compressed_tokens]
    assert not all(bool((plain == t).any(dim=2).all()) for t in range(4))


def test_catalyst_tokens_are_never_kept(llama3, tokenizer, distillations):
    _, path = llama3
    engine = _engine(path, tokenizer)
    limit, P, C = engine.method.kv_token_limit, engine.method.kv_scratch_tokens, SMALL.compressed_tokens
    seq, _ = _run(engine, random_ids(700, seed=3), max_tokens=1)
    assert distillations
    for r in distillations:
        assert int(r["keep"].max()) < limit  # only pot slots are candidates
        # Layer 0's keys depend on the token id only (a pot token may share one with the catalyst): layers 1+.
        for (k0, _), (k1, _) in list(zip(r["before"], r["after"]))[1:]:
            catalyst_k = k0[limit : limit + P]  # [P, Hkv, d]: the catalyst's keys, in the scratch slots
            assert not torch.isclose(k1[:C, None], catalyst_k[None]).all(-1).any()
    assert (seq.method_state.slot_tokens[:, :, :C] < 700).all()


def _oracle_first_distillation(model, ids, catalyst_ids, config, chunk, num_kv_heads, pool=1):
    """Token sets [L][Hkv] the paper's rule keeps from a pot holding ids (all tokens, positions 0..S-1)."""
    S, C, T = len(ids), config.compressed_tokens, config.novelty_tokens
    with torch.no_grad():
        out = model(torch.tensor([ids + catalyst_ids]), output_attentions=True)
    nll = torch.nn.functional.cross_entropy(out.logits[0, : S - 1], torch.tensor(ids[1:]), reduction="none")
    nll = torch.cat([torch.zeros(1), nll])
    known = torch.ones(S, dtype=torch.bool)
    known[::chunk] = False  # the first token of each prefill step has no NLL in the engine
    novel = torch.arange(S)[known][nll[known].topk(T).indices] if T else torch.zeros(0, dtype=torch.long)
    kept = []
    for attn in out.attentions:  # [1, H, S + P, S + P]
        cap = attn[0, :, S:, :S].sum(1)  # [H, S]: the catalyst queries' attention to the pot
        cap = cap.view(num_kv_heads, -1, S).sum(1)  # query heads of a KV group added
        # pool: each slot scores the max over the `pool` slots centred on it (edges padded with -inf)
        cap = torch.nn.functional.pad(cap, (pool // 2, pool // 2), value=float("-inf")).unfold(1, pool, 1).amax(-1)
        cap[:, novel] = float("-inf")
        kept.append([set(novel.tolist()) | set(cap[h].topk(C - T).indices.tolist()) for h in range(num_kv_heads)])
    return set(novel.tolist()), kept


@pytest.mark.parametrize("novelty_fraction,question_tokens,pool", [(0.0, 0, 1), (0.5, 0, 1), (0.5, 8, 1), (0.25, 8, 5)])
def test_first_distillation_matches_oracle(llama3, tokenizer, novelty_fraction, question_tokens, pool):
    """NuC = the top-NLL tokens (in every head); the rest of each KV head's slots = its top catalyst scores. With
    question_tokens, the catalyst is the catalyst prompt followed by the prompt's last question_tokens tokens;
    with pool_tokens, a slot's score is the max over its neighbours'."""
    model, path = llama3
    config = InfiniPotConfig(**{**SMALL.__dict__, "novelty_fraction": novelty_fraction,
                                "question_tokens": question_tokens, "pool_tokens": pool})
    engine = _engine(path, tokenizer, config)
    limit, C = engine.method.kv_token_limit, config.compressed_tokens
    assert limit + engine.method.kv_scratch_tokens == config.pot_tokens
    assert engine.method.kv_scratch_tokens == engine.method.catalyst_ids.numel() + question_tokens
    ids = random_ids(limit, seed=7)  # the pot fills exactly once, at the end of the prompt
    seq, _ = _run(engine, ids, max_tokens=1)
    st = seq.method_state
    assert st.distillations == 1
    catalyst = engine.method.catalyst_ids.tolist() + (ids[-question_tokens:] if question_tokens else [])
    novel, kept = _oracle_first_distillation(model, ids, catalyst, config, 64, 2, pool)
    assert set(st.novelty.tolist()) == novel and len(novel) == config.novelty_tokens
    for layer, per_head in enumerate(kept):
        for h, oracle in enumerate(per_head):
            ours = st.slot_tokens[layer, h, :C]
            assert set(ours.tolist()) == oracle, (layer, h)
            assert novel <= set(ours.tolist())


def test_equals_dense_when_the_pot_holds_the_whole_input(llama3, tokenizer):
    _, path = llama3
    ids = random_ids(700, seed=1)
    big = InfiniPotConfig(pot_tokens=1024, compressed_tokens=256, catalyst_prompt=CATALYST, **PAPER)
    pot_seq, pot_logits = _run(_engine(path, tokenizer, big, prefill_chunk_size=128), ids, max_tokens=20)
    dense_seq, dense_logits = _run(_engine(path, tokenizer, method="dense", prefill_chunk_size=128), ids, max_tokens=20)
    assert pot_seq.method_state.distillations == 0 and pot_seq.output_ids == dense_seq.output_ids
    assert len(pot_logits) == 20
    torch.testing.assert_close(torch.cat(pot_logits), torch.cat(dense_logits), rtol=1e-5, atol=1e-5)


def test_kv_pages_stay_flat_as_input_grows(llama3, tokenizer):
    _, path = llama3
    held = {}
    for n in (500, 2000):
        engine = _engine(path, tokenizer)
        pages = []
        seq, _ = _run(engine, random_ids(n, seed=n), max_tokens=8, on_step=lambda s: pages.append(len(s.page_table)))
        assert seq.method_state.distillations >= 1
        held[n] = max(pages)
        assert engine.cache.num_pages * PAGE == SMALL.pot_tokens  # the whole cache is one pot
    assert held[500] == held[2000] == SMALL.pot_tokens // PAGE


def test_config_and_binding_errors_name_the_field(llama3, tokenizer):
    with pytest.raises(ValueError, match="compressed_tokens"):
        InfiniPotConfig(pot_tokens=128, compressed_tokens=128)
    with pytest.raises(ValueError, match="novelty_fraction"):
        InfiniPotConfig(novelty_fraction=1.5)
    with pytest.raises(ValueError, match="sink_tokens"):
        InfiniPotConfig(pot_tokens=4096, compressed_tokens=1024, novelty_fraction=1.0, sink_tokens=4)  # no room: NuC
    with pytest.raises(ValueError, match="catalyst_question"):
        InfiniPotConfig(catalyst_question=" ")
    with pytest.raises(ValueError, match="pool_tokens"):
        InfiniPotConfig(pool_tokens=4)
    with pytest.raises(ValueError, match="question_tokens"):
        InfiniPotConfig(question_tokens=-1)
    assert InfiniPotConfig(catalyst_question="Who won?").catalyst_text.endswith(" Question: Who won?")
    _, path = llama3
    with pytest.raises(ValueError, match="pot_tokens"):  # 48 kept + 5 catalyst tokens leave no room in 53 slots
        _engine(path, tokenizer, InfiniPotConfig(pot_tokens=53, compressed_tokens=48, catalyst_prompt=CATALYST))
    with pytest.raises(ValueError, match="question_tokens"):  # 48 kept + 5 catalyst + 8 question tokens > 60
        _engine(path, tokenizer, InfiniPotConfig(pot_tokens=60, compressed_tokens=48, catalyst_prompt=CATALYST,
                                                 question_tokens=8))
    with pytest.raises(ValueError, match="tokenizer"):
        _engine(path, None)
    with pytest.raises(ValueError, match="pot_tokens"):  # the tiny model is trained to 4096 positions
        create_method("infinipot", engine_for_dir(path, tokenizer).model_config, InfiniPotConfig(pot_tokens=8192))


def test_cli_flags_build_the_config():
    import argparse

    from infinitehip.cli.method_options import add_method_flags, method_config_from_args

    parser = argparse.ArgumentParser()
    add_method_flags(parser)
    args = parser.parse_args(["--pot-tokens", "2048", "--compressed-tokens", "512", "--catalyst-question", "What is the pass key?"])
    config = method_config_from_args(EngineConfig(method="infinipot"), args)
    assert config == InfiniPotConfig(pot_tokens=2048, compressed_tokens=512, catalyst_question="What is the pass key?")
    args = parser.parse_args(["--preset", "2k"])
    assert method_config_from_args(EngineConfig(method="infinipot"), args).pot_tokens == 2048
    args = parser.parse_args(["--preset", "4k-retrieval", "--sink-tokens", "2"])  # a flag overrides its preset
    expected = dataclasses.replace(PRESETS["4k-retrieval"], sink_tokens=2)
    assert method_config_from_args(EngineConfig(method="infinipot"), args) == expected


def test_pot_sizes_follow_the_model_unless_given(llama3, tokenizer):
    """pot_tokens 0 = half the trained length, at most 16K; compressed_tokens 0 = a quarter of the pot; NuC share
    None = none in pots of 8K or more, half of |C| below."""
    for trained, pot, novelty in [(4096, 2048, 0.5), (8192, 4096, 0.5), (16384, 8192, 0.0), (32768, 16384, 0.0),
                                  (131072, 16384, 0.0)]:
        sized = InfiniPotConfig().for_model(trained)
        assert (sized.pot_tokens, sized.compressed_tokens, sized.novelty_fraction) == (pot, pot // 4, novelty)
        assert sized.sized and not InfiniPotConfig().sized
    assert InfiniPotConfig(pot_tokens=1000).for_model(131072).compressed_tokens == 250
    assert InfiniPotConfig(novelty_fraction=0.25).for_model(131072).novelty_fraction == 0.25
    with pytest.raises(ValueError, match="for_model"):
        InfiniPotConfig().novelty_tokens
    assert PRESETS["4k"].for_model(131072) == PRESETS["4k"]  # the paper's sizes are kept as given
    _, path = llama3  # the tiny model is trained to 4096 positions: the method runs a 2048-slot pot
    method = create_method("infinipot", engine_for_dir(path, tokenizer).model_config, InfiniPotConfig())
    assert (method.config.pot_tokens, method.config.compressed_tokens) == (2048, 512)


@pytest.mark.slow  # a real-model retrieval (10-16 s of CPU): CI's slow pass (make test-slow)
def test_embedded_model_finds_passkey_beyond_a_small_pot():
    """~3K-token prompt, 1024-slot pot (the prompt passes through ~3 distillations) with the general catalyst."""
    loaded = load_model(None, default_cache_root(), torch.device("cpu"), torch.float32)
    config = InfiniPotConfig(pot_tokens=1024, compressed_tokens=256)
    engine = LLMEngine(EngineConfig(device="cpu", dtype="float32", show_progress=False, method="infinipot",
                                    prefill_chunk_size=1024, method_config=config), loaded)
    llm = LLM.from_engine(engine)
    sample = make_passkey_sample(loaded.tokenizer, 3000, 0.3, 21)
    (out,) = llm.chat(sample.messages, SamplingParams(temperature=0.0, max_tokens=12))
    assert sample.is_correct(out.text), (sample.answer, out.text)
    assert engine.cache.num_pages * engine.config.page_size == 1024


@pytest.mark.slow  # a real-model sweep: make test-all
def test_embedded_model_finds_passkey_with_the_retrieval_preset(distillations):
    """The `4k-retrieval` preset as it ships (4096-slot pot, NuC-dominated, 4 sink tokens) on a ~7.5K-token prompt:
    the needle at 20% is read before the first distillation and must survive both."""
    config = PRESETS["4k-retrieval"]
    assert (config.novelty_tokens, config.sink_tokens) == (1014, 4)
    loaded = load_model(None, default_cache_root(), torch.device("cpu"), torch.float32)
    engine = LLMEngine(EngineConfig(device="cpu", dtype="float32", show_progress=False, method="infinipot",
                                    method_config=config), loaded)
    llm = LLM.from_engine(engine)
    sample = make_passkey_sample(loaded.tokenizer, 7500, 0.2, 5)
    (out,) = llm.chat(sample.messages, SamplingParams(temperature=0.0, max_tokens=12))
    assert sample.is_correct(out.text), (sample.answer, out.text)
    assert len(distillations) == 2 and engine.cache.num_pages * engine.config.page_size == config.pot_tokens

"""`infinitehip.patch`: our methods inside a plain transformers model give our engine's greedy tokens."""

from __future__ import annotations

import pytest
import torch
import transformers

import infinitehip
from infinitehip import LLM, SamplingParams
from infinitehip.attention.methods.hip.config import HiPConfig
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.attention.methods.streaming.config import StreamingConfig
from infinitehip.attention.methods.tokenselect.config import TokenSelectConfig
from infinitehip.engine.llm_engine import ContextLengthError
from infinitehip.integrations.transformers.patch import chunk_for_prompt
from tests.conftest import engine_for_dir

# Methods at sizes where a 700-token prompt is far past their budgets (and past the model's 256 positions).
SMALL = {
    "infinitehip": InfiniteHiPConfig(sink_tokens=16, stream_tokens=64, query_block_sizes=(32, 16, 8),
                                     chunk_sizes=(64, 16, 4), keep_tokens=(512, 128, 32), early_last_keep_tokens=64,
                                     refresh_intervals=(4, 2, 1), early_layers=1, landmark_window=48),
    "tokenselect": TokenSelectConfig(select_tokens=64, sink_tokens=16, local_tokens=64, query_block_size=64,
                                     question_select_tokens=32),
    "streaming": StreamingConfig(sink_tokens=4, window_tokens=60, eviction_batch_tokens=64),
    "hip": HiPConfig(top_k_tokens=32, key_block_size=2, sink_tokens=4, window_tokens=32, query_block_size=32,
                     refresh_interval=4, dense_layers=1),
}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      rope_theta=10000.0, tie_word_embeddings=False,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)  # no EOS: 12 tokens each
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path)
    return model, path


def _engine_tokens(path, method, config, ids, n, chunk):
    engine = engine_for_dir(path, None, config, method=method, max_context_tokens=4096, prefill_chunk_size=chunk)
    (out,) = LLM.from_engine(engine).generate([ids], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    return out.token_ids


@pytest.mark.parametrize("method", ["infinitehip", "tokenselect", "streaming", "hip", "dense"])
def test_patched_transformers_greedy_equals_engine(tiny_llama, method):
    model, path = tiny_llama
    ids = torch.randint(0, 512, (700,), generator=torch.Generator().manual_seed(3)).tolist()
    config = SMALL.get(method)
    ours = _engine_tokens(path, method, config, ids, 12, chunk=256)
    with torch.no_grad(), infinitehip.patch(model, method=method, method_config=config, prefill_chunk_size=256,
                                                    max_context_tokens=4096):
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    assert out.shape[1] == 700 + 12  # the whole prompt was read: nothing truncated
    assert out[0, 700:].tolist() == ours
    assert model.config._attn_implementation != "infinitehip"  # the patch is gone



@pytest.mark.parametrize("prompt, chunk, expected", [(700, 256, 256), (513, 256, 240), (257, 256, 225), (300, 256, 256), (20, 256, 256)])
def test_patch_chunks_leave_the_question_whole_in_the_last_chunk(prompt, chunk, expected):
    size = chunk_for_prompt(prompt, chunk, 32)
    assert size == expected and (prompt % size == 0 or prompt % size >= min(32, prompt))


def test_patched_generate_reads_the_question_in_one_chunk(tiny_llama):
    """513 tokens in chunks of 256 would end with a 1-token chunk, leaving 31 of the question's 32 queries outside the
    chunk where the question-time selection is made and attended."""
    model, _ = tiny_llama
    ids = torch.randint(0, 512, (513,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad(), infinitehip.patch(model, method="tokenselect", method_config=SMALL["tokenselect"],
                                                    prefill_chunk_size=256, max_context_tokens=4096) as p:
        last, prefill = [], p.session.method.prefill

        def spy(layer, q, seq, batch):
            if seq.ends_prompt:
                last.append(q.shape[0])
            return prefill(layer, q, seq, batch)

        p.session.method.prefill = spy
        out = model.generate(torch.tensor([ids]), max_new_tokens=2, do_sample=False)
    assert out.shape[1] == 515 and set(last) == {33}  # chunks of 240: 240, 240, 33


def test_patch_hands_the_prompt_to_the_repeated_text_settings(tiny_llama, monkeypatch):
    """A prompt that repeats a passage: the patched model's InfiniteHiP gets the prompt's ids at its last chunk (the
    pruning stages' and the question vote's repeat masks are made, as in the engine), so its greedy tokens equal the
    engine's; a forward from inputs_embeds has no ids and makes no mask."""
    from infinitehip.attention.methods.infinitehip import method as ih_method

    seen = []
    inner = ih_method.prompt_novel
    monkeypatch.setattr(ih_method, "prompt_novel", lambda seq, *a: seen.append(seq.text) or inner(seq, *a))
    model, path = tiny_llama
    passage = torch.randint(0, 512, (240,), generator=torch.Generator().manual_seed(5)).tolist()
    ids = (passage * 3)[:700]
    config = InfiniteHiPConfig(**{**SMALL["infinitehip"].__dict__, "repeat_span": 16, "hierarchy_repeat_span": 16})
    ours = _engine_tokens(path, "infinitehip", config, ids, 12, chunk=256)
    seen.clear()
    with torch.no_grad(), infinitehip.patch(model, method="infinitehip", method_config=config, prefill_chunk_size=256,
                                                    max_context_tokens=4096):
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
        assert out[0, 700:].tolist() == ours
        texts = [t for t in seen if t is not None]
        assert texts and all(list(t.ids) == ids for t in texts)  # the whole prompt, at its last chunk only
        seen.clear()
        model(inputs_embeds=model.get_input_embeddings()(torch.tensor([ids[:300]])))
        assert seen and all(t is None for t in seen)

def test_patch_logits_equal_unpatched_for_dense(tiny_llama):
    model, _ = tiny_llama
    ids = torch.randint(0, 512, (1, 200), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = model(ids).logits
        with infinitehip.patch(model, method="dense"):
            got = model(ids).logits
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_patch_refuses_what_it_cannot_do(tiny_llama):
    model, _ = tiny_llama
    with pytest.raises(ValueError, match="infinipot.*ChunkHooks|ChunkHooks.*infinipot"):
        infinitehip.patch(model, method="infinipot")
    with pytest.raises(ValueError, match="cascade.*prefill chunks"):  # the engine sizes its chunks to the room left
        infinitehip.patch(model, method="cascade")
    ids = torch.randint(0, 512, (1, 300))
    with infinitehip.patch(model, method="dense"):  # dense stops at the model's 256 positions, loudly
        with pytest.raises(ContextLengthError, match="nothing was truncated"):
            model.generate(ids, max_new_tokens=4)
        with pytest.raises(ValueError, match="padded"):
            model(ids[:, :8].repeat(2, 1), attention_mask=torch.tensor([[1] * 8, [0] + [1] * 7]))


# ---- the embedded model (SmolLM2-135M-Instruct, 8192 trained positions), loaded by transformers ----------------
@pytest.fixture(scope="module")
def embedded():
    from infinitehip.model.gguf_convert import default_cache_root
    from infinitehip.model.loading import load_model

    loaded = load_model(None, default_cache_root(), torch.device("cpu"), torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(loaded.model_dir, dtype=torch.float32).eval()
    return loaded, hf


NEAR_TIE = 0.1  # logits (~30 at a pass key's digit): float rounding apart, not a different selection


def _compare_on_embedded(embedded, method, config, n_prompt, n_new, **engine):
    from infinitehip.config.engine import EngineConfig
    from infinitehip.engine.llm_engine import LLMEngine
    from infinitehip.eval.passkey import make_passkey_sample
    from infinitehip.engine.prompt_format import chat_prompt_ids

    loaded, hf = embedded
    sample = make_passkey_sample(loaded.tokenizer, n_prompt, 0.5, 7)
    ids = chat_prompt_ids(loaded.tokenizer, sample.messages)
    cfg = EngineConfig(device="cpu", dtype="float32", show_progress=False, method=method, method_config=config, **engine)
    (out,) = LLM.from_engine(LLMEngine(cfg, loaded)).generate(
        [ids], SamplingParams(temperature=0.0, max_tokens=n_new, ignore_eos=True))
    with torch.no_grad(), infinitehip.patch(hf, method=method, method_config=config, **engine):
        got = hf.generate(torch.tensor([ids]), max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                          output_scores=True, return_dict_in_generate=True)
    assert got.sequences.shape[1] == len(ids) + n_new  # every prompt token read
    # Two implementations of the model (transformers' and ours) round differently: the greedy tokens agree up to
    # the first near-tie, where the engine's token must be one of the patched model's best (within NEAR_TIE).
    for step, (token, scores) in enumerate(zip(out.token_ids, got.scores)):
        if got.sequences[0, len(ids) + step] != token:
            assert scores[0].max() - scores[0, token] < NEAR_TIE, f"step {step}: not a near-tie"
            break
    return len(ids)


def test_patch_on_embedded_model_equals_engine(embedded):
    """Short: streaming with a 60-token window over a 300-token prompt in 64-token chunks, so eviction runs."""
    _compare_on_embedded(embedded, "streaming", StreamingConfig(sink_tokens=4, window_tokens=60,
                                                                eviction_batch_tokens=32), 300, 4,
                         prefill_chunk_size=64)


@pytest.mark.slow
def test_patch_on_embedded_model_past_training_window(embedded):
    """~6 min on 2 CPU cores: InfiniteHiP's default preset at 8.6K tokens, past the model's 8192 positions, greedy
    tokens of the patched transformers model equal the engine's (both chunk the prefill at 4096)."""
    n = _compare_on_embedded(embedded, "infinitehip", None, 8600, 8)
    assert n > 8192


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "llama-yarn", "phi3-longrope"])
def test_patch_dense_equals_unpatched(family):
    """Gemma 2 / 3 (sliding-window and full layers; Gemma 2's attention soft-capping), YaRN and longrope (their
    attention factor, which transformers folds into cos / sin): under `dense` the patched model's logits and
    greedy tokens are transformers' own (90 tokens: past longrope's 64 original positions, its long factors)."""
    from tests.conftest import TINY_CONFIGS
    from tests.model.test_model_coverage import CONFIGS

    torch.manual_seed(0)
    config = TINY_CONFIGS["gemma3"]() if family == "gemma3" else CONFIGS[family]()
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(6.0)  # large scores: soft-capping bites
    ids = torch.randint(0, 512, (1, 90), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = model(ids).logits
        want = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None)
        with infinitehip.patch(model, method="dense", prefill_chunk_size=32):
            got = model(ids).logits
            tokens = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert tokens.tolist() == want.tolist()

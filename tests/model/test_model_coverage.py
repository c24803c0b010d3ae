"""Architectures and RoPE scalings beyond the base set, each against transformers' logits on a tiny random config
(fp32, eager attention): YaRN, longrope (Phi-3, fused checkpoint weights), Gemma 2 (soft-capping, local/global
layers); and the configurations refused or limited with a clear message."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

from infinitehip.config.model import ModelConfig, UnsupportedArchitectureError
from tests.conftest import engine_for_dir

_COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, rms_norm_eps=1e-5)
_LONGROPE = dict(rope_type="longrope", short_factor=[1.0 + 0.1 * i for i in range(8)],
                 long_factor=[1.0 + 0.5 * i for i in range(8)], original_max_position_embeddings=64, rope_theta=10000.0)

CONFIGS = {
    "llama-yarn": lambda: transformers.LlamaConfig(
        **_COMMON, max_position_embeddings=1024, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=256, rope_theta=10000.0)),
    "qwen2-yarn-mscale": lambda: transformers.Qwen2Config(
        **_COMMON, max_position_embeddings=1024, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=128, rope_theta=1e6,
                             beta_fast=16, beta_slow=2, mscale=0.9, mscale_all_dim=0.5)),
    # Lengths past original_max_position_embeddings (64): transformers' long factors, the ones we always use.
    "phi3-longrope": lambda: transformers.Phi3Config(
        **_COMMON, max_position_embeddings=1024, original_max_position_embeddings=64, sliding_window=None,
        tie_word_embeddings=False, pad_token_id=0, rope_parameters=dict(_LONGROPE)),
    "gemma2": lambda: transformers.Gemma2Config(
        **{**_COMMON, "num_hidden_layers": 4, "num_key_value_heads": 1}, head_dim=32, sliding_window=16,
        max_position_embeddings=4096, query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
        final_logit_softcapping=3.0),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny(request, tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[request.param](), attn_implementation="eager").eval()
    with torch.no_grad():  # non-trivial norms so a wrong mapping shows; large scores so soft-capping bites
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(6.0)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, path


@pytest.mark.parametrize("length", [100, 300])
def test_logits_match_transformers(tiny, length):
    family, hf, path = tiny
    ids = torch.randint(0, 512, (length,), generator=torch.Generator().manual_seed(length)).tolist()
    ours = engine_for_dir(path, max_context_tokens=1024, prefill_chunk_size=128, page_size=16).prompt_logits(ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    err = (ours - ref).abs().max().item()
    assert err < 1e-4 * max(1.0, ref.abs().max().item()), f"{family} L={length}: max abs err {err}"


def test_config_fields():
    yarn = ModelConfig.from_hf_dict(CONFIGS["qwen2-yarn-mscale"]().to_dict()).rope_scaling
    assert (yarn.kind, yarn.factor, yarn.beta_fast) == ("yarn", 8.0, 16.0)
    assert yarn.attention_factor == pytest.approx((0.09 * torch.log(torch.tensor(8.0)).item() + 1)
                                                  / (0.05 * torch.log(torch.tensor(8.0)).item() + 1))
    g2 = ModelConfig.from_hf_dict(CONFIGS["gemma2"]().to_dict())
    assert g2.layer_types == ("sliding_attention", "full_attention") * 2 and g2.attn_logit_softcapping == 5.0
    assert not g2.qk_norm and g2.is_gemma


def test_softcapped_model_refuses_methods_without_softcapping(tiny):
    family, _, path = tiny
    if family != "gemma2":
        pytest.skip("soft-capping is Gemma 2's")
    with pytest.raises(ValueError, match="soft-capping.*methods that do: dense"):
        engine_for_dir(path, method="streaming", max_context_tokens=1024)


def test_auto_is_dense_on_a_softcapped_model(tiny):
    family, _, path = tiny
    if family != "gemma2":
        pytest.skip("soft-capping is Gemma 2's")
    engine = engine_for_dir(path)  # the default method, auto
    assert engine.config.method == "auto" and engine.method.name == "dense"
    assert engine.max_context_tokens == 4096  # dense's: the trained length, refused past it


@pytest.mark.parametrize("model_type, extra", [
    ("mistral", {}), ("phi3", {}), ("qwen2", {"use_sliding_window": True})])
def test_uniform_sliding_window_is_refused(model_type, extra):
    hf = dict(model_type=model_type, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=32768, sliding_window=4096, **extra)
    with pytest.raises(UnsupportedArchitectureError, match=f"{model_type} with sliding_window=4096 on every layer"):
        ModelConfig.from_hf_dict(hf)
    assert ModelConfig.from_hf_dict({**hf, "sliding_window": None}).model_type == model_type


def test_qwen25_1m_dual_chunk_attention_is_said_and_bounds_dense(caplog):
    hf = dict(model_type="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=1010000, rope_theta=10000000.0, sliding_window=32768,
              use_sliding_window=False, dual_chunk_attention_config=dict(
                  chunk_size=262144, local_size=8192, original_max_position_embeddings=262144))
    with caplog.at_level(logging.WARNING):
        config = ModelConfig.from_hf_dict(hf)
    assert config.max_position_embeddings == 262144  # dense's default context: the trained length, not 1M
    assert "dual_chunk_attention_config is not implemented" in caplog.text


def test_partial_rotary_is_refused():
    hf = dict(model_type="phi3", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=4096, partial_rotary_factor=0.75)
    with pytest.raises(UnsupportedArchitectureError, match="partial_rotary_factor"):
        ModelConfig.from_hf_dict(hf)

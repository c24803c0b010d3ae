"""Loading: Hub ids from the local Hugging Face cache (offline), quantized checkpoints refused before any weight is
read, FP8 (e4m3) checkpoints dequantized."""

from __future__ import annotations

import json
import re

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from infinitehip.config.model import ModelConfig, UnsupportedArchitectureError
from infinitehip.model import loading
from infinitehip.model.loading import load_model, resolve_model_dir
from tests.conftest import engine_for_dir

CPU = torch.device("cpu")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    return model, path


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache in tmp_path, offline: nothing can come from the network."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_hub_id_loads_offline_from_the_cache(tiny, hf_cache):
    model, saved = tiny
    snapshot = hf_cache / "models--tiny-org--tiny-llama" / "snapshots" / COMMIT  # huggingface_hub's layout
    snapshot.mkdir(parents=True)
    for file in saved.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (hf_cache / "models--tiny-org--tiny-llama" / "refs").mkdir()
    (hf_cache / "models--tiny-org--tiny-llama" / "refs" / "main").write_text(COMMIT)

    path, source = resolve_model_dir("tiny-org/tiny-llama", hf_cache / "conversions")
    assert path == snapshot and source == "tiny-org/tiny-llama"
    ids = list(range(5, 105))
    ours = engine_for_dir(path, max_context_tokens=512).prompt_logits(ids)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def test_absent_hub_id_names_the_id_and_the_cache(hf_cache):
    with pytest.raises(FileNotFoundError) as info:
        resolve_model_dir("nobody/absent-model", hf_cache / "conversions")
    assert "'nobody/absent-model'" in str(info.value) and str(hf_cache) in str(info.value)
    with pytest.raises(FileNotFoundError, match="does not exist"):  # a path-like name stays a path
        resolve_model_dir("./nobody/absent-model", hf_cache / "conversions")


@pytest.mark.parametrize("quant, name", [({"quant_method": "awq", "bits": 4, "group_size": 128}, "'awq' (4-bit)"),
                                         ({"quant_method": "gptq", "bits": 4, "desc_act": False}, "'gptq' (4-bit)"),
                                         ({"quant_method": "fp8", "fmt": "e5m2"}, "'fp8'")])
def test_quantized_checkpoint_refused_before_any_weight_is_read(tiny, tmp_path, monkeypatch, quant, name):
    _, saved = tiny
    config = json.loads((saved / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)  # corrupt: reading it would raise another error

    def no_read(*args, **kwargs):
        raise AssertionError("a weight file was opened")

    monkeypatch.setattr(loading, "safe_open", no_read)
    with pytest.raises(UnsupportedArchitectureError, match=re.escape(f"quant_method={name}")):
        load_model(str(tmp_path), tmp_path / "cache", CPU, torch.float32)


def _to_fp8(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-quantize w [out, in] to e4m3 with per-block scales [ceil(out / block), ceil(in / block)]."""
    out_b, in_b = -(-w.shape[0] // block), -(-w.shape[1] // block)
    padded = torch.zeros(out_b * block, in_b * block)
    padded[: w.shape[0], : w.shape[1]] = w
    blocks = padded.view(out_b, block, in_b, block)
    scale = blocks.abs().amax(dim=(1, 3)) / 448.0  # e4m3's largest finite value
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).view_as(padded)[: w.shape[0], : w.shape[1]]
    return q.contiguous(), scale


def test_fp8_block_checkpoint_is_dequantized(tiny, tmp_path):
    model, saved = tiny
    tensors, deq = load_file(saved / "model.safetensors"), {}
    out = {}
    for name, w in tensors.items():
        if name.endswith("proj.weight"):  # the linear layers, as FP8 checkpoints quantize them (block 48: ragged edges)
            q, scale = _to_fp8(w, 48)
            out[name], out[name.removesuffix(".weight") + ".weight_scale_inv"] = q, scale
            deq[name] = q.float() * scale.repeat_interleave(48, 0)[: w.shape[0]].repeat_interleave(48, 1)[:, : w.shape[1]]
        else:
            out[name] = w
    save_file(out, tmp_path / "model.safetensors")
    config = json.loads((saved / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [48, 48],
                                     "activation_scheme": "dynamic"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert ModelConfig.from_dir(tmp_path).fp8_weights

    reference = transformers.AutoModelForCausalLM.from_config(model.config).eval()
    reference.load_state_dict({**tensors, **deq}, strict=False)
    ids = list(range(7, 90))
    ours = engine_for_dir(tmp_path, max_context_tokens=512).prompt_logits(ids)
    with torch.no_grad():
        ref = reference(torch.tensor([ids])).logits[0]
        plain = model(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    assert (ours - plain).abs().max() > 1e-5  # really the fp8 values, not the originals


def test_tokenizer_asking_for_space_clean_up_decodes_bpe_text_as_is_without_a_warning(tmp_path, capfd):
    """A config with clean_up_tokenization_spaces=true (Llama 3's; transformers 5.17's GGUF conversions) made every
    `generate` print transformers' "Ignoring clean_up_tokenization_spaces=True for BPE tokenizer" warning."""
    from infinitehip.model.gguf_convert import default_cache_root

    embedded, _ = resolve_model_dir(None, default_cache_root())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((embedded / name).read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "clean_up_tokenization_spaces": True}))
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path)).clean_up_tokenization_spaces  # the cause
    capfd.readouterr()
    tokenizer = loading.load_tokenizer(tmp_path)
    assert tokenizer.clean_up_tokenization_spaces is False
    text = "Hello , world . It 's"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    assert "clean_up_tokenization_spaces" not in capfd.readouterr().err

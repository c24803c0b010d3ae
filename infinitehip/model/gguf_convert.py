"""Turn a GGUF file into a Hugging Face-format model directory (config, safetensors, tokenizer).

GGUF is how most quantized checkpoints are shipped; the rest of the engine loads plain Hugging Face
directories. We dequantize once with the `gguf` package, undo llama.cpp's layout changes, and cache the
result so later starts only pay for reading safetensors. Weight matrices are cached in bfloat16 (the dtype
these models are trained and shipped in), vectors (norms, biases) in float32.

Built-in model names (`BUILTIN_MODELS`, e.g. `gemma3-270m`) map to GGUF files shipped in PyPI packages.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import gguf
import numpy as np
import torch
from tqdm import tqdm

from infinitehip.model.gguf_metadata import dequantize, gemma3_config, meta, rope_scaling

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
# Bump when the cache layout or conversion changes, so stale caches are never reused.
# v2: per-architecture cache dtype (bfloat16 matrices for gemma3), part of the key.
# v3: bfloat16 matrices for every architecture (a float32 cache of an 8B Q4 model took ~32 GB).
_FORMAT_VERSION = 3
# Cache dtype of weight matrices per GGUF architecture; vectors (norms, biases) stay float32. Llama, Qwen,
# SmolLM2 and Gemma 3 are trained and shipped in bfloat16; bf16 rounding (<= 2^-9 relative) is well below the
# error of the 4-6 bit codes of a Q4 GGUF, and halves the cache (SmolLM2-135M: 0.54 -> 0.27 GB). Pass
# dtype=torch.float32 for a conversion bit-identical to the GGUF's values.
_CACHE_DTYPES = {arch: torch.bfloat16 for arch in ("llama", "qwen2", "qwen3", "gemma3")}
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16"}
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")

_MODEL_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                  "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# Gemma has four norms per block; its ffn_norm is the pre-feedforward one (Llama's post-attention one).
_GEMMA3_BLOCK_NAMES = {
    **_BLOCK_NAMES, "ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# rope_freqs holds llama3 rope scaling factors; Hugging Face recomputes them from config.rope_scaling.
_CONFIG_ONLY_TENSORS = {"rope_freqs.weight"}
_NAME_RE = re.compile(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)")


class _Entry(NamedTuple):
    """One output tensor: where it comes from and how to fix it up."""

    name: str
    source: Any  # gguf.ReaderTensor
    shape: tuple[int, ...]
    unpermute_heads: int  # 0: keep rows as stored
    norm_offset: float = 0.0  # subtracted from the values (llama.cpp stores Gemma's RMSNorm weights as 1 + w)
    dtype: torch.dtype = torch.float32  # cached dtype


def _open(path: Path) -> tuple[gguf.GGUFReader, str]:
    reader = gguf.GGUFReader(path)
    arch = meta(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} in {path} is not supported; "
                         f"supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}")
    return reader, arch


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp interleaves the two rotary halves of each head's q/k rows (GGML's "normal" rope);
    # Hugging Face's rotate_half wants them as two contiguous halves. This inverts convert_hf_to_gguf's permute.
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _describe(reader: gguf.GGUFReader, arch: str, dtype: torch.dtype | None = None) -> tuple[dict, list[_Entry]]:
    """Hugging Face config plus the tensor plan; reads metadata and shapes only, no tensor data.

    dtype: of the weight matrices (vectors stay float32); None: the architecture's cache dtype."""
    dtype = _CACHE_DTYPES.get(arch, torch.float32) if dtype is None else dtype
    if dtype not in _SAFETENSORS_DTYPES:
        raise ValueError(f"unsupported cache dtype {dtype}; supported: {', '.join(map(str, _SAFETENSORS_DTYPES))}")
    tensors = {t.name: t for t in reader.tensors}

    def shape(name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in reversed(tensors[name].shape))

    n_head = int(meta(reader, f"{arch}.attention.head_count"))
    n_kv = int(meta(reader, f"{arch}.attention.head_count_kv", n_head))
    # Never hidden_size / heads: qwen3 differs. key_length is optional, the k_proj rows always tell.
    head_dim = int(meta(reader, f"{arch}.attention.key_length", shape("blk.0.attn_k.weight")[0] // n_kv))
    theta = float(meta(reader, f"{arch}.rope.freq_base", 10000.0))
    window = meta(reader, f"{arch}.attention.sliding_window")
    has_qkv_bias = "blk.0.attn_q.bias" in tensors
    if arch == "gemma3":
        model_type = "gemma3_text"  # the text-only model; "gemma3" is the vision-language wrapper
    else:
        model_type = "mistral" if arch == "llama" and window else arch  # only MistralConfig has a window
    config: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [_MODEL_CLASSES[model_type]],
        "hidden_size": int(meta(reader, f"{arch}.embedding_length")),
        "intermediate_size": int(meta(reader, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(meta(reader, f"{arch}.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(meta(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": theta,
        "rope_scaling": rope_scaling(reader, arch, theta, head_dim),
        "max_position_embeddings": int(meta(reader, f"{arch}.context_length", 2048)),
        "vocab_size": shape("token_embd.weight")[0],  # embedding rows, which may exceed the token list
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": meta(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": _dtype_name(dtype),
    }
    pad = meta(reader, "tokenizer.ggml.padding_token_id")
    if pad is not None:
        config["pad_token_id"] = pad
    if model_type in ("llama", "qwen3", "gemma3_text"):
        config["attention_bias"] = has_qkv_bias
    if model_type in ("qwen2", "qwen3", "mistral"):
        config["sliding_window"] = int(window) if window else None
    if model_type in ("qwen2", "qwen3"):
        config["use_sliding_window"] = bool(window)
    if arch == "gemma3":
        del config["hidden_act"]  # Gemma names it hidden_activation
        config = gemma3_config(reader, arch, config)

    block_names = _GEMMA3_BLOCK_NAMES if arch == "gemma3" else _BLOCK_NAMES
    plan = []
    for t in reader.tensors:
        if t.name in _CONFIG_ONLY_TENSORS:
            continue
        match = _NAME_RE.fullmatch(t.name)
        table = block_names if match and match[1] is not None else _TOP_NAMES
        if match is None or match[2] not in table:
            # Refuse rather than silently drop weights the model would need.
            raise ValueError(f"unexpected tensor {t.name!r} in a {arch} GGUF")
        layer, part, kind = match.groups()
        name = f"model.layers.{layer}.{table[part]}.{kind}" if layer is not None else f"{table[part]}.{kind}"
        heads = 0
        # Only llama GGUFs are permuted (GGML "normal" rope); qwen2/qwen3/gemma3 use NEOX rope, stored as is.
        if arch == "llama" and part in ("attn_q", "attn_k"):
            heads = n_head if part == "attn_q" else n_kv
        # convert_hf_to_gguf adds 1 to every Gemma RMSNorm weight (llama.cpp computes x * w; HF x * (1 + w)).
        offset = 1.0 if arch == "gemma3" and part.endswith("norm") and kind == "weight" else 0.0
        out_shape = shape(t.name)
        plan.append(_Entry(name, t, out_shape, heads, offset, dtype if len(out_shape) > 1 else torch.float32))
    plan.sort(key=lambda e: e.name)
    return config, plan


def _materialize(entry: _Entry) -> torch.Tensor:
    values = dequantize(entry.source)
    if entry.unpermute_heads:
        values = _unpermute(values, entry.unpermute_heads)
    if entry.norm_offset:
        values = values - np.float32(entry.norm_offset)  # in float32, as transformers' GGUF loader does
    values = np.ascontiguousarray(values, dtype="<f4")
    if np.may_share_memory(values, entry.source.data):  # float32 tensors come back as views of the mmap
        values = values.copy()
    tensor = torch.from_numpy(values)
    return tensor if entry.dtype == torch.float32 else tensor.to(entry.dtype)  # round to nearest even


def read_gguf_config(gguf_path: str | Path, dtype: torch.dtype | None = None) -> dict:
    """The Hugging Face config read_gguf/convert_gguf would produce, from metadata only (no tensor data)."""
    reader, arch = _open(Path(gguf_path))
    return _describe(reader, arch, dtype)[0]


def read_gguf(gguf_path: str | Path, dtype: torch.dtype | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """Return (hf_config_dict, state_dict) with Hugging Face names: the tensors the cache would hold.

    dtype: of the weight matrices (vectors are float32); None: the architecture's cache dtype
    (bfloat16). Tensors are dequantized one at a time: peak memory is the model plus one
    tensor's float32 temporaries."""
    reader, arch = _open(Path(gguf_path))
    config, plan = _describe(reader, arch, dtype)
    return config, {e.name: _materialize(e) for e in plan}


def _write_safetensors(path: Path, plan: list[_Entry], desc: str | None = None) -> None:
    """Stream tensors into a safetensors file one by one, so memory never holds the whole model.

    Every output's dtype and shape are known up front, so the header can be written first. desc: a progress bar's
    label (stderr), None: no bar."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for e in plan:
        size = e.dtype.itemsize * math.prod(e.shape)
        header[e.name] = {"dtype": _SAFETENSORS_DTYPES[e.dtype], "shape": list(e.shape),
                          "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keep tensor data 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for e in tqdm(plan, desc=desc, unit="tensor", disable=desc is None):
            tensor = _materialize(e)
            raw = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor  # numpy has no bf16
            f.write(memoryview(raw.numpy()).cast("B"))  # little-endian host, like the "<f4" above


def _dtype_name(dtype: torch.dtype | None) -> str:
    return "auto" if dtype is None else str(dtype).removeprefix("torch.")


def _cache_key(src: Path, dtype: torch.dtype | None = None) -> str:
    # size + mtime + head/tail bytes: cheap (a cached start must stay well under a second even for
    # multi-GB files) yet catches a different file under the same name. "auto" (the architecture's
    # dtype) is a function of the file, so the requested dtype is enough to tell conversions apart.
    st = src.stat()
    digest = hashlib.sha256(f"v{_FORMAT_VERSION}:{_dtype_name(dtype)}:{st.st_size}:{st.st_mtime_ns}".encode())
    with open(src, "rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, st.st_size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return digest.hexdigest()[:12]


def _is_complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in _REQUIRED_FILES)


def convert_gguf(gguf_path: str | Path, cache_root: str | Path, dtype: torch.dtype | None = None,
                 tokenizer_dir: str | Path | None = None) -> Path:
    """Convert `gguf_path` once into `cache_root/<stem>-<key>/` and return that directory.

    dtype: of the cached weight matrices; None: the architecture's (bfloat16).
    tokenizer_dir: a tokenizer saved by `save_pretrained` for this GGUF (e.g. on a machine whose transformers builds
    it correctly), loaded and checked against the GGUF's metadata instead of built from it; None: built here.
    The directory is built under a temporary name and renamed into place, so it either holds a
    complete conversion or does not exist; an existing complete one is returned without work."""
    src = Path(gguf_path).expanduser().resolve()
    root = Path(cache_root).expanduser()
    target = root / f"{src.stem}-{_cache_key(src, dtype)}"
    if _is_complete(target):
        return target
    # the first use of a GGUF takes seconds to a minute: say so, and show the tensors' progress
    print(f"converting {src.name} to safetensors, once (into {root}): its tensors, then its tokenizer",
          file=sys.stderr, flush=True)
    reader, arch = _open(src)  # reject unsupported files before creating anything
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=root))
    try:
        config, plan = _describe(reader, arch, dtype)
        _write_safetensors(tmp / "model.safetensors", plan, "tensors")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                      if config.get(k) is not None}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        from transformers import AutoTokenizer  # heavy import, only needed on a cache miss

        # transformers builds the tokenizer (and chat template) from GGUF metadata; saving it keeps both.
        if tokenizer_dir is None:
            tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
            tokens = reader.get_field("tokenizer.ggml.tokens")
            if tokens is not None and len(tokenizer) != len(tokens.data):  # one entry per vocabulary token
                raise ValueError(f"tokenizer in {tokenizer_dir} has {len(tokenizer)} tokens, {src.name} "
                                 f"{len(tokens.data)}: not this GGUF's tokenizer")
        _check_tokenizer(tokenizer, reader, src)
        tokenizer.save_pretrained(str(tmp))
        if _is_complete(target):  # a concurrent converter finished first: keep its files (readers may have them open)
            return target
        if target.exists():  # an incomplete leftover (e.g. files deleted by hand)
            shutil.rmtree(target)
        try:
            os.replace(tmp, target)
        except OSError:
            if not _is_complete(target):  # not just a concurrent converter that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _check_tokenizer(tokenizer: Any, reader: gguf.GGUFReader, src: Path) -> None:
    """Refuse a tokenizer transformers built wrongly from the GGUF metadata: seen with transformers 5.17 on Gemma 3,
    which split text into one id per character and dropped BOS (the model then reads garbage, silently)."""
    import transformers

    text = "The capital of France is Paris."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    problem = None
    if len(tokenizer) >= 1000 and len(ids) > len(text) // 2:  # a real vocabulary has these words (tests' tiny ones not)
        problem = f"{text!r} becomes {len(ids)} tokens (one per character?)"
    add_bos = meta(reader, "tokenizer.ggml.add_bos_token")
    bos = meta(reader, "tokenizer.ggml.bos_token_id")
    if problem is None and add_bos and bos is not None and tokenizer(text)["input_ids"][:1] != [bos]:
        problem = f"the GGUF asks for BOS ({bos}) but the tokenizer does not add it"
    if problem is not None:
        raise RuntimeError(f"transformers {transformers.__version__} built a wrong tokenizer from {src.name}: {problem}; "
                           "upgrade transformers (5.24 builds it correctly)")


def default_cache_root() -> Path:
    """~/.cache/infinitehip/models, or the same under XDG_CACHE_HOME, the standard user cache location."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    cache = Path(base) if os.path.isabs(base) else Path.home() / ".cache"  # the spec says ignore relative
    return cache / "infinitehip" / "models"

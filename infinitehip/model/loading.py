"""Find a model (HF directory, Hub id, GGUF file, built-in name, or the embedded default) and load it into our decoder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from infinitehip.config.model import ModelConfig
from infinitehip.model.fp8 import dequantize_fp8
from infinitehip.model.gemma3 import Gemma3Model
from infinitehip.model.llama import LlamaModel
from infinitehip.distributed.state import ParallelState

Decoder = LlamaModel | Gemma3Model


@dataclass
class LoadedModel:
    config: ModelConfig
    model: Decoder
    tokenizer: object  # transformers PreTrainedTokenizerBase
    source: str  # what the user named (path or "embedded default")
    model_dir: Path


def resolve_model_dir(model: str | None, cache_root: Path) -> tuple[Path, str]:
    """Map the user's `model` (None: the embedded default; a path; a built-in name such as "gemma3-270m"; or a
    Hub id `org/name`, from the local HF cache) to a Hugging Face-format directory; GGUF files are converted
    once into cache_root."""
    from infinitehip.model import builtin, gguf_convert, hub

    if model is None:
        gguf_path = builtin.embedded_model_path()
        return gguf_convert.convert_gguf(gguf_path, cache_root), f"embedded default ({gguf_path.name})"
    path = Path(model).expanduser()
    if not path.exists() and model in builtin.BUILTIN_MODELS:  # an existing path of that name wins
        gguf_path = builtin.BUILTIN_MODELS[model]()
        return gguf_convert.convert_gguf(gguf_path, cache_root), f"built-in {model} ({gguf_path.name})"
    source = str(path)
    if not path.exists() and hub.looks_like_hub_id(model):
        path, source = hub.resolve_hub_id(model), model
    if not path.exists():
        raise FileNotFoundError(
            f"model path {model!r} does not exist (expected a Hugging Face model directory, a Hub id org/name, "
            f"a .gguf file or a built-in name: {', '.join(builtin.BUILTIN_MODELS)})"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model file {model!r} is not a .gguf file")
        return gguf_convert.convert_gguf(path, cache_root), source
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model directory {model!r} has no config.json")
    if not list(path.glob("*.safetensors")):
        raise FileNotFoundError(f"model directory {model!r} has no *.safetensors weights")
    return path, source


def decoder_class(config: ModelConfig) -> type[Decoder]:
    return Gemma3Model if config.is_gemma else LlamaModel


def empty_model(config: ModelConfig, device: torch.device, dtype: torch.dtype,
                parallel: ParallelState | None = None) -> Decoder:
    """Allocate the decoder (one tensor-parallel rank's part with `parallel`) without initialising its weights
    (they are overwritten next)."""
    with torch.device("meta"):
        model = decoder_class(config)(config, parallel)
    return model.to_empty(device=device).to(dtype).eval().requires_grad_(False)


def load_weights_from_dir(model: Decoder, model_dir: Path) -> None:
    files = sorted(model_dir.glob("*.safetensors"))

    def tensors():
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)

    if model.config.fp8_weights:
        model.load_hf_weights(dequantize_fp8(tensors(), _tensor_reader(files), model.config.fp8_weight_block))
    else:
        model.load_hf_weights(tensors())


def _tensor_reader(files: list[Path]):
    """name -> tensor from whichever file holds it (None if none): FP8 scales may sit in another shard."""
    where = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            where.update(dict.fromkeys(f.keys(), file))

    def read(name: str) -> torch.Tensor | None:
        if name not in where:
            return None
        with safe_open(str(where[name]), framework="pt") as f:
            return f.get_tensor(name)

    return read


def load_tokenizer(model_dir: Path):
    """The model's tokenizer, without the space clean-up that corrupts byte-level BPE text.

    `clean_up_tokenization_spaces` removes the space before punctuation ("a ." -> "a."), a rule made for WordPiece
    vocabularies; a BPE vocabulary spells its spaces itself, so the rule changes the model's text. Some configs
    ask for it (Llama 3's; transformers 5.17 writes it into GGUF conversions): transformers 5 then skips it and
    warns on every run, transformers 4 applies it. Off for BPE, as transformers 5 decodes anyway."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    backend = getattr(tokenizer, "backend_tokenizer", None)  # fast tokenizers; every family here has one
    if backend is not None and type(backend.model).__name__ == "BPE":
        tokenizer.clean_up_tokenization_spaces = False
    return tokenizer


def load_model(model: str | None, cache_root: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    model_dir, source = resolve_model_dir(model, cache_root)
    config = ModelConfig.from_dir(model_dir)
    decoder = empty_model(config, device, dtype)
    load_weights_from_dir(decoder, model_dir)
    return LoadedModel(config, decoder, load_tokenizer(model_dir), source, model_dir)


def random_model(config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0,
                 parallel: ParallelState | None = None) -> Decoder:
    """A decoder with random weights of the given shape (benchmarks of large shapes without a checkpoint). With
    `parallel`, one rank's part filled on its own (not a slice of the single-process model's weights)."""
    model = empty_model(config, device, dtype, parallel)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(0.0 if config.is_gemma else 1.0)  # Gemma norms scale by (1 + weight)
        else:
            p.normal_(0.0, 0.02, generator=gen)
    return model

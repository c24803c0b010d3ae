"""Engine configuration: which model, where, how much KV memory, how prefill is chunked, and the attention
method's own config and the KV offloading config nested in it, so that one object describes a run.

    EngineConfig(method="infinitehip", method_config=PRESETS["3k-fast"], max_context_tokens=1 << 20,
                 offload=OffloadConfig(offload_enabled=True))

`method_config` is typed by `method` through the method registry (config/methods.py: the one place that knows
each method's config class and presets); None stands for the method's default preset and is replaced by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from infinitehip.config.methods import METHODS, method_spec
from infinitehip.config.offload import OffloadConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GPU_PREFILL_CHUNK = 32768  # prefill_chunk_size None on a GPU (see the field)
CPU_PREFILL_CHUNK = 4096


def default_prefill_chunk(device: torch.device) -> int:
    """The prefill chunk when none is given: the engine's and the transformers patch's, by device."""
    return GPU_PREFILL_CHUNK if device.type == "cuda" else CPU_PREFILL_CHUNK


@dataclass(frozen=True)
class EngineConfig:
    # HF dir, Hub id (org/name: the local HF cache first), .gguf file or built-in name (gemma3-270m); None: the
    # embedded SmolLM2-135M-Instruct
    model: str | None = None
    model_cache_dir: str | None = None  # where GGUF conversions are cached; None: ~/.cache/infinitehip/models
    # Attention method: auto (the default: dense up to half the model's trained length, InfiniteHiP beyond), dense
    # (exact; refuses prompts past the trained length), a sparse method that reads past it (infinitehip, tokenselect,
    # infinipot, streaming, cascade) or truncate (drops the prompt's middle)
    method: str = "auto"
    device: str = "auto"  # where the model runs: cpu, cuda or cuda:N; "auto": cuda when available, else cpu
    dtype: str = "auto"  # weights and activations; "auto": bfloat16 on cuda, float32 on cpu
    # Longest prompt + completion in tokens (128K, 1M); None: the method's default for the model (its trained
    # length for dense)
    max_context_tokens: int | None = None
    kv_cache_tokens: int | None = None  # KV pages to allocate, in tokens; None: max_context_tokens
    page_size: int = 64  # tokens per KV page
    # Tokens per prefill step (shared with the decode tokens of that step); None: 32768 on a GPU (the chunk every GPU
    # accuracy result of the docs ran with, and a 1M-token prompt's prefill ~2.5x faster than at 4096), 4096 on the
    # CPU. A smaller chunk bounds how long a long prompt's chunk holds up the next token of running streams.
    prefill_chunk_size: int | None = None
    max_num_seqs: int = 16  # sequences running at once
    show_progress: bool = True  # progress bar with tokens/s during long prefill
    # Decode steps of a single running sequence replay CUDA graphs of the whole model when the attention method
    # supports it (infinitehip); CUDA only, ignored on CPU.
    cuda_graphs: bool = True
    # With CUDA graphs, the running sequences' next decode step is launched before the host has read this step's
    # tokens (all greedy, nothing waiting: picked on the GPU), so the host's part of a step overlaps the GPU's
    # (engine/decode_ahead.py); the same tokens.
    overlap_decode: bool = True
    generator_seed: int = 0  # seeds the shared generator used by requests that carry no seed of their own
    # Sampling defaults from the model's generation_config.json (temperature, top_p, top_k, min_p,
    # repetition_penalty) for what a request leaves unset, as vLLM does; false: SamplingParams' own defaults.
    use_generation_config: bool = True
    # Ranks of tensor parallelism: each runs 1/N of the attention heads (with their KV cache and the attention
    # method), of the MLP and of the logits, on its own GPU (cuda:0..N-1; CPU: gloo ranks). N must divide the
    # model's attention heads; KV heads are split, or replicated when N is a multiple of them. Ranks 1..N-1 are
    # spawned by the engine, or started by torchrun (docs/tensor-parallel.md).
    tensor_parallel_size: int = 1
    # Automatic prefix caching: KV pages of earlier prompts stay cached (LRU-evicted when room is needed) and a request
    # sharing a prompt prefix prefills only the rest. On where the method supports it (dense, truncate, infinitehip,
    # tokenselect; not infinipot or streaming, whose cache is compacted, nor models with sliding-window layers).
    enable_prefix_caching: bool = True
    # The method's own config (InfiniteHiPConfig for infinitehip, ...; its class: the registry's MethodSpec);
    # None: the method's default preset (None for dense, which has no settings).
    method_config: Any = None
    # KV offloading (host store + GPU banks), on when its offload_enabled is set; None: OffloadConfig() (off)
    offload: OffloadConfig = field(default_factory=OffloadConfig)

    # For the CLI (cli/options.py): the fields `--help` lists (--help-all lists all), allowed values, and the fields
    # holding other configs, which get no flag of their own (--preset / --method-config and each method's fields
    # set method_config: cli/method_options.py; OffloadConfig's fields are flags of their own).
    HELP_FIELDS: ClassVar[tuple[str, ...]] = ("model", "method", "device", "max_context_tokens")
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"dtype": ("auto", *DTYPES), "method": tuple(METHODS)}
    NESTED_FIELDS: ClassVar[tuple[str, ...]] = ("method_config", "offload")

    def __post_init__(self) -> None:
        spec = method_spec(self.method)  # unknown method -> ValueError naming the registered ones
        if self.method_config is None:
            object.__setattr__(self, "method_config", spec.config())
        elif spec.config_cls is None:
            raise ValueError(f"method {self.method!r} takes no method_config, got {type(self.method_config).__name__}")
        elif not isinstance(self.method_config, spec.config_cls):
            raise ValueError(f"method_config: method {self.method!r} takes a {spec.config_cls.__name__}, got "
                             f"{type(self.method_config).__name__} (method_config=None: its default preset)")
        if self.offload is None:
            object.__setattr__(self, "offload", OffloadConfig())
        elif not isinstance(self.offload, OffloadConfig):
            raise ValueError(f"offload must be an OffloadConfig, got {type(self.offload).__name__}")
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in ("page_size", "max_num_seqs", "tensor_parallel_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("max_context_tokens", "kv_cache_tokens", "prefill_chunk_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")

    def prefill_chunk_for(self, device: torch.device) -> int:
        """The prefill chunk an engine on `device` runs with (prefill_chunk_size, or its default there)."""
        return self.prefill_chunk_size if self.prefill_chunk_size is not None else default_prefill_chunk(device)

    def torch_device(self) -> torch.device:
        """The device to build on; a CUDA device this machine does not have is a ValueError naming what is there."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                why = ("this torch build has no CUDA" if torch.version.cuda is None
                       else f"torch (CUDA {torch.version.cuda}) finds no GPU")
                raise ValueError(f"device {self.device!r} is not available: {why}; use device 'cpu' or 'auto'")
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise ValueError(f"device {self.device!r} is not available: {torch.cuda.device_count()} GPU(s) here "
                                 f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
        return device

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return DTYPES[self.dtype]

"""KV offloading configuration: every token's K/V in host memory, two GPU banks caching hot rows (paper Sec. 3.3).

The mask bank holds keys only (read by the pruning stages, one representative key per chunk and head);
the attention bank holds keys and values (read by block-sparse attention). Both are token-granular LRU
caches over the host store; their sizes are in tokens (one token = the rows of every KV head of one layer).
The engine config nests it beside the method config (`EngineConfig(..., offload=...)`); its CLI flags are the
field names (--offload-enabled, --mask-bank-tokens, ...), prefixed where a bare name would clash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from infinitehip.config.impl import IMPLS, check_impl, resolve_impl

KV_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class OffloadConfig:
    # Keep every token's K/V in host memory and only the rows in use in GPU memory: contexts past the GPU's memory
    # (infinitehip)
    offload_enabled: bool = False
    mask_bank_tokens: int = 65536  # GPU mask bank (keys only), tokens per layer
    attention_bank_tokens: int = 65536  # GPU attention bank (keys and values), tokens per layer
    kv_dtype: str = "auto"  # dtype of the host store ("auto": the model's); the banks hold the model's dtype
    host_memory_fraction: float = 0.9  # share of the available host memory the store may take
    gpu_memory_fraction: float = 0.9  # share of the free GPU memory the banks and their tables may take
    spill_store_to_gpu: bool = True  # CUDA: store layers the host budget cannot hold live in GPU memory
    # CUDA: share of the GPU budget left after the banks, tables and spilled layers that holds further whole store
    # layers (their bank misses are read from GPU memory, not across PCIe); 0: only what the host cannot hold
    gpu_store_fraction: float = 0.5
    # Prefill reads each layer's context from one GPU copy made per chunk and layer (a streaming copy of the
    # context's K/V from the store) instead of resolving the keys it needs through the banks; costs a buffer of
    # the longest prompt's K/V of one layer in the model's dtype on the GPU.
    stage_prefill: bool = True
    # Several sequences decoding at once replay one CUDA graph (the weights read once a step; each sequence's key
    # list resolved through the attention bank at every step, without the bank rows a sequence decoding alone keeps
    # between refreshes) instead of each one's graph in turn
    batch_decode_graph: bool = False
    offload_impl: str = "auto"  # host->bank row copy: "auto" (triton on CUDA, reference elsewhere), "triton", "reference"

    # For the CLI (cli/options.py): the fields `--help` lists, the kernel choice kept for studies, allowed values.
    HELP_FIELDS: ClassVar[tuple[str, ...]] = ("offload_enabled",)
    STUDY_FIELDS: ClassVar[tuple[str, ...]] = ("offload_impl",)
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"kv_dtype": ("auto", *KV_DTYPES), "offload_impl": IMPLS}

    def __post_init__(self) -> None:
        for name in ("offload_enabled", "spill_store_to_gpu", "stage_prefill", "batch_decode_graph"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("mask_bank_tokens", "attention_bank_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int (tokens per layer), got {value!r}")
        if self.kv_dtype != "auto" and self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be 'auto' or one of {sorted(KV_DTYPES)}, got {self.kv_dtype!r}")
        for name, zero_ok in (("host_memory_fraction", False), ("gpu_memory_fraction", False),
                              ("gpu_store_fraction", True)):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value <= 1.0
                    or not (value >= 0.0 if zero_ok else value > 0.0)):
                raise ValueError(f"{name} must be in {'[' if zero_ok else '('}0, 1], got {value!r}")
        check_impl("offload_impl", self.offload_impl)

    def torch_kv_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The storage dtype: kv_dtype, or the model's dtype for "auto"."""
        return model_dtype if self.kv_dtype == "auto" else KV_DTYPES[self.kv_dtype]

    def copy_impl(self, device: torch.device) -> str:
        """The row copies' implementation on `device` (config/impl.py; the copies have no CPU formulation: "cpu" runs
        their reference)."""
        return resolve_impl(self.offload_impl, device)

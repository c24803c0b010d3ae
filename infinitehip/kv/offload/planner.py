"""Capacity planner: how many KV tokens fit in host memory + GPU banks, decided before anything is allocated.

Host: the store holds K and V of every layer for every token: 2 * L * Hkv * d * element_size(kv_dtype) bytes
per token, within `host_memory_fraction` of the available host memory.
GPU: both banks' rows (in bank_dtype, the model's: misses are upcast from an FP8 store), reverse maps and
stamps are fixed (set by mask_bank_tokens / attention_bank_tokens); the two slot -> bank-index tables add
2 * L * 4 bytes per token; all within `gpu_memory_fraction` of the free GPU memory (measured after the model
is loaded).

Memory is passed in (`host_available_bytes()` / `gpu_free_bytes()` read the machine) so plans are
reproducible and testable with fixed numbers. `CapacityPlan.check(tokens)` refuses a request that does
not fit, naming both numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from infinitehip.config.offload import OffloadConfig
from infinitehip.kv.offload.bank import KVBank
from infinitehip.kv.offload.host_store import dtype_label

GIB = 1 << 30


class CapacityError(ValueError):
    """A KV size that does not fit the memory the plan may use (raised before any allocation)."""


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping); else free physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def gpu_free_bytes(device: torch.device | str = "cuda") -> int:
    """Free memory of a CUDA device (torch.cuda.mem_get_info); 0 without CUDA."""
    if not torch.cuda.is_available():
        return 0
    return torch.cuda.mem_get_info(torch.device(device))[0]


@dataclass(frozen=True)
class CapacityPlan:
    max_tokens: int  # most KV tokens (store slots) that fit
    mask_bank_tokens: int
    attention_bank_tokens: int
    kv_dtype: torch.dtype  # the host store's
    bank_dtype: torch.dtype
    host_bytes_per_token: int
    gpu_bytes_per_token: int  # the two slot tables
    gpu_bank_bytes: int  # both banks' rows, reverse maps, stamps (independent of max_tokens)
    host_budget_bytes: int
    gpu_budget_bytes: int
    limited_by: str  # "host" or "gpu"

    @property
    def host_bytes(self) -> int:
        return self.max_tokens * self.host_bytes_per_token

    @property
    def host_gib(self) -> float:
        return self.host_bytes / GIB

    @property
    def gpu_bytes(self) -> int:
        return self.gpu_bank_bytes + self.max_tokens * self.gpu_bytes_per_token

    @property
    def summary(self) -> str:
        return (f"KV capacity: {self.max_tokens:,} tokens: GPU bank {self.attention_bank_tokens:,} tokens, "
                f"host {self.host_gib:.1f} GiB, {dtype_label(self.kv_dtype)}")

    def check(self, tokens: int, what: str = "the request") -> None:
        """Refuse `tokens` KV tokens when they exceed max_tokens (call before allocating anything)."""
        if tokens > self.max_tokens:
            raise CapacityError(
                f"{what} needs {tokens:,} KV tokens but the offloaded KV capacity is {self.max_tokens:,} tokens "
                f"(limited by {self.limited_by} memory: host {self.host_budget_bytes / GIB:.1f} GiB, "
                f"GPU {self.gpu_budget_bytes / GIB:.2f} GiB usable; {dtype_label(self.kv_dtype)})"
            )


def plan_capacity(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    kv_dtype: torch.dtype,
    config: OffloadConfig,
    gpu_free: int,
    host_available: int,
    page_size: int = 1,
    *,
    bank_dtype: torch.dtype,
) -> CapacityPlan:
    """The largest KV (in tokens, a multiple of page_size) that host memory and the GPU banks allow."""
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                        ("page_size", page_size)):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    for name, value in (("gpu_free", gpu_free), ("host_available", host_available)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0 bytes, got {value}")
    dtype_label(kv_dtype)
    dtype_label(bank_dtype)
    element = torch.empty(0, dtype=kv_dtype).element_size()
    shape = (num_layers, 0)  # tables are counted per token below
    heads = (num_kv_heads, head_dim, torch.empty(0, dtype=bank_dtype).element_size())
    bank_bytes = (KVBank.device_bytes(*shape, config.mask_bank_tokens, *heads, with_values=False)
                  + KVBank.device_bytes(*shape, config.attention_bank_tokens, *heads, with_values=True))
    gpu_per_token = 2 * num_layers * 4
    host_per_token = 2 * num_layers * num_kv_heads * head_dim * element
    gpu_budget = int(gpu_free * config.gpu_memory_fraction)
    host_budget = int(host_available * config.host_memory_fraction)
    if bank_bytes > gpu_budget:
        raise CapacityError(
            f"mask_bank_tokens={config.mask_bank_tokens:,} and attention_bank_tokens={config.attention_bank_tokens:,} "
            f"need {bank_bytes / GIB:.2f} GiB of GPU memory but only {gpu_budget / GIB:.2f} GiB is usable "
            f"(gpu_memory_fraction={config.gpu_memory_fraction} of {gpu_free / GIB:.2f} GiB free)"
        )
    by_host = host_budget // host_per_token
    by_gpu = (gpu_budget - bank_bytes) // gpu_per_token
    tokens = min(by_host, by_gpu) // page_size * page_size
    return CapacityPlan(
        max_tokens=tokens,
        mask_bank_tokens=config.mask_bank_tokens,
        attention_bank_tokens=config.attention_bank_tokens,
        kv_dtype=kv_dtype,
        bank_dtype=bank_dtype,
        host_bytes_per_token=host_per_token,
        gpu_bytes_per_token=gpu_per_token,
        gpu_bank_bytes=bank_bytes,
        host_budget_bytes=host_budget,
        gpu_budget_bytes=gpu_budget,
        limited_by="host" if by_host <= by_gpu else "gpu",
    )

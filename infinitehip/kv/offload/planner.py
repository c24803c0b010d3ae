"""Capacity planner: how many KV tokens fit in host memory + GPU banks, decided before anything is allocated.

Host: the store holds K and V of every layer for every token: 2 * Hkv * d * element_size(kv_dtype) bytes per
token and layer, within `host_memory_fraction` of the available host memory.
GPU: both banks' rows (in bank_dtype, the model's: misses are upcast from an FP8 store), reverse maps and
stamps are fixed (set by mask_bank_tokens / attention_bank_tokens); the two slot -> bank-index tables add
2 * L * 4 bytes per token and the attention method's per-slot state (landmark saliency: L * (H + 1) * 4) more;
all within `gpu_memory_fraction` of the free GPU memory (measured after the model is loaded).
Spill (`spill_store_to_gpu`, CUDA only): when the host budget cannot hold every layer's store, the fewest
whole layers that make it fit live in GPU memory instead (`store_device_layers(tokens)`), if the GPU budget
left after the banks and tables holds them. A 2M-token FP8 store of an 8B model (128 GiB) needs it on a host
of 128 GiB; the banks and kernels treat spilled layers like the others.
GPU-first layers (`gpu_store_fraction`, CUDA only): of the GPU budget a KV of `tokens` leaves unused, that share holds
further whole store layers (`device_store_layers(tokens)` counts them with the spilled ones): a bank miss of such a
layer is a device copy instead of a read across PCIe, and the host keeps the rest. The capacity is unchanged: they
only take memory a KV of that size leaves free.

Memory is passed in (`host_available_bytes()` / `gpu_free_bytes()` read the machine) so plans are
reproducible and testable with fixed numbers. `CapacityPlan.check(tokens)` refuses a request that does
not fit, naming both numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from infinitehip.config.offload import OffloadConfig
from infinitehip.kv.offload.bank import KVBank
from infinitehip.kv.offload.store import dtype_label

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
    """Free memory of a CUDA device (the driver's free memory + what torch's allocator caches unused); 0 without CUDA."""
    if not torch.cuda.is_available():
        return 0
    device = torch.device(device)
    # memory PyTorch's caching allocator holds but does not use is free for the store and banks too
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return torch.cuda.mem_get_info(device)[0] + cached


@dataclass(frozen=True)
class CapacityPlan:
    max_tokens: int  # most KV tokens (store slots) that fit
    mask_bank_tokens: int
    attention_bank_tokens: int
    kv_dtype: torch.dtype  # the store's
    bank_dtype: torch.dtype
    num_layers: int
    layer_bytes_per_token: int  # store bytes of one token in one layer (K and V)
    gpu_bytes_per_token: int  # the two slot tables + the method's per-slot state
    gpu_bank_bytes: int  # both banks' rows, reverse maps, stamps (independent of max_tokens)
    host_budget_bytes: int
    gpu_budget_bytes: int
    spill: bool  # layers the host cannot hold may live in GPU memory
    gpu_store_fraction: float  # share of the GPU budget left unused that holds further store layers (0 with CPU)
    limited_by: str  # "host", "gpu" or "host + gpu" (with spill: both full)

    @property
    def host_bytes_per_token(self) -> int:
        """Store bytes of one token, every layer (all in host memory unless spilled)."""
        return self.num_layers * self.layer_bytes_per_token

    def store_device_layers(self, tokens: int) -> int:
        """The fewest layers whose store must live in GPU memory for `tokens` to fit the host budget (0: none);
        num_layers + 1 when even spilling every layer cannot (or spill is off and the host budget is short)."""
        host_layers = self.host_budget_bytes // max(1, tokens * self.layer_bytes_per_token)
        device_layers = max(0, self.num_layers - host_layers)
        if device_layers and not self.spill:
            return self.num_layers + 1
        return device_layers

    def gpu_bytes_for(self, tokens: int) -> int:
        """GPU bytes of the plan at `tokens`: banks, slot tables and spilled store layers."""
        spilled = min(self.store_device_layers(tokens), self.num_layers)
        return self.gpu_bank_bytes + tokens * (self.gpu_bytes_per_token + spilled * self.layer_bytes_per_token)

    def device_store_layers(self, tokens: int) -> int:
        """Store layers in GPU memory for a KV of `tokens` that fits: the spilled ones, then as many more whole layers
        as gpu_store_fraction of the GPU budget left after them holds."""
        spilled = min(self.store_device_layers(tokens), self.num_layers)
        left = max(0, self.gpu_budget_bytes - self.gpu_bytes_for(tokens))
        more = int(left * self.gpu_store_fraction) // max(1, tokens * self.layer_bytes_per_token)
        return min(self.num_layers, spilled + more)

    def fits(self, tokens: int) -> bool:
        return (self.store_device_layers(tokens) <= self.num_layers
                and self.gpu_bytes_for(tokens) <= self.gpu_budget_bytes)

    @property
    def host_bytes(self) -> int:
        """Host bytes of a KV of max_tokens (whose spilled layers take the GPU budget: no GPU-first layers)."""
        host_layers = self.num_layers - self.store_device_layers(self.max_tokens)
        return self.max_tokens * host_layers * self.layer_bytes_per_token

    @property
    def host_gib(self) -> float:
        return self.host_bytes / GIB

    @property
    def gpu_bytes(self) -> int:
        return self.gpu_bytes_for(self.max_tokens)

    @property
    def summary(self) -> str:
        spilled = self.store_device_layers(self.max_tokens)
        spill = (f", GPU store {spilled} of {self.num_layers} layers "
                 f"{spilled * self.max_tokens * self.layer_bytes_per_token / GIB:.1f} GiB") if spilled else ""
        return (f"KV capacity: {self.max_tokens:,} tokens: GPU bank {self.attention_bank_tokens:,} tokens, "
                f"host {self.host_gib:.1f} GiB{spill}, {dtype_label(self.kv_dtype)}")

    def layout(self, tokens: int) -> str:
        """Where a store of `tokens` tokens lives (the engine allocates kv-cache-tokens, not max_tokens)."""
        spilled = min(self.store_device_layers(tokens), self.num_layers)
        device = self.device_store_layers(tokens)
        per_layer = tokens * self.layer_bytes_per_token / GIB
        first = f", {device - spilled} of them GPU-first" if device > spilled else ""
        return (f"KV store: {tokens:,} tokens: {self.num_layers - device} layers in host memory "
                f"({(self.num_layers - device) * per_layer:.1f} GiB), {device} in GPU memory ({device * per_layer:.1f} GiB"
                f"{first})")

    def check(self, tokens: int, what: str = "the request") -> None:
        """Refuse `tokens` KV tokens when they exceed max_tokens (call before allocating anything)."""
        if tokens > self.max_tokens:
            spill = " + layers spilled to GPU memory" if self.spill else ""
            raise CapacityError(
                f"{what} needs {tokens:,} KV tokens but the offloaded KV capacity is {self.max_tokens:,} tokens "
                f"(limited by {self.limited_by} memory: host {self.host_budget_bytes / GIB:.1f} GiB{spill}, "
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
    spill: bool | None = None,
    gpu_store_fraction: float | None = None,
    method_bytes_per_token: int = 0,
) -> CapacityPlan:
    """The largest KV (in tokens, a multiple of page_size) that host memory and the GPU allow.

    spill: whether layers may be spilled to GPU memory (default config.spill_store_to_gpu; the engine passes
    False on CPU, where the "GPU" budget is the same host memory); gpu_store_fraction likewise (default the config's,
    the engine passes 0 on CPU). method_bytes_per_token: device memory the
    attention method keeps per slot (`attention/capabilities.KVOffload.device_bytes_per_slot`)."""
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                        ("page_size", page_size)):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    for name, value in (("gpu_free", gpu_free), ("host_available", host_available),
                        ("method_bytes_per_token", method_bytes_per_token)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0 bytes, got {value}")
    dtype_label(kv_dtype)
    dtype_label(bank_dtype)
    element = torch.empty(0, dtype=kv_dtype).element_size()
    shape = (num_layers, 0)  # tables are counted per token below
    heads = (num_kv_heads, head_dim, torch.empty(0, dtype=bank_dtype).element_size())
    bank_bytes = (KVBank.device_bytes(*shape, config.mask_bank_tokens, *heads, with_values=False)
                  + KVBank.device_bytes(*shape, config.attention_bank_tokens, *heads, with_values=True))
    gpu_budget = int(gpu_free * config.gpu_memory_fraction)
    host_budget = int(host_available * config.host_memory_fraction)
    if bank_bytes > gpu_budget:
        raise CapacityError(
            f"mask_bank_tokens={config.mask_bank_tokens:,} and attention_bank_tokens={config.attention_bank_tokens:,} "
            f"need {bank_bytes / GIB:.2f} GiB of GPU memory but only {gpu_budget / GIB:.2f} GiB is usable "
            f"(gpu_memory_fraction={config.gpu_memory_fraction} of {gpu_free / GIB:.2f} GiB free)"
        )
    plan = CapacityPlan(
        max_tokens=0, mask_bank_tokens=config.mask_bank_tokens, attention_bank_tokens=config.attention_bank_tokens,
        kv_dtype=kv_dtype, bank_dtype=bank_dtype, num_layers=num_layers,
        layer_bytes_per_token=2 * num_kv_heads * head_dim * element,
        # the slot tables, the method's per-slot state and, with stage_prefill, one layer's K/V of the prompt
        gpu_bytes_per_token=2 * num_layers * 4 + method_bytes_per_token
        + (2 * num_kv_heads * head_dim * heads[2] if config.stage_prefill else 0),
        gpu_bank_bytes=bank_bytes, host_budget_bytes=host_budget, gpu_budget_bytes=gpu_budget,
        spill=config.spill_store_to_gpu if spill is None else spill,
        gpu_store_fraction=config.gpu_store_fraction if gpu_store_fraction is None else gpu_store_fraction, limited_by="",
    )
    # fits() is monotone in tokens: binary search over whole pages
    lo, hi = 0, (host_budget + gpu_budget) // plan.layer_bytes_per_token // page_size + 1  # hi pages never fit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if plan.fits(mid * page_size) else (lo, mid)
    tokens = lo * page_size
    beyond = plan.store_device_layers(tokens + page_size)  # why one more page does not fit
    limited = "host" if beyond > num_layers else "host + gpu" if beyond else "gpu"
    return replace(plan, max_tokens=tokens, limited_by=limited)

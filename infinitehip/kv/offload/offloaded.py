"""OffloadedKV: the host store and its two GPU banks, built from an `OffloadConfig`.

- `write(layer, slots, k, v)`: new tokens go to the store (host memory; layers the planner spilled: GPU); any bank copy of those slots is dropped
  (slots are reused when the page allocator hands freed pages to a new sequence);
- `resolve_mask(layer, slots)`: keys for the pruning stages, through the mask bank (keys only);
- `resolve_attention(layer, slots)`: keys and values for block-sparse attention, through the attention bank.

Both resolve calls return bank indices [N] int32 to read `mask_bank.flat_k(layer)` or
`attention_bank.flat_k/flat_v(layer)` with page_size 1 (see `resolve.py`).
"""

from __future__ import annotations

import torch

from infinitehip.config.offload import OffloadConfig
from infinitehip.kv.offload.bank import BankStats, KVBank
from infinitehip.kv.offload.store import KVStore
from infinitehip.kv.offload.resolve import invalidate, resolve


class OffloadedKV:
    def __init__(
        self,
        config: OffloadConfig,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        model_dtype: torch.dtype,
        device: torch.device | str,
        pin_memory: bool | None = None,
        store_device_layers: int = 0,
    ):
        device = torch.device(device)
        self.config = config
        self.impl = config.copy_impl(device)
        # The store may be FP8 (half the host memory and PCIe traffic); the banks hold the model's dtype, the
        # row copy of a miss upcasts, so every kernel reads K/V as it would from a resident cache.
        # store_device_layers: layers the planner spilled to GPU memory (the host budget cannot hold them)
        self.store = KVStore(num_layers, num_slots, num_kv_heads, head_dim, config.torch_kv_dtype(model_dtype),
                             pin_memory, store_device_layers, device)
        shape = (num_layers, num_slots)
        rows = (num_kv_heads, head_dim, model_dtype, device)
        self.mask_bank = KVBank("mask", *shape, config.mask_bank_tokens, *rows, with_values=False)
        self.attention_bank = KVBank("attention", *shape, config.attention_bank_tokens, *rows, with_values=True)

    @property
    def banks(self) -> tuple[KVBank, KVBank]:
        return self.mask_bank, self.attention_bank

    @property
    def dtype(self) -> torch.dtype:
        """What the kernels read: the banks' dtype (the model's)."""
        return self.mask_bank.k.dtype

    @property
    def storage_dtype(self) -> torch.dtype:
        """The host store's dtype (kv_dtype)."""
        return self.store.dtype

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k/v [T, Hkv, d] of new tokens into store slots [T]; bank copies of those slots are dropped."""
        self.store.write(layer, slots, k, v, impl=self.impl)
        for bank in self.banks:
            invalidate(bank, layer, slots, impl=self.impl)

    def resolve_mask(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        return resolve(self.mask_bank, self.store, layer, slots, impl=self.impl)

    def resolve_attention(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        return resolve(self.attention_bank, self.store, layer, slots, impl=self.impl)

    def stats(self) -> tuple[BankStats, BankStats]:
        """(mask bank, attention bank) hit / miss counters (reads device tensors: between steps only)."""
        return self.mask_bank.stats(), self.attention_bank.stats()

    def reset_stats(self) -> None:
        for bank in self.banks:
            bank.reset_stats()

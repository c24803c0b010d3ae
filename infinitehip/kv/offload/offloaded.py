"""OffloadedKV: the host store and its two GPU banks, built from an `OffloadConfig`.

- `write(layer, slots, k, v)`: new tokens go to the store (host memory; layers the planner spilled: GPU); any bank copy of those slots is dropped
  (slots are reused when the page allocator hands freed pages to a new sequence);
- `resolve_mask(layer, slots)`: keys for the pruning stages, through the mask bank (keys only);
- `resolve_attention(layer, slots)`: keys and values for block-sparse attention, through the attention bank.

Both resolve calls return bank indices [N] int32 to read `mask_bank.flat_k(layer)` or
`attention_bank.flat_k/flat_v(layer)` with page_size 1 (see `resolve.py`).

Keeping resolved rows across calls: an index stays valid until the next resolve of the same bank and layer
(that call may evict it). `attention_holder` lets one reader keep the attention-bank indices it resolved: the
reader sets it to its own token after resolving (`hold_attention`), and every `resolve_attention` call resets it
to None, so `holds_attention(token)` means that no resolve of any layer ran since (invalidate never moves rows:
it frees entries, which only a later resolve reuses). `copy_to_spare` copies store rows into the attention bank's
spare rows, which no resolve touches (a holder's rows for keys written after its resolve). `mask_holders` does
the same per layer for the mask bank (`hold_mask`): a layer's rows move only by resolves of that layer, and every
`resolve_mask(layer, ...)` resets that layer's holder.
"""

from __future__ import annotations

import torch

from infinitehip.config.offload import OffloadConfig
from infinitehip.kv.offload.bank import BankStats, KVBank
from infinitehip.kv.offload.copy_rows import copy_rows
from infinitehip.kv.offload.store import KVStore
from infinitehip.kv.offload.resolve import invalidate, resolve
from infinitehip.profiling import phase


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
        attention_spare_rows: int = 0,
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
        self.attention_bank = KVBank("attention", *shape, config.attention_bank_tokens, *rows, with_values=True,
                                     spare_rows=attention_spare_rows)
        self.attention_holder: object | None = None  # see the module docstring
        self.mask_holders: list[object | None] = [None] * num_layers  # per layer, see the module docstring

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

    @phase("KV write (offloaded)")
    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k/v [T, Hkv, d] of new tokens into store slots [T]; bank copies of those slots are dropped."""
        self.store.write(layer, slots, k, v, impl=self.impl)
        for bank in self.banks:
            invalidate(bank, layer, slots, impl=self.impl)

    def resolve_mask(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        self.mask_holders[layer] = None  # this call may evict rows the layer's holder kept
        return resolve(self.mask_bank, self.store, layer, slots, impl=self.impl)

    @phase("attention-bank resolve")
    def resolve_attention(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        self.attention_holder = None  # this call may evict rows a holder kept
        return resolve(self.attention_bank, self.store, layer, slots, impl=self.impl)

    def hold_attention(self, token: object) -> None:
        """`token` keeps the attention-bank indices it resolved until the next `resolve_attention` (host state)."""
        self.attention_holder = token

    def holds_attention(self, token: object) -> bool:
        return token is not None and self.attention_holder is token

    def release_holders(self, masks: bool) -> None:
        """No reader holds the attention bank (and, masks: any layer's mask bank) any more: what the resolves of a
        step replayed without Python did (a graph of several sequences, which keeps no rows)."""
        self.attention_holder = None
        if masks:
            self.mask_holders = [None] * len(self.mask_holders)

    def hold_mask(self, layer: int, token: object) -> None:
        """`token` keeps the mask-bank indices of `layer` it resolved until that layer's next `resolve_mask`."""
        self.mask_holders[layer] = token

    def holds_mask(self, layer: int, token: object) -> bool:
        return token is not None and self.mask_holders[layer] is token

    def copy_to_spare(self, layer: int, slots: torch.Tensor, spare: torch.Tensor) -> torch.Tensor:
        """K/V of store slots [N] into the attention bank's spare rows spare [N] (0 .. R - 1; distinct; < 0: skipped)
        -> their flat rows [N] (sync-free; the same conversion as a miss of resolve)."""
        bank = self.attention_bank
        if bank.spare_rows == 0:
            raise ValueError("the attention bank has no spare rows (attention_spare_rows=0)")
        rows = torch.where(spare >= 0, bank.spare_row(spare), -1)
        copy_rows(self.store.k[layer], slots, bank.k[layer], rows, self.impl)
        copy_rows(self.store.v[layer], slots, bank.v[layer], rows, self.impl)
        return rows

    def stats(self) -> tuple[BankStats, BankStats]:
        """(mask bank, attention bank) hit / miss counters (reads device tensors: between steps only)."""
        return self.mask_bank.stats(), self.attention_bank.stats()

    def reset_stats(self) -> None:
        for bank in self.banks:
            bank.reset_stats()

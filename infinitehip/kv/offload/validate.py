"""Validation mode: reading K/V through the offloaded path must give exactly a resident cache's rows.

`mirror_paged_cache` fills the host store from a `PagedKVCache` (same slot numbering), then
`validate_against_paged` resolves each key list through both banks and compares the rows read through the
returned indices with the cache's rows, bit for bit (with an FP8 store, the cache's rows quantized the same
way and upcast to the banks' dtype). Any difference raises `OffloadMismatchError` naming the step, bank, layer and
slot; the report carries the banks' hit statistics. Meant for tests and for a debug run of the engine
(it syncs every step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from infinitehip.kv.offload.bank import BankStats
from infinitehip.kv.offload.store import to_storage_dtype
from infinitehip.kv.offload.offloaded import OffloadedKV
from infinitehip.kv.paged_cache import PagedKVCache


class OffloadMismatchError(AssertionError):
    pass


@dataclass(frozen=True)
class ValidationReport:
    steps: int
    rows_checked: int
    mask: BankStats
    attention: BankStats


def mirror_paged_cache(cache: PagedKVCache, kv: OffloadedKV) -> None:
    """Copy every slot of every layer of `cache` into the offloaded store (the banks drop stale copies)."""
    slots = torch.arange(cache.num_pages * cache.page_size, device=cache.device)
    for layer in range(cache.num_layers):
        kv.write(layer, slots, cache.flat_k(layer), cache.flat_v(layer))


def _first_mismatch(got: torch.Tensor, want: torch.Tensor) -> int | None:
    differs = (got.contiguous().view(torch.uint8) != want.contiguous().view(torch.uint8)).flatten(1).any(1).cpu()
    rows = differs.nonzero()
    return None if rows.numel() == 0 else int(rows[0, 0])


def validate_against_paged(
    cache: PagedKVCache, kv: OffloadedKV, requests: Iterable[tuple[int, torch.Tensor]]
) -> ValidationReport:
    """requests: (layer, slots [N]) per step; slots < 0 are padding. Raises OffloadMismatchError on any difference."""
    steps = rows = 0
    for step, (layer, slots) in enumerate(requests):
        slots = slots.reshape(-1).to(kv.mask_bank.device)
        listed = slots >= 0
        want = slots[listed]
        ref_k, ref_v = (to_storage_dtype(t, kv.storage_dtype).to(kv.dtype) for t in cache.read(layer, want.to(cache.device)))
        mask_idx = kv.resolve_mask(layer, slots)[listed].long()
        att_idx = kv.resolve_attention(layer, slots)[listed].long()
        for bank, name, got, ref in (
            ("mask", "k", kv.mask_bank.flat_k(layer)[mask_idx], ref_k),
            ("attention", "k", kv.attention_bank.flat_k(layer)[att_idx], ref_k),
            ("attention", "v", kv.attention_bank.flat_v(layer)[att_idx], ref_v),
        ):
            row = _first_mismatch(got.to(ref.device), ref)
            if row is not None:
                raise OffloadMismatchError(
                    f"step {step}: {name} of slot {int(want[row])} read through the {bank} bank (layer {layer}) "
                    f"differs from the paged cache"
                )
        steps += 1
        rows += int(listed.sum())
    mask, attention = kv.stats()
    for stats in (mask, attention):
        if any(stats.overflows):
            raise OffloadMismatchError(f"the {stats.name} bank was asked for more distinct slots than it holds "
                                       f"(overflowing calls per layer: {stats.overflows})")
    return ValidationReport(steps, rows, mask, attention)

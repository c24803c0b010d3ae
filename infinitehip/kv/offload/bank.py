"""A GPU bank: a token-granular LRU cache of host-store rows, per layer (state only; `resolve.py` runs it).

Per layer, on the bank's device:
- k [B + 1 + R, Hkv, d] (and v for the attention bank): cached rows; row B is a trash row that masked-off
  updates write to, so every per-step op has a static shape; rows B + 1 .. B + R are spare rows outside the
  LRU (no table, owner or order entry): a caller's own copies of store rows (`OffloadedKV.copy_to_spare`),
  read through the same flat rows (R = spare_rows, 0 unless asked for);
- table [S + 1] int32: store slot -> bank index, -1 when not resident (entry S is trash). Kernels read it
  (or resolve's output) as a page table with page_size 1;
- owner [B + 1] int32: bank index -> store slot, -1 when free (the reverse map);
- last_used [B + 1] int64: the layer's clock value at the entry's last request, 0 when free (LRU stamps;
  resolve uses "last_used == this call's stamp" as its "requested in this call" mark, no clearing needed);
- order [B + 1] int32: the bank entries from least to most recently used, free entries first by index
  (initially arange(B)); entry B of the array is trash (masked-off writes of the eager path);
- clock: per-layer call counter, advanced on the device by every resolve (a Python step number would
  be frozen into a CUDA graph at capture; the device counter advances on every replay);
- hits / misses: per-layer counters of distinct requested slots, device tensors read only by `stats()`;
- overflows: per-layer count of calls that requested more distinct slots than the bank holds (their
  result is wrong; the planner's check makes this impossible, the counter shows a violation sync-free).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infinitehip.kv.offload.store import dtype_label


@dataclass(frozen=True)
class BankStats:
    name: str
    hits: list[int]  # per layer, distinct requested slots that were resident
    misses: list[int]  # per layer, distinct requested slots copied from the host store
    overflows: list[int]  # per layer, calls that requested more distinct slots than the bank holds

    @property
    def total_hits(self) -> int:
        return sum(self.hits)

    @property
    def total_misses(self) -> int:
        return sum(self.misses)

    @property
    def hit_ratio(self) -> float:
        total = self.total_hits + self.total_misses
        return self.total_hits / total if total else 0.0

    def layer_hit_ratio(self, layer: int) -> float:
        total = self.hits[layer] + self.misses[layer]
        return self.hits[layer] / total if total else 0.0


class KVBank:
    def __init__(
        self,
        name: str,
        num_layers: int,
        num_slots: int,
        bank_tokens: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        with_values: bool,
        spare_rows: int = 0,
    ):
        for field, value in (("bank_tokens", bank_tokens), ("num_layers", num_layers), ("num_slots", num_slots)):
            if value < 1:
                raise ValueError(f"{name} bank: {field} must be positive, got {value}")
        dtype_label(dtype)
        self.name = name
        if spare_rows < 0:
            raise ValueError(f"{name} bank: spare_rows must be >= 0, got {spare_rows}")
        self.num_layers, self.num_slots, self.bank_tokens, self.spare_rows = num_layers, num_slots, bank_tokens, spare_rows
        L, S, B = num_layers, num_slots, bank_tokens
        self.k = torch.zeros((L, B + 1 + spare_rows, num_kv_heads, head_dim), dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k) if with_values else None
        self.table = torch.full((L, S + 1), -1, dtype=torch.int32, device=device)
        self.owner = torch.full((L, B + 1), -1, dtype=torch.int32, device=device)
        self.last_used = torch.zeros((L, B + 1), dtype=torch.int64, device=device)
        self.order = torch.arange(B + 1, dtype=torch.int32, device=device).repeat(L, 1)
        self.clock = torch.zeros(L, dtype=torch.int64, device=device)
        self.hits = torch.zeros(L, dtype=torch.int64, device=device)
        self.misses = torch.zeros(L, dtype=torch.int64, device=device)
        self.overflows = torch.zeros(L, dtype=torch.int64, device=device)

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @staticmethod
    def device_bytes(num_layers: int, num_slots: int, bank_tokens: int, num_kv_heads: int, head_dim: int,
                     element_size: int, with_values: bool, spare_rows: int = 0) -> int:
        """Device memory of a bank with these sizes (rows, table, reverse map, stamps, LRU order), before allocating it."""
        rows = (2 if with_values else 1) * (bank_tokens + 1 + spare_rows) * num_kv_heads * head_dim * element_size
        maps = (bank_tokens + 1) * (4 + 8 + 4) + (num_slots + 1) * 4  # owner int32, last_used int64, order int32
        return num_layers * (rows + maps + 32)  # + clock, hits, misses, overflows

    def flat_k(self, layer: int) -> torch.Tensor:
        """[B + 1 + R, Hkv, d] rows of `layer`: index them with resolve's output (page_size 1) or spare rows."""
        return self.k[layer]

    def flat_v(self, layer: int) -> torch.Tensor:
        if self.v is None:
            raise ValueError(f"the {self.name} bank holds keys only")
        return self.v[layer]

    def spare_row(self, index: torch.Tensor) -> torch.Tensor:
        """Flat row of spare row `index` (0 .. R - 1, any shape)."""
        return index + (self.bank_tokens + 1)

    def resident_slots(self, layer: int) -> torch.Tensor:
        """Store slots resident in `layer` (sorted; syncs: statistics and tests only)."""
        owner = self.owner[layer, : self.bank_tokens]
        return owner[owner >= 0].sort().values

    def stats(self) -> BankStats:
        """Hit / miss counters (reads device tensors: call between steps, not inside a captured graph)."""
        return BankStats(self.name, self.hits.tolist(), self.misses.tolist(), self.overflows.tolist())

    def reset_stats(self) -> None:
        self.hits.zero_()
        self.misses.zero_()
        self.overflows.zero_()

    def clear(self) -> None:
        """Forget every resident row (the rows themselves are left as they are)."""
        self.table.fill_(-1)
        self.owner.fill_(-1)
        self.last_used.zero_()
        self.order.copy_(torch.arange(self.bank_tokens + 1, dtype=torch.int32, device=self.device).expand_as(self.order))

    def lru_order(self, layer: int) -> torch.Tensor:
        """[B] bank entries of `layer` from least to most recently used (free ones first, by index)."""
        return self.order[layer, : self.bank_tokens]

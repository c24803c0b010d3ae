"""OffloadedPagedCache: the offloaded KV (host store + GPU banks) behind the paged-cache surface of the engine.

The engine builds it instead of `PagedKVCache` when offloading is on; the page allocator and page tables
are unchanged (store slot = page * page_size + offset, as in the paged cache). What it keeps of that surface:
- `write(layer, slots, k, v)`: the step's new K/V go to the host store and stale bank copies of those slots
  are dropped (sync-free, `OffloadedKV.write`);
- `read(layer, slots)` / `read_k(layer, slots)`: rows gathered through the attention bank, in pieces of at
  most its size (each piece is resolved, then gathered before the next resolve can evict it); the number
  of pieces follows from the shape, so it stays sync-free (the landmark saliency update reads keys here);
- `scan_k(layer, page_table, start, end)` / `read_k_store(layer, slots)`: keys straight from the store
  (whole-context scans; the decode saliency window when no kept rows hold it);
- `flat_k` / `flat_v` raise: indexing bank rows with page tables would read the wrong rows silently.
  Offload-aware methods reach rows through `kv.resolve_mask` / `kv.resolve_attention` and the banks' flat
  rows (see `attention/methods/infinitehip/offload_access.py`).

`token_table(tokens, bank_index, bank)` scatters bank indices into a persistent [num_slots + 1] int32 table (one per bank) indexed
by token position, read by kernels as a page table with page_size 1 (design note option (a)): only the
listed tokens' entries are written and read, so no O(context) fill is needed; every entry always holds a
valid bank row (masked-off entries go to the spare last entry; -1 from resolve becomes the bank's trash row).
"""

from __future__ import annotations

import torch

from infinitehip.config.offload import OffloadConfig
from infinitehip.kv.offload.bank import BankStats, KVBank
from infinitehip.kv.offload.offloaded import OffloadedKV
from infinitehip.kv.paged_cache import token_slots
from infinitehip.profiling import phase


class OffloadedAccessError(RuntimeError):
    """A method read the offloaded KV as if it were resident (flat rows indexed by page tables)."""


def safe_rows(bank: KVBank, index: torch.Tensor) -> torch.Tensor:
    """Bank indices with -1 (padding) replaced by the bank's trash row: always in range for a kernel."""
    return torch.where(index >= 0, index, bank.bank_tokens).to(torch.int32)


class OffloadedPagedCache:
    is_offloaded = True

    def __init__(self, config: OffloadConfig, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int,
                 head_dim: int, model_dtype: torch.dtype, device: torch.device | str, pin_memory: bool | None = None,
                 store_device_layers: int = 0, attention_spare_rows: int = 0):
        self.num_layers, self.num_pages, self.page_size = num_layers, num_pages, page_size
        self.kv = OffloadedKV(config, num_layers, num_pages * page_size, num_kv_heads, head_dim, model_dtype, device,
                              pin_memory, store_device_layers, attention_spare_rows)
        # One token table per bank: an entry left by one bank's call must be a valid row of the bank read next.
        self._tables = {b.name: torch.zeros(self.num_slots + 1, dtype=torch.int32, device=self.device)
                        for b in self.kv.banks}
        self._staged: dict[str, torch.Tensor] = {}  # `stage`'s buffers by part ("k", "v"), grown on demand

    @property
    def device(self) -> torch.device:
        return self.kv.mask_bank.device

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def dtype(self) -> torch.dtype:
        return self.kv.dtype

    @property
    def bytes_per_token(self) -> int:
        """Store bytes of one token (K and V of every layer)."""
        return self.kv.store.bytes_per_token

    @property
    def device_bytes(self) -> int:
        """Device memory of both banks (rows, tables, maps), the token tables and the store's spilled layers."""
        banks = sum(t.numel() * t.element_size() for b in self.kv.banks for t in
                    (b.k, b.v, b.table, b.owner, b.last_used, b.order) if t is not None)
        return banks + sum(t.numel() * 4 for t in self._tables.values()) + self.kv.store.device_bytes

    def slots(self, page_table: torch.Tensor, start: int, end: int) -> torch.Tensor:
        return token_slots(page_table, torch.arange(start, end, device=page_table.device), self.page_size)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.kv.write(layer, slots, k, v)

    def _gather(self, layer: int, slots: torch.Tensor, values: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        bank = self.kv.attention_bank
        flat = slots.reshape(-1)
        ks, vs = [], []
        for i in range(0, flat.numel(), bank.bank_tokens):
            rows = safe_rows(bank, self.kv.resolve_attention(layer, flat[i : i + bank.bank_tokens])).long()
            ks.append(bank.flat_k(layer)[rows])
            if values:
                vs.append(bank.flat_v(layer)[rows])
        shape = (*slots.shape, *bank.k.shape[-2:])
        if not ks:
            empty = bank.k.new_empty(shape)
            return empty, empty.clone() if values else None
        return torch.cat(ks).view(shape), torch.cat(vs).view(shape) if values else None

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k/v [N, Hkv, d] of slots [N], through the attention bank."""
        return self._gather(layer, slots, values=True)

    def read_k(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Keys [*slots.shape, Hkv, d] of slots (any shape), through the attention bank."""
        return self._gather(layer, slots, values=False)[0]

    def read_k_store(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Keys [N, Hkv, d] (the banks' dtype, on the device) of slots [N], straight from the store: no bank call, so
        no row a reader keeps is evicted (sync-free with the Triton copy; the same upcast as a bank miss)."""
        out = self.kv.mask_bank.k.new_empty((slots.numel(), *self.kv.store.row_shape))
        return self.kv.store.gather_k(layer, slots.reshape(-1), out, self.kv.impl)

    def scan_k(self, layer: int, page_table: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Keys [end - start, Hkv, d] (the banks' dtype, on the device) of token positions [start, end) of the
        sequence with this page table, read from the store and not through the banks: a one-off scan of the whole
        context (question-time selection) would evict every row the banks cache."""
        return self.read_k_store(layer, self.slots(page_table, start, end))

    @phase("staged layer copy (store -> GPU)")
    def stage(self, layer: int, page_table: torch.Tensor, tokens: int, part: str) -> torch.Tensor:
        """Keys (part "k") or values ("v") [tokens', Hkv, d] (the banks' dtype, on the device; tokens' = tokens
        rounded up to a page) of the sequence's positions [0, tokens), in position order, copied from the store into
        one reused GPU buffer per part: a prefill chunk reads every key of its context at least once (stage 1 scores
        every chunk), which through the banks costs more in resolves than one streaming copy. Rows past `tokens`
        are stale. Valid until the next call for the same part."""
        ps = self.page_size
        need = -(-tokens // ps) * ps
        held = self._staged.get(part)
        if held is None or held.shape[0] < need:
            grown = max(need, 2 * held.shape[0]) if held is not None else need
            self._staged[part] = held = None  # free the old buffer before allocating the larger one
            shape = (min(grown, self.num_slots), *self.kv.store.row_shape)
            held = self._staged[part] = self.kv.mask_bank.k.new_empty(shape)
        out = held[:need]
        gather = self.kv.store.gather_k if part == "k" else self.kv.store.gather_v
        gather(layer, self.slots(page_table, 0, tokens), out[:tokens], self.kv.impl)
        return out

    def flat_k(self, layer: int) -> torch.Tensor:
        raise OffloadedAccessError("the KV cache is offloaded (offload-enabled): read keys through the banks, "
                                   "not as flat rows indexed by page tables")

    flat_v = flat_k

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        raise OffloadedAccessError("cache compaction is not supported with KV offloading")

    @phase("token tables")
    def token_table(self, tokens: torch.Tensor, bank_index: torch.Tensor, bank: KVBank,
                    listed: torch.Tensor | None = None) -> torch.Tensor:
        """The token -> bank-row table (page_size 1) after writing bank_index at tokens (entries not `listed` skipped)."""
        tokens = tokens.reshape(-1).long()
        if listed is not None:
            tokens = torch.where(listed.reshape(-1), tokens, self.num_slots)
        table = self._tables[bank.name]
        table.scatter_(0, tokens, safe_rows(bank, bank_index.reshape(-1)))
        return table

    def stats(self) -> tuple[BankStats, BankStats]:
        return self.kv.stats()

    def reset_stats(self) -> None:
        self.kv.reset_stats()

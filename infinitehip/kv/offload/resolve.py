"""resolve: make requested store slots resident in a bank and return where they live (paper Sec. 3.3, Alg. 4).

`resolve(bank, store, layer, slots, impl) -> bank_index [N] int32` (-1 for padding slots < 0). Afterwards
`bank.flat_k(layer)[bank_index[i]]` is the row of store slot `slots[i]`, so existing kernels read keys
through the result as a page table with page_size 1. Every op is sync-free with static shapes (no
.item(), .tolist(), nonzero() or boolean-mask indexing, no host->device copy of a Python scalar), so the
call can be captured in a CUDA graph.

Policy (exact LRU): each bank entry is either free or holds one store slot. The LRU list of a layer is
`bank.order` [B]: free entries first, by index, then used entries from least to most recently used.
The distinct slots of one call count as used at the same time, ordered by slot (an OrderedDict LRU that
appends a call's slots in sorted order; `tests/kv/test_kv_offload.py` checks both against it and against
the former top-k formulation, key = last_used * (S + 1) + owner, on random traces).

Design: the LRU list is kept explicitly, so finding the victims is one O(B) scan instead of a top-k.
The former version computed a key for all B + 1 entries and ran `torch.topk(key, min(N, B))` plus ~25
small ops: 348 us per call from a CUDA graph on an H100 (65,536-entry bank, 3,300 requests), mostly the
top-k. Steps of one call:

1. dedupe: sort the N requested slots (padding < 0 sorts first); the first row of each run of equal
   slots ("first") stands for the slot;
2. look up the first rows in the table: resident -> hit, else miss. Stamp the hit entries with this
   call's clock value (`last_used = stamp`): the stamp is the "requested in this call" mark (no mark
   array to clear: older stamps are smaller);
3. one pass over `order` (a stable partition): entries whose stamp is not this call's are ranked k = 0,
   1, ...; the first `taken = min(misses, B - hits)` of them are the victims (the LRU entries not
   requested: free ones first), every other one moves to position k - taken (relative order kept). The
   j-th miss (in slot order) takes the j-th victim;
4. table (evicted slots -> -1, missed slots -> victim), reverse map and stamps of the victims; the hits
   and victims are written to the tail of `order`, [B - hits - taken, B), in slot order;
5. copy the missed rows host -> bank (`copy_rows`: Triton reads pinned host memory through UVA; the
   eager reference syncs);
6. count hits / misses on the device; each request reads its index back from the updated table.

`invalidate` frees the entries of rewritten slots (owner -1, stamp 0, table -1) and re-partitions
`order`: free entries first by index, used ones after them in their order (O(B); the Triton kernel skips
it on the device when none of the slots was resident, the usual case for newly written tokens).

Two implementations with identical results: `impl="reference"` (or "cpu", config/impl.py) runs steps 2-4 and 6 as eager torch ops
(sync-free; the oracle, plus the syncing reference row copy) and `impl="triton"` runs them in four
kernels (`lru/triton.py`): lookup (one program over N), partition (<= 128 programs over B; each waits for
its predecessors' counts, published on the device), finish and output (one program per 256 requests,
ranks offset by the counts the lookup recorded per 256 requests). A call with
impl="triton" is: sort (1-3 launches) + 4 kernels + the row copy of k (and v). Memory per entry is
unchanged (owner int32 4 + last_used int64 8 + order int32 4 = 16 bytes; owner was int64 before).

A call must not request more distinct slots than the bank holds: there would be fewer victims than
misses. Checking that per call would need a sync, so the worst case per call is checked at planning time
(`planner.check_bank_requests`). Such a call is counted in `overflows`; its hits and its first
B - hits misses (in slot order) become resident, the other misses get index -1 and the bank stays
consistent. Indices returned by a call stay valid until the next resolve of the same bank and layer (that
call may evict rows this one returned, if it does not request them again).
"""

from __future__ import annotations

import importlib

import torch

from infinitehip.kv.offload.bank import KVBank
from infinitehip.kv.offload.copy_rows import check_copy_impl, copy_rows
from infinitehip.kv.offload.store import KVStore


def _scalar(value: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A device scalar made by a fill kernel (torch.tensor(...) would copy from the host: not capturable)."""
    return torch.full((), value, dtype=dtype, device=device)


def resolve(bank: KVBank, store: KVStore, layer: int, slots: torch.Tensor, impl: str = "reference") -> torch.Tensor:
    """slots [N] (or any shape) store slots on the bank's device, < 0 = padding -> bank indices, same shape, int32."""
    if slots.device != bank.device:
        raise ValueError(f"resolve: slots are on {slots.device} but the {bank.name} bank is on {bank.device}")
    check_copy_impl(impl)
    shape = slots.shape
    slots = slots.reshape(-1).long()
    n = slots.numel()
    if n == 0:
        return torch.empty(shape, dtype=torch.int32, device=bank.device)
    # 1. dedupe: padding (< 0) sorts first; equal slots are adjacent. Sorted as int32 when the slots fit: a radix
    #    sort makes one pass per key byte, so half the passes of int64 keys for the same order.
    if bank.num_slots < 2**31:
        s_sorted, perm = torch.sort(slots.to(torch.int32))
        s_sorted = s_sorted.long()
    else:
        s_sorted, perm = torch.sort(slots)
    if impl == "triton":
        out = torch.empty(n, dtype=torch.int32, device=bank.device)
        rows = torch.empty((2, n), dtype=torch.int32, device=bank.device)
        L = layer
        importlib.import_module("infinitehip.kv.offload.lru.triton").lru_resolve_triton(
            bank.table[L], bank.owner[L], bank.last_used[L], bank.order[L], bank.clock[L : L + 1], bank.hits[L : L + 1],
            bank.misses[L : L + 1], bank.overflows[L : L + 1], s_sorted, perm, bank.bank_tokens, out, rows[0], rows[1])
        src_rows, dst_rows = rows[0], rows[1]
    else:
        out, src_rows, dst_rows = _resolve_reference(bank, layer, s_sorted, perm)
    # 5. missed rows host -> bank
    copy_rows(store.k[layer], src_rows, bank.k[layer], dst_rows, impl)
    if bank.v is not None:
        copy_rows(store.v[layer], src_rows, bank.v[layer], dst_rows, impl)
    return out.view(shape)


def _resolve_reference(bank: KVBank, layer: int, s_sorted: torch.Tensor, perm: torch.Tensor):
    """Steps 2-4 and 6 in eager torch (sync-free, static shapes): the oracle of the Triton kernels."""
    S, B = bank.num_slots, bank.bank_tokens
    table, owner, last_used, order = bank.table[layer], bank.owner[layer], bank.last_used[layer], bank.order[layer]
    device = table.device
    n = s_sorted.numel()
    valid = s_sorted >= 0
    first = valid.clone()
    first[1:] &= s_sorted[1:] != s_sorted[:-1]
    slot = torch.where(valid, s_sorted, S)

    # 2. hits and misses; stamp the hits ("requested in this call")
    current = table[slot].long()
    hit = first & (current >= 0)
    miss = first & (current < 0)
    bank.clock[layer : layer + 1] += 1
    stamp = bank.clock[layer]
    last_used.index_put_((torch.where(hit, current, B),), stamp.expand(n))
    num_hits, num_misses = hit.sum(), miss.sum()
    taken = torch.minimum(num_misses, B - num_hits)  # victims; < misses only when the call overflows

    # 3. one pass over the LRU order: the first `taken` entries not requested are the victims, every other
    #    entry not requested moves left (keeping its order); the requested ones are appended in step 4
    entries = order[:B].long()
    keep = last_used[entries] != stamp
    k = torch.cumsum(keep, 0) - 1
    victims = torch.empty(min(n, B) + 1, dtype=torch.int64, device=device)  # last: trash
    victims.scatter_(0, torch.where(keep & (k < taken), k, min(n, B)), entries)
    order.scatter_(0, torch.where(keep & (k >= taken), k - taken, B), entries.to(torch.int32))

    # 4. bookkeeping (masked rows write to the trash entries S / B)
    rank = torch.cumsum(miss, 0) - 1
    placed_miss = miss & (rank < B - num_hits)
    victim = victims[rank.clamp(0, min(n, B) - 1)]
    evicted = owner[torch.where(placed_miss, victim, B)].long()
    table.index_put_((torch.where(placed_miss & (evicted >= 0), evicted, S),), _scalar(-1, torch.int32, device))
    table.index_put_((torch.where(placed_miss, slot, S),), victim.to(torch.int32))
    owner.index_put_((torch.where(placed_miss, victim, B),), slot.to(torch.int32))
    last_used.index_put_((torch.where(placed_miss, victim, B),), stamp.expand(n))
    placed = hit | placed_miss
    placed_rank = torch.cumsum(placed, 0) - 1
    tail = B - (num_hits + taken) + placed_rank
    order.index_put_((torch.where(placed, tail, B),), torch.where(hit, current, victim).to(torch.int32))
    src_rows = torch.where(placed_miss, s_sorted, -1)
    dst_rows = torch.where(placed_miss, victim, -1)

    # 6. statistics
    bank.hits[layer : layer + 1] += num_hits
    bank.misses[layer : layer + 1] += num_misses
    bank.overflows[layer : layer + 1] += (num_hits + num_misses > B).long()

    # every row reads its slot's entry from the updated table (-1: padding, or a miss an overflow left out)
    out_sorted = torch.where(valid, table[slot], -1).to(torch.int32)
    out = torch.empty_like(out_sorted)
    out.scatter_(0, perm, out_sorted)
    return out, src_rows, dst_rows


def invalidate(bank: KVBank, layer: int, slots: torch.Tensor, impl: str = "reference") -> None:
    """Drop slots [N] (< 0 = padding) from `layer` of the bank: their store rows were rewritten (sync-free)."""
    check_copy_impl(impl)
    slots = slots.reshape(-1).long().to(bank.device)
    if slots.numel() == 0:
        return
    S, B = bank.num_slots, bank.bank_tokens
    table, owner, last_used, order = bank.table[layer], bank.owner[layer], bank.last_used[layer], bank.order[layer]
    if impl == "triton":
        importlib.import_module("infinitehip.kv.offload.lru.triton").lru_invalidate_triton(
            table, owner, last_used, order, slots, S, B)
        return
    slots = torch.where((slots >= 0) & (slots < S), slots, S)
    current = table[slots].long()
    resident = (slots < S) & (current >= 0)
    entry = torch.where(resident, current, B)
    owner.index_put_((entry,), _scalar(-1, torch.int32, bank.device))
    last_used.index_put_((entry,), _scalar(0, torch.int64, bank.device))
    table.index_put_((torch.where(resident, slots, S),), _scalar(-1, torch.int32, bank.device))
    # free entries first, by index; used entries after them in their LRU order (the Triton kernel skips
    # this when nothing was resident: the order is then unchanged)
    entries = order[:B].long()
    used = owner[entries] >= 0
    free = owner[:B] < 0
    num_free = free.sum()
    order.scatter_(0, torch.where(used, num_free + torch.cumsum(used, 0) - 1, B), entries.to(torch.int32))
    order.scatter_(0, torch.where(free, torch.cumsum(free, 0) - 1, B),
                   torch.arange(B, dtype=torch.int32, device=bank.device))

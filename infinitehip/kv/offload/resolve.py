"""resolve: make requested store slots resident in a bank and return where they live (paper Sec. 3.3, Alg. 4).

`resolve(bank, store, layer, slots, impl) -> bank_index [N] int32` (-1 for padding slots < 0). Afterwards
`bank.flat_k(layer)[bank_index[i]]` is the row of store slot `slots[i]`, so existing kernels read keys
through the result as a page table with page_size 1. Every op is sync-free with static shapes (no
.item(), .tolist(), nonzero() or boolean-mask indexing), so the call can be captured in a CUDA graph:

1. dedupe: sort the N requested slots; the first of each run of equal slots is "first"; padding (< 0) is
   mapped to slot S and sorted last;
2. look up the first rows in the table: resident -> hit, else miss;
3. victims: LRU key per bank entry = last_used * (S + 1) + owner (free entries sort before all used
   ones, by index); entries hit in this call get +inf (never evict a slot this call requests); the
   min(N, B) smallest keys, in order, are the victims and the j-th miss takes the j-th victim. Ties in
   last_used (entries of the same call) are broken by smaller slot first, which is what an LRU list
   does when a call's slots are appended in sorted order;
4. update table (evicted slots -> -1, missed slots -> victim), reverse map and stamps; masked-off rows of
   each update write to the trash entry (index S of the table, B of the bank arrays);
5. copy the missed rows host -> bank (`copy_rows`: Triton reads pinned host memory through UVA; the
   eager reference syncs);
6. count hits / misses on the device.

A call must not request more distinct slots than the bank holds: there would be fewer victims than
misses. Checking that per call would need a sync, so the worst case per call is checked at planning time
(`planner.check_bank_requests`). Indices returned by a call stay valid until the next resolve of the same
bank and layer (that call may evict rows this one returned, if it does not request them again).
"""

from __future__ import annotations

import torch

from infinitehip.kv.offload.bank import KVBank
from infinitehip.kv.offload.copy_rows import copy_rows
from infinitehip.kv.offload.host_store import HostKVStore

_MAX = torch.iinfo(torch.int64).max


def _scalar(value: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A device scalar made by a fill kernel (torch.tensor(...) would copy from the host: not capturable)."""
    return torch.full((), value, dtype=dtype, device=device)


def resolve(bank: KVBank, store: HostKVStore, layer: int, slots: torch.Tensor, impl: str = "reference") -> torch.Tensor:
    """slots [N] (or any shape) store slots on the bank's device, < 0 = padding -> bank indices, same shape, int32."""
    if slots.device != bank.device:
        raise ValueError(f"resolve: slots are on {slots.device} but the {bank.name} bank is on {bank.device}")
    shape = slots.shape
    slots = slots.reshape(-1).long()
    n = slots.numel()
    S, B = bank.num_slots, bank.bank_tokens
    if n == 0:
        return torch.empty(shape, dtype=torch.int32, device=bank.device)
    table, owner, last_used = bank.table[layer], bank.owner[layer], bank.last_used[layer]
    device = table.device

    # 1. dedupe (sort-based, static size)
    s_sorted, order = torch.sort(torch.where(slots >= 0, slots, S))
    valid = s_sorted < S
    first = valid.clone()
    first[1:] &= s_sorted[1:] != s_sorted[:-1]

    # 2. hits and misses
    current = table[s_sorted].long()
    hit = first & (current >= 0)
    miss = first & (current < 0)

    # 3. victims: least recently used entries not requested by this call
    bank.clock[layer : layer + 1] += 1
    stamp = bank.clock[layer]
    entries = torch.arange(B + 1, device=device)
    key = torch.where(owner >= 0, last_used * (S + 1) + owner, entries - (B + 1))
    key[B:].fill_(_MAX)  # the trash entry is never a victim (fill_: no host->device copy, capturable)
    key.scatter_reduce_(0, torch.where(hit, current, B), torch.full_like(current, _MAX), reduce="amax")
    num_victims = min(n, B)
    victims = torch.topk(key, num_victims, largest=False, sorted=True).indices
    rank = (torch.cumsum(miss, 0) - 1).clamp(0, num_victims - 1)
    victim = victims[rank]
    resolved = torch.where(miss, victim, current)

    # 4. bookkeeping (masked rows write to the trash entries S / B)
    evicted = owner[torch.where(miss, victim, B)]
    table.index_put_((torch.where(miss & (evicted >= 0), evicted, S),), _scalar(-1, torch.int32, device))
    table.index_put_((torch.where(miss, s_sorted, S),), victim.to(torch.int32))
    owner.index_put_((torch.where(miss, victim, B),), s_sorted)
    last_used.index_put_((torch.where(first, resolved, B),), stamp.expand(n))

    # 5. missed rows host -> bank
    src_rows = torch.where(miss, s_sorted, -1)
    dst_rows = torch.where(miss, victim, -1)
    copy_rows(store.k[layer], src_rows, bank.k[layer], dst_rows, impl)
    if bank.v is not None:
        copy_rows(store.v[layer], src_rows, bank.v[layer], dst_rows, impl)

    # 6. statistics
    bank.hits[layer : layer + 1] += hit.sum()
    bank.misses[layer : layer + 1] += miss.sum()
    bank.overflows[layer : layer + 1] += (first.sum() > B).long()

    # every row of a run of equal slots takes its first row's index; back to the request order
    rows = torch.arange(n, device=device)
    run_first = torch.where(first, rows, 0).cummax(0).values
    out_sorted = torch.where(valid, resolved[run_first], -1).to(torch.int32)
    out = torch.empty_like(out_sorted)
    out.scatter_(0, order, out_sorted)
    return out.view(shape)


def invalidate(bank: KVBank, layer: int, slots: torch.Tensor) -> None:
    """Drop slots [N] (< 0 = padding) from `layer` of the bank: their store rows were rewritten (sync-free)."""
    slots = slots.reshape(-1).long().to(bank.device)
    if slots.numel() == 0:
        return
    S, B = bank.num_slots, bank.bank_tokens
    table, owner, last_used = bank.table[layer], bank.owner[layer], bank.last_used[layer]
    slots = torch.where(slots >= 0, slots, S)
    current = table[slots].long()
    resident = (slots < S) & (current >= 0)
    entry = torch.where(resident, current, B)
    owner.index_put_((entry,), _scalar(-1, torch.int64, bank.device))
    last_used.index_put_((entry,), _scalar(0, torch.int64, bank.device))
    table.index_put_((torch.where(resident, slots, S),), _scalar(-1, torch.int32, bank.device))

"""The LRU bookkeeping of `resolve` / `invalidate` as Triton kernels; same results as the torch version in
`resolve.py` (`impl="reference"`, the oracle the tests compare with). See `resolve.py` for the design.

resolve after the dedupe sort, four launches:
  _lookup_kernel   (1 program, loops over the N sorted requests): clock += 1; hits / misses from the table;
                   stamps the hit entries (last_used = stamp: "requested in this call"); writes
                   meta = (stamp, hits, misses), the hits and misses of every sub-block of SUB requests (the
                   finish programs' prefixes) and zeroes the partition's publish flags;
  _partition_kernel (cdiv(B, BLOCK_B) programs <= 128, all co-resident): each program reads its block of
                   `order` and the stamps of those entries, publishes its count of non-hit entries,
                   waits for the counts of the programs before it (a prefix over at most 128 flags), then
                   writes the victims (the first min(misses, B - hits) non-hit entries) and moves every other
                   non-hit entry left, in place: a program stores only below its own block, into blocks whose
                   programs have already read them (they published after reading);
  _finish_kernel   (one program per sub-block of SUB requests; its miss and placement ranks start at the sums
                   of the earlier sub-blocks' counts): victims -> table / reverse map / stamps, the requested
                   entries appended to `order` in sorted-slot order, copy lists for the row copy. Programs
                   never touch the same entry: victims are distinct, evicted slots are never requested, and
                   each requested slot is handled by the program holding its first request;
  _output_kernel   (one program per sub-block, after every table write): the output indices read back from
                   the table and scattered to the request order; program 0 adds the counters.
invalidate: one program; the O(B) re-partition (free entries first, by index) runs only when a slot was
resident (a device-side branch: nothing to do costs one short launch).
Under TRITON_INTERPRET=1 programs run one after another in order, so the publish / wait handshake never
waits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()

MAX_PROGRAMS = 128  # partition programs; all must be resident at once (the wait needs its predecessors)
# requests per loop step of the one-program kernels (fewer steps = a shorter chain of dependent loads):
# largest blocks without register spills on sm_90 (the offline compile of `git show 29b96eb:bench/ptxas_report.py`)
LOOKUP_BLOCK, LOOKUP_WARPS = 4096, 16
INVALIDATE_BLOCK = 2048  # requests per loop step of the invalidate kernel
SUB = 256  # requests per finish / output program (the lookup records counts per SUB requests)
PREFIX_BLOCK = 1024  # sub-block counts summed per loop step of a finish program


@triton.jit
def _first_requests(Sorted, Table, i, n):
    """Sorted requests at positions i [BLOCK]: (in range, slot, first of its run of equal slots and not padding,
    the table entry of those first ones: bank index or -1)."""
    m = i < n
    s = tl.load(Sorted + i, mask=m, other=-1)
    prev = tl.load(Sorted + i - 1, mask=m & (i > 0), other=-1)
    first = m & (s >= 0) & (s != prev)
    cur = tl.load(Table + s, mask=first, other=-1)
    return m, s, first, cur


@triton.jit
def _lookup_kernel(Sorted, Table, LastUsed, Clock, Meta, Flags, SubHits, SubMisses, n, num_flags, num_sub,
                   BLOCK_N: tl.constexpr, FLAGS: tl.constexpr, SUB: tl.constexpr):
    stamp = tl.load(Clock) + 1
    tl.store(Clock, stamp)
    num_hits = tl.sum(tl.zeros([BLOCK_N], dtype=tl.int32), 0)
    num_misses = tl.sum(tl.zeros([BLOCK_N], dtype=tl.int32), 0)
    for start in range(0, n, BLOCK_N):
        m, s, first, cur = _first_requests(Sorted, Table, start + tl.arange(0, BLOCK_N), n)
        hit = first & (cur >= 0)
        miss = first & (cur < 0)
        tl.store(LastUsed + cur, stamp, mask=hit)
        num_hits += tl.sum(hit.to(tl.int32), 0)
        num_misses += tl.sum(miss.to(tl.int32), 0)
        j = start // SUB + tl.arange(0, BLOCK_N // SUB)  # the sub-blocks of this step
        tl.store(SubHits + j, tl.sum(tl.reshape(hit.to(tl.int32), (BLOCK_N // SUB, SUB)), 1), mask=j < num_sub)
        tl.store(SubMisses + j, tl.sum(tl.reshape(miss.to(tl.int32), (BLOCK_N // SUB, SUB)), 1), mask=j < num_sub)
    tl.store(Meta, stamp)
    tl.store(Meta + 1, num_hits.to(tl.int64))
    tl.store(Meta + 2, num_misses.to(tl.int64))
    f = tl.arange(0, FLAGS)
    tl.store(Flags + f, tl.zeros([FLAGS], dtype=tl.int32), mask=f < num_flags)


@triton.jit
def _partition_kernel(Order, LastUsed, Meta, Victims, Flags, B, BLOCK_B: tl.constexpr, FLAGS: tl.constexpr):
    pid = tl.program_id(0)
    stamp = tl.load(Meta)
    num_hits = tl.load(Meta + 1).to(tl.int32)
    num_misses = tl.load(Meta + 2).to(tl.int32)
    taken = tl.minimum(num_misses, B - num_hits)  # victims (fewer than misses only when the call overflows)
    p = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    pm = p < B
    e = tl.load(Order + p, mask=pm, other=0)
    used = tl.load(LastUsed + e, mask=pm, other=0)
    keep = pm & (used != stamp)  # not requested in this call: a victim or moved left
    count = tl.sum(keep.to(tl.int32), 0)
    tl.atomic_xchg(Flags + pid, count + 1)  # publish (after the reads of this block: `count` depends on them)
    f = tl.arange(0, FLAGS)
    before = f < pid
    flags = tl.where(before, tl.atomic_add(Flags + f, 0, mask=before), 1)
    while tl.min(flags, 0) == 0:  # wait for every program before this one
        flags = tl.where(before, tl.atomic_add(Flags + f, 0, mask=before), 1)
    prefix = tl.sum(tl.where(before, flags - 1, 0), 0)
    k = prefix + tl.cumsum(keep.to(tl.int32), 0) - 1  # rank among the non-requested entries
    tl.store(Victims + k, e, mask=keep & (k < taken))
    tl.store(Order + (k - taken), e, mask=keep & (k >= taken))


@triton.jit
def _finish_kernel(Sorted, Table, Owner, LastUsed, Order, Meta, Victims, Src, Dst, SubHits, SubMisses, n, B,
                   SUB: tl.constexpr, PREFIX_BLOCK: tl.constexpr):
    b = tl.program_id(0)
    stamp = tl.load(Meta)
    num_hits = tl.load(Meta + 1).to(tl.int32)
    num_misses = tl.load(Meta + 2).to(tl.int32)
    avail = B - num_hits
    placed_total = num_hits + tl.minimum(num_misses, avail)
    hits_before = tl.sum(tl.zeros([PREFIX_BLOCK], dtype=tl.int32), 0)
    misses_before = tl.sum(tl.zeros([PREFIX_BLOCK], dtype=tl.int32), 0)
    for start in range(0, b, PREFIX_BLOCK):  # the earlier sub-blocks' counts
        j = start + tl.arange(0, PREFIX_BLOCK)
        hits_before += tl.sum(tl.load(SubHits + j, mask=j < b, other=0), 0)
        misses_before += tl.sum(tl.load(SubMisses + j, mask=j < b, other=0), 0)
    i = b * SUB + tl.arange(0, SUB)
    m, s, first, cur = _first_requests(Sorted, Table, i, n)  # this program's own slots: unchanged since the lookup
    hit = first & (cur >= 0)
    miss = first & (cur < 0)
    rank = misses_before + tl.cumsum(miss.to(tl.int32), 0) - 1
    placed_miss = miss & (rank < avail)
    victim = tl.load(Victims + rank, mask=placed_miss, other=0)
    evicted = tl.load(Owner + victim, mask=placed_miss, other=-1)
    tl.store(Table + evicted, tl.full([SUB], -1, tl.int32), mask=placed_miss & (evicted >= 0))
    tl.store(Table + s, victim, mask=placed_miss)
    tl.store(Owner + victim, s.to(tl.int32), mask=placed_miss)
    tl.store(LastUsed + victim, tl.zeros([SUB], dtype=tl.int64) + stamp, mask=placed_miss)
    placed = hit | placed_miss
    placed_before = hits_before + tl.maximum(tl.minimum(misses_before, avail), 0)
    prank = placed_before + tl.cumsum(placed.to(tl.int32), 0) - 1
    tl.store(Order + (B - placed_total + prank), tl.where(hit, cur, victim), mask=placed)
    tl.store(Src + i, tl.where(placed_miss, s, -1).to(tl.int32), mask=m)
    tl.store(Dst + i, tl.where(placed_miss, victim, -1), mask=m)


@triton.jit
def _output_kernel(Sorted, Perm, Out, Table, Meta, Hits, Misses, Overflows, n, B, SUB: tl.constexpr):
    b = tl.program_id(0)
    i = b * SUB + tl.arange(0, SUB)
    m = i < n
    s = tl.load(Sorted + i, mask=m, other=-1)
    idx = tl.load(Table + s, mask=m & (s >= 0), other=-1)
    dst = tl.load(Perm + i, mask=m, other=0)
    tl.store(Out + dst, idx, mask=m)
    if b == 0:
        num_hits = tl.load(Meta + 1)
        num_misses = tl.load(Meta + 2)
        tl.store(Hits, tl.load(Hits) + num_hits)
        tl.store(Misses, tl.load(Misses) + num_misses)
        tl.store(Overflows, tl.load(Overflows) + (num_hits + num_misses > B).to(tl.int64))


@triton.jit
def _invalidate_kernel(Slots, Table, Owner, LastUsed, Order, n, S, B, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
    freed = tl.sum(tl.zeros([BLOCK_N], dtype=tl.int32), 0)
    for start in range(0, n, BLOCK_N):
        i = start + tl.arange(0, BLOCK_N)
        m = i < n
        s = tl.load(Slots + i, mask=m, other=-1)
        ok = m & (s >= 0) & (s < S)
        cur = tl.load(Table + s, mask=ok, other=-1)
        res = ok & (cur >= 0)
        tl.store(Owner + cur, tl.full([BLOCK_N], -1, tl.int32), mask=res)
        tl.store(LastUsed + cur, tl.zeros([BLOCK_N], dtype=tl.int64), mask=res)
        tl.store(Table + s, tl.full([BLOCK_N], -1, tl.int32), mask=res)
        freed += tl.sum(res.to(tl.int32), 0)
    tl.debug_barrier()
    if freed > 0:  # free entries go first, by index; used ones keep their order after them
        num_blocks = tl.cdiv(B, BLOCK_B)
        after = tl.sum(tl.zeros([BLOCK_B], dtype=tl.int32), 0)
        for j in range(0, num_blocks):  # backward: used entries only move right
            p = (num_blocks - 1 - j) * BLOCK_B + tl.arange(0, BLOCK_B)
            pm = p < B
            e = tl.load(Order + p, mask=pm, other=0)
            used = pm & (tl.load(Owner + e, mask=pm, other=-1) >= 0)
            u = used.to(tl.int32)
            total = tl.sum(u, 0)
            q = B - 1 - (after + total - tl.cumsum(u, 0))
            tl.debug_barrier()
            tl.store(Order + q, e, mask=used)
            after += total
        tl.debug_barrier()
        before = tl.sum(tl.zeros([BLOCK_B], dtype=tl.int32), 0)
        for start in range(0, B, BLOCK_B):
            e = start + tl.arange(0, BLOCK_B)
            em = e < B
            free = em & (tl.load(Owner + e, mask=em, other=0) < 0)
            r = before + tl.cumsum(free.to(tl.int32), 0) - 1
            tl.store(Order + r, e, mask=free)
            before += tl.sum(free.to(tl.int32), 0)


def _partition_block(B: int) -> int:
    return max(1024, triton.next_power_of_2(triton.cdiv(B, MAX_PROGRAMS)))


def lru_resolve_triton(table, owner, last_used, order, clock, hits, misses, overflows,
                       s_sorted, perm, B: int, out, src_rows, dst_rows) -> None:
    """The bookkeeping of one resolve call (see the module docstring); all arguments are one layer's views.

    s_sorted [n] int64 requested slots sorted ascending (padding < 0 first), perm [n] their request
    positions; writes out [n] int32 (by request position), src_rows / dst_rows [n] int32 for the row copy.
    """
    n = s_sorted.numel()
    device = s_sorted.device
    block_b = _partition_block(B)
    grid_b = triton.cdiv(B, block_b)
    meta = torch.empty(4, dtype=torch.int64, device=device)
    flags = torch.empty(MAX_PROGRAMS, dtype=torch.int32, device=device)
    victims = torch.empty(min(n, B), dtype=torch.int32, device=device)
    num_sub = triton.cdiv(n, SUB)
    sub_counts = torch.empty((2, num_sub), dtype=torch.int32, device=device)  # hits, misses per SUB requests
    fit = max(SUB, triton.next_power_of_2(n))
    _lookup_kernel[(1,)](s_sorted, table, last_used, clock, meta, flags, sub_counts[0], sub_counts[1], n, grid_b, num_sub,
                         BLOCK_N=min(LOOKUP_BLOCK, fit), FLAGS=MAX_PROGRAMS, SUB=SUB, num_warps=LOOKUP_WARPS)
    _partition_kernel[(grid_b,)](order, last_used, meta, victims, flags, B,
                                 BLOCK_B=block_b, FLAGS=MAX_PROGRAMS, num_warps=8 if block_b <= 4096 else 16, num_stages=1)
    _finish_kernel[(num_sub,)](s_sorted, table, owner, last_used, order, meta, victims, src_rows, dst_rows,
                               sub_counts[0], sub_counts[1], n, B, SUB=SUB, PREFIX_BLOCK=PREFIX_BLOCK, num_warps=4)
    _output_kernel[(num_sub,)](s_sorted, perm, out, table, meta, hits, misses, overflows, n, B, SUB=SUB, num_warps=4)


def lru_invalidate_triton(table, owner, last_used, order, slots, S: int, B: int) -> None:
    n = slots.numel()
    _invalidate_kernel[(1,)](slots, table, owner, last_used, order, n, S, B,
                             BLOCK_N=min(INVALIDATE_BLOCK, max(128, triton.next_power_of_2(n))), BLOCK_B=4096,
                             num_warps=8, num_stages=1)

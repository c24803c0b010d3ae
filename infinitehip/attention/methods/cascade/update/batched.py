"""The cascade's cache update one sub-cache at a time (the CPU path; same results as `reference.py`, tested).

The reference walks the plan push by push (n x C steps of small ops). Here each sub-cache takes all of a stride's
arrivals at once: sub-cache i receives, in push order, the tokens the pushes carry to it (sub-cache 0: the stride's
tokens; sub-cache i: what sub-cache i - 1's PASSes carried out), and

- a FILL or a PASS writes its token into its slot as a new entry (a PASS first carries out what the slot held:
  the slot's previous entry of this stride, or what it held before the stride);
- a COMPARE merges its token into the entry its slot holds (the newest's), keeping the higher score (ties: the
  newer). The schedule alternates PASS and COMPARE arrivals, so an entry meets at most one COMPARE, and before any
  PASS carries it out.

Which entry or slot each arrival meets depends on the plan alone, so the host lays it out as index lists; per
sub-cache the device does one gather of the arrivals, one `where` per kind of merge, one gather of what the PASSes
carry out and one scatter of the slots' last entries, every layer and KV head at once. Then the k/v rows of the
written slots are gathered from their sources in one step (the reference moves every kept slot).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from infinitehip.attention.methods.cascade.schedule import COMPARE, NONE, PASS
from infinitehip.host_values import host_to_device


@dataclass
class _Level:
    """One sub-cache's share of the plan, as index lists: its arrivals (a: 0..m-1) in push order, their tokens the
    previous level's carried-out ones (sub-cache 0: the stride's)."""

    entries: list[int] = field(default_factory=list)  # arrival of each new entry (FILL or PASS), entry e = position
    merge_entry: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))  # COMPAREs (entry, arrival)
    merge_slot: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))  # COMPAREs (held slot, arrival)
    out_slot: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))  # PASSes (out position, held slot)
    out_entry: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))  # PASSes (out position, entry)
    last: dict[int, int] = field(default_factory=dict)  # slot -> its last entry
    carried: int = 0  # PASSes: tokens carried on to the next level


def _plan_levels(ops: torch.Tensor, slots: torch.Tensor) -> list[_Level]:
    """Host index lists of each sub-cache from the plan [n, C] (Python over the arrivals: about 2n of them)."""
    n, C = ops.shape
    ops_host, slots_host = ops.t().tolist(), slots.t().tolist()
    levels, pushes = [], list(range(n))  # pushes: those arriving at this level, in order
    for i in range(C):
        level, next_pushes, merged = _Level(), [], set()
        for a, j in enumerate(pushes):
            op, s = ops_host[i][j], slots_host[i][j]
            e = level.last.get(s)
            if op == COMPARE:
                if (s, e) in merged:
                    raise AssertionError("cascade plan: two COMPAREs met one entry")
                merged.add((s, e))
                pair = level.merge_slot if e is None else level.merge_entry
                pair[0].append(s if e is None else e)
                pair[1].append(a)
                continue
            if op == NONE:
                raise AssertionError("cascade plan: a token arrived at a sub-cache with no op")
            if op == PASS:
                pair = level.out_slot if e is None else level.out_entry
                pair[0].append(level.carried)
                pair[1].append(s if e is None else e)
                level.carried += 1
                next_pushes.append(j)
            level.last[s] = len(level.entries)
            level.entries.append(a)
        levels.append(level)
        if i + 1 < C and [j for j in range(n) if ops_host[i + 1][j] != NONE] != next_pushes:
            raise AssertionError("cascade plan: a sub-cache's arrivals differ from the PASSes before it")
        pushes = next_pushes
    return levels


def cascade_update_batched(k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor, flat_slots: torch.Tensor,
                           ops: torch.Tensor, slots: torch.Tensor, first: int) -> None:
    """reference.cascade_update_reference's arguments and results; k and v contiguous."""
    n = ops.shape[0]
    if n == 0:
        return
    if not (k.is_contiguous() and v.is_contiguous()):
        raise ValueError("cascade update: k and v must be contiguous [L, slots, Hkv, d]")
    L, _, Hkv, _ = k.shape
    device = scores.device
    idx = lambda values: host_to_device(torch.tensor(values, dtype=torch.long), device)
    take = lambda x, i: x.index_select(-1, i)  # x [L, Hkv, m] at positions i (index_select: the fast gather)
    used = max(first + n, int(slots.max()) + 1)
    source = torch.arange(used, device=device).expand(L, Hkv, used).contiguous()  # whose k/v each slot ends with
    score = scores[..., :used]  # updated in place
    # Arrivals at sub-cache 0: the stride's tokens with the scores they entered with (read before any write)
    carry, carry_score = source[..., first : first + n].clone(), score[..., first : first + n].clone()
    written: set[int] = set()
    for level in _plan_levels(ops, slots):
        if level.merge_slot[0]:  # COMPAREs into what a slot held before the stride
            s, a = map(idx, level.merge_slot)
            wins = take(carry_score, a) >= take(score, s)
            source.index_copy_(-1, s, torch.where(wins, take(carry, a), take(source, s)))
            score.index_copy_(-1, s, torch.where(wins, take(carry_score, a), take(score, s)))
            written.update(level.merge_slot[0])
        entries = idx(level.entries)
        e_src, e_score = take(carry, entries), take(carry_score, entries)  # [L, Hkv, E]
        if level.merge_entry[0]:  # COMPAREs into an entry of this stride
            e, a = map(idx, level.merge_entry)
            wins = take(carry_score, a) >= take(e_score, e)
            e_src.index_copy_(-1, e, torch.where(wins, take(carry, a), take(e_src, e)))
            e_score.index_copy_(-1, e, torch.where(wins, take(carry_score, a), take(e_score, e)))
        # What the PASSes carry on: read before the level writes its slots
        carry = torch.empty(L, Hkv, level.carried, dtype=torch.long, device=device)
        carry_score = torch.empty(L, Hkv, level.carried, dtype=score.dtype, device=device)
        for (pos, at), (src, src_score) in ((level.out_slot, (source, score)), (level.out_entry, (e_src, e_score))):
            if pos:
                pos, at = idx(pos), idx(at)
                carry.index_copy_(-1, pos, take(src, at))
                carry_score.index_copy_(-1, pos, take(src_score, at))
        if level.last:  # every slot written takes its last entry
            s, e = idx(list(level.last)), idx(list(level.last.values()))
            source.index_copy_(-1, s, take(e_src, e))
            score.index_copy_(-1, s, take(e_score, e))
            written.update(level.last)
    _move_rows(k, v, flat_slots, source, sorted(written))


def _move_rows(k: torch.Tensor, v: torch.Tensor, flat_slots: torch.Tensor, source: torch.Tensor,
               written: list[int]) -> None:
    """k/v [L, slots, Hkv, d] (contiguous): each written sequence slot's row from its source [L, Hkv, used]
    (sequence slots as they were before the stride: every row read before any write), as rows of [L * slots * Hkv, d]."""
    if not written:
        return
    L, num_slots, Hkv, d = k.shape
    slots = host_to_device(torch.tensor(written, dtype=torch.long), k.device)
    base = (torch.arange(L, device=k.device)[:, None, None] * num_slots) * Hkv
    head = torch.arange(Hkv, device=k.device)[None, :, None]
    rows_from = (base + flat_slots[source.index_select(-1, slots)] * Hkv + head).flatten()  # [L * Hkv * w]
    rows_to = (base + flat_slots[slots][None, None, :] * Hkv + head).flatten()
    for cache in (k, v):
        flat = cache.view(-1, d)
        flat.index_copy_(0, rows_to, flat.index_select(0, rows_from))

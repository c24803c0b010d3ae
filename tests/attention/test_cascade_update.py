"""The cascade's cache update (attention/methods/cascade): the schedule's plan against a token-by-token oracle of the paper's
four cases, the eager reference against that oracle (every layer and KV head deciding by its own scores), and the
Triton kernel (interpreted on CPU) against the reference, on random streams through a paged cache; while the sub-caches
fill, the held slots (the only ones the method attends) against the slots the paper's rule writes, push by push."""

from __future__ import annotations

import pytest
import torch

from infinitehip.attention.methods.cascade.schedule import COMPARE, FILL, PASS, CascadeSchedule
from infinitehip.attention.methods.cascade.update.op import cascade_update
from infinitehip.kv.paged_cache import PagedKVCache
from tests.cascade_helpers import slots_receiving_a_token

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class OracleCascade:
    """The paper's rules on Python lists: sub-cache i a list oldest-first of (token, score); push t at sub-cache i
    is accepted when t is a multiple of 2^i. Records which of the four cases each arrival met."""

    def __init__(self, subcaches: int, width: int):
        self.caches = [[] for _ in range(subcaches)]
        self.width, self.t = width, 0
        self.cases = {1: 0, 2: 0, 3: 0, 4: 0}

    def push(self, token, score) -> None:
        carry = (token, score)
        for i, cache in enumerate(self.caches):
            if len(cache) < self.width:
                cache.append(carry)
                self.cases[1] += 1
                break
            if self.t % (2**i) == 0:
                self.cases[2] += 1
                oldest = cache.pop(0)
                cache.append(carry)
                carry = oldest
                continue
            if carry[1] < cache[-1][1]:
                self.cases[3] += 1
            else:
                self.cases[4] += 1
                cache[-1] = carry
            break
        self.t += 1


def _oracle_slots(schedule: CascadeSchedule, oracle: OracleCascade) -> dict[int, object]:
    """Sequence slot -> token of the oracle's cascade laid out as the schedule's circular buffers."""
    out = {}
    for i, cache in enumerate(oracle.caches):
        W = schedule.width
        for r, (token, _) in enumerate(cache):
            j = (schedule.heads[i] + r) % W if schedule.counts[i] == W else r
            out[schedule.sinks + i * W + j] = token
    return out


@pytest.mark.parametrize("sinks, subcaches, width, strides", [(2, 3, 4, (30, 5, 1, 1, 9, 17)), (0, 1, 5, (8, 3)),
                                                                (3, 4, 3, (14, 1, 2, 40))])
def test_plan_follows_the_four_cases_and_orders_positions_by_age(sinks, subcaches, width, strides):
    """With every score taken from a fixed random table, the plan applied to token ids equals the oracle, every
    case occurs, the held slots are those holding a token (a filling sub-cache's others hold none), and positions
    rank the kept tokens by age (sinks first)."""
    g = torch.Generator().manual_seed(sinks + width)
    schedule = CascadeSchedule(sinks, subcaches, width)
    oracle = OracleCascade(subcaches, width)
    table = torch.rand(1000, generator=g).tolist()
    slots_token: dict[int, int] = {}
    token = sinks
    for n in strides:
        ops, slots = schedule.plan_pushes(n)
        for j in range(n):
            carry = token + j
            oracle.push(carry, table[carry])
            for op, s in zip(ops[j].tolist(), slots[j].tolist()):
                if op == COMPARE:
                    if table[carry] >= table[slots_token[s]]:
                        slots_token[s] = carry
                    break
                if op == FILL:
                    slots_token[s] = carry
                    break
                if op == PASS:
                    slots_token[s], carry = carry, slots_token[s]
                    continue
                break
        token += n
        assert slots_token == _oracle_slots(schedule, oracle)
        held = schedule.held_slots()  # the slots holding a token: the sinks' and the oracle's
        want = list(range(sinks)) + sorted(slots_token)
        assert (list(range(schedule.kept)) if held is None else held.tolist()) == want
    if subcaches > 1:
        assert all(oracle.cases.values()), oracle.cases
    pos = schedule.positions()
    kept = sorted(slots_token, key=lambda s: slots_token[s])
    assert pos[:sinks].tolist() == list(range(sinks))
    assert [int(pos[s]) for s in kept] == list(range(sinks, sinks + len(kept)))


def _paged(L, Hkv, d, pages, page_size, g):
    cache = PagedKVCache(L, pages, page_size, Hkv, d, torch.float32, "cpu")
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    return cache


@pytest.mark.parametrize("seed, L, Hkv, d, sinks, subcaches, width, strides", [
    (0, 2, 2, 16, 2, 3, 4, (30, 6, 1, 1, 7)),  # the first push fills and evicts; decode-sized pushes
    (1, 1, 3, 24, 4, 4, 5, (40, 13)),  # d not a power of two, 4 sub-caches
    (2, 3, 1, 8, 0, 2, 6, (20, 6, 6)),
])
def test_reference_equals_oracle_and_triton_equals_reference(seed, L, Hkv, d, sinks, subcaches, width, strides):
    """Random k/v and scores per layer and KV head (each decides its own COMPAREs) in a paged cache whose pages are
    shuffled: the reference's kept k/v and scores equal the oracle's per (layer, head), and the Triton kernel's
    and the batched CPU update's equal the reference's exactly."""
    g = torch.Generator().manual_seed(seed)
    page_size = 4
    kept = sinks + subcaches * width
    limit = kept + max(strides)
    pages = -(-limit // page_size) + 2
    page_table = torch.randperm(pages, generator=g)[: -(-limit // page_size)].to(torch.int32)
    ref = _paged(L, Hkv, d, pages, page_size, g)
    tri = PagedKVCache(L, pages, page_size, Hkv, d, torch.float32, DEVICE)
    tri.k.copy_(ref.k)
    tri.v.copy_(ref.v)
    bat = PagedKVCache(L, pages, page_size, Hkv, d, torch.float32, "cpu")
    bat.k.copy_(ref.k)
    bat.v.copy_(ref.v)
    scores_ref = torch.rand(L, Hkv, limit, generator=g)
    scores_tri = scores_ref.clone().to(DEVICE)
    scores_bat = scores_ref.clone()
    schedule = CascadeSchedule(sinks, subcaches, width)
    oracles = [[OracleCascade(subcaches, width) for _ in range(Hkv)] for _ in range(L)]
    flat = ref.slots(page_table, 0, limit)
    for n in strides:
        first = kept if schedule.pushed else sinks
        end = first + n if schedule.pushed else limit  # the first push: every token after the sinks of a full stride
        n = end - first
        fresh = torch.rand(L, Hkv, n, generator=g)
        scores_ref[..., first:end] = fresh
        scores_tri[..., first:end] = fresh.to(DEVICE)
        scores_bat[..., first:end] = fresh
        for slot in range(first, end):  # new tokens' k/v (as a forward step writes them)
            row = torch.randn(L, Hkv, d, generator=g)
            ref.k.view(L, -1, Hkv, d)[:, flat[slot]] = row
            tri.k.view(L, -1, Hkv, d)[:, flat[slot]] = row.to(DEVICE)
            bat.k.view(L, -1, Hkv, d)[:, flat[slot]] = row
        for l in range(L):
            for h in range(Hkv):
                for j in range(n):
                    # the oracle's token: its k row (and its score, which decides the COMPAREs)
                    tok = ref.k.view(L, -1, Hkv, d)[l, flat[first + j], h].clone()
                    oracles[l][h].push((tok, float(scores_ref[l, h, first + j])), float(scores_ref[l, h, first + j]))
        ops, slots = schedule.plan_pushes(n)
        k4 = lambda c: c.k.view(L, -1, Hkv, d)
        v4 = lambda c: c.v.view(L, -1, Hkv, d)
        cascade_update(k4(ref), v4(ref), scores_ref, flat, ops, slots, first, impl="reference")
        cascade_update(k4(tri), v4(tri), scores_tri, flat.to(DEVICE), ops, slots, first, impl="triton")
        cascade_update(k4(bat), v4(bat), scores_bat, flat, ops, slots, first, impl="cpu")
        for c in (tri, bat):
            torch.testing.assert_close(c.k.cpu(), ref.k, rtol=0, atol=0)
            torch.testing.assert_close(c.v.cpu(), ref.v, rtol=0, atol=0)
        torch.testing.assert_close(scores_tri.cpu()[..., :kept], scores_ref[..., :kept], rtol=0, atol=0)
        torch.testing.assert_close(scores_bat[..., :kept], scores_ref[..., :kept], rtol=0, atol=0)
        for l in range(L):
            for h in range(Hkv):
                want = _oracle_slots(schedule, oracles[l][h])
                for s, (row, score) in want.items():
                    assert torch.equal(k4(ref)[l, flat[s], h], row), (l, h, s)
                    assert float(scores_ref[l, h, s]) == score
    cases = {c: sum(o.cases[c] for row in oracles for o in row) for c in (1, 2, 3, 4)}
    if subcaches > 1:
        assert all(cases.values()), cases


def _kept_tokens(scores_of_token: torch.Tensor, sinks: int, subcaches: int, width: int, total: int, stride: int):
    """Push tokens 0..total-1 (after `sinks` sinks) through the reference update with k = token id and the given
    per-token scores -> (schedule, k [kept] token id in each kept slot)."""
    schedule = CascadeSchedule(sinks, subcaches, width)
    kept = schedule.kept
    limit = kept + stride
    k = torch.full((1, limit, 1, 1), -1.0, dtype=torch.float64)
    scores = torch.zeros(1, 1, limit)
    flat = torch.arange(limit)
    token = 0
    while token < total:
        first = kept if schedule.pushed else sinks
        n = min(limit - first, total - token)
        k[0, first : first + n, 0, 0] = torch.arange(token, token + n, dtype=torch.float64)
        scores[0, 0, first : first + n] = scores_of_token[token : token + n]
        ops, slots = schedule.plan_pushes(n)
        cascade_update(k, k.clone(), scores, flat, ops, slots, first, impl="reference")
        token += n
    return schedule, k[0, :kept, 0, 0].long()


def test_scores_choose_which_token_of_each_block_a_subcache_keeps_never_how_many():
    """Past the filling, sub-cache i holds one token of each block of 2^i consecutive tokens (its newest: of the
    block arriving so far): the compares keep the block's highest score (ties: the newer). So a run of adjacent
    tokens (a 5-digit pass key tokenized digit by digit) is never kept whole past sub-cache 0, whatever the
    scores: with random scores the kept tokens are the argmax of the blocks whose newest equal scores keep."""
    sinks, subcaches, width, total, stride = 2, 4, 6, 700, 10
    g = torch.Generator().manual_seed(0)
    _, newest = _kept_tokens(torch.zeros(total), sinks, subcaches, width, total, stride)
    table = torch.rand(total, generator=g)
    _, best = _kept_tokens(table, sinks, subcaches, width, total, stride)
    for i in range(1, subcaches):
        block = 1 << i
        part = slice(sinks + i * width, sinks + (i + 1) * width)
        ends = sorted(newest[part].tolist())
        gaps = [b - a for a, b in zip(ends, ends[1:])]
        assert gaps[:-1] == [block] * (width - 2) and 0 < gaps[-1] <= block, (i, ends)
        starts = [ends[0] - block + 1] + [a + 1 for a in ends[:-1]]
        for start, end, tok in zip(starts, ends, sorted(best[part].tolist())):
            assert tok == start + int(table[start : end + 1].argmax()), (i, start, end, tok)  # its highest score


@pytest.mark.parametrize("sinks, subcaches, width", [(2, 3, 4), (0, 4, 3), (3, 1, 5), (1, 5, 2), (4, 4, 8)])
@pytest.mark.parametrize("chunks", ["one token a push", "strides"])
def test_held_slots_are_the_slots_that_received_a_token_at_every_push(sinks, subcaches, width, chunks):
    """Pushes one at a time (and in strides of varying size, checked after each) from the first one until past the
    point the last sub-cache fills: `held_slots` is the sinks and exactly the slots a token was written to, as the
    paper's rule derives them on plain lists (the partly filled sub-caches' other slots hold none) -- None, every
    kept slot, only before the first push and once every slot holds one -- and the held slots' positions are
    0..held-1 in the order of their tokens' age, sinks first."""
    total = 2 ** subcaches * width  # past the filling: every sub-cache full after at most 2^(C-1) W pushes
    expected = slots_receiving_a_token(sinks, subcaches, width, total)
    fill = next(p + 1 for p, held in enumerate(expected) if len(held) == sinks + subcaches * width)
    # sub-cache 1 fills after 2W pushes; sub-cache i > 1 takes its first at the next multiple of 2^(i-1), then
    # one every 2^(i-1) pushes: the cache is full after 2^(C-1) W - 2^(C-2) + 1 pushes (schedule.py's docstring)
    assert fill == (width if subcaches == 1 else 2 ** (subcaches - 1) * width - 2 ** (subcaches - 2) + 1)
    sizes = [1] * total if chunks == "one token a push" else [3, 1, 7, 2, 5, 11, 1] * total
    schedule = CascadeSchedule(sinks, subcaches, width)
    assert schedule.held_slots() is None  # nothing pushed: the kept slots hold the prompt's tokens
    partial = 0
    for n in sizes:
        n = min(n, total - schedule.pushed)
        if n == 0:
            break
        schedule.plan_pushes(n)
        want = expected[schedule.pushed - 1]
        held = schedule.held_slots()
        if len(want) == schedule.kept:
            assert held is None, schedule.pushed
            held_list = list(range(schedule.kept))
        else:
            partial += 1
            assert held is not None, schedule.pushed
            held_list = held.tolist()
            assert held_list == sorted(want), (schedule.pushed, schedule.counts)
        by_age = sorted(held_list, key=lambda s: (want[s], s))
        positions = schedule.positions()
        assert [int(positions[s]) for s in by_age] == list(range(len(held_list))), schedule.pushed
    assert schedule.pushed == total and schedule.full
    assert partial == fill - 1 if chunks == "one token a push" else partial >= 1  # the filling phase was checked

"""Joining a stage's chunks with the question's (attention/ops/chunk_merge): the oracle against set semantics, the
Triton kernel (interpreted on CPU) against the oracle."""

from __future__ import annotations


import pytest
import torch

from infinitehip.attention.ops.chunk_merge.op import merge_chunks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _chunks(g: torch.Generator, rows: int, width: int, grid: int, chunk: int, sort: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """rows x width chunks of the grid 16 + chunk * j: distinct listed starts, empties (length 0) last, some ragged."""
    starts = torch.zeros(rows, width, dtype=torch.long)
    lens = torch.zeros(rows, width, dtype=torch.long)
    for r in range(rows):
        n = int(torch.randint(0, width + 1, (1,), generator=g))
        idx = torch.randperm(grid, generator=g)[:n]
        idx = idx.sort().values if sort else idx
        starts[r, :n] = 16 + chunk * idx
        lens[r, :n] = torch.where(torch.rand(n, generator=g) < 0.1, torch.randint(1, chunk, (n,), generator=g), chunk)
    return starts, lens


def _as_set(starts: torch.Tensor, lens: torch.Tensor) -> list[set]:
    return [{(s, n) for s, n in zip(rs.tolist(), rl.tolist()) if n > 0} for rs, rl in zip(starts, lens)]


# (0, 1, 128, 128) and (4, 2, 256, 128): the default's decode shapes (late and early layers: 2048 or 4096 tokens of
# 16-token chunks, joined with the question's 128); shuffled: empties between listed chunks, starts unsorted.
@pytest.mark.parametrize("seed, rows, C, E, per_row, shuffled", [
    (0, 1, 128, 128, False, False), (1, 5, 16, 8, True, False), (2, 3, 40, 24, True, True), (3, 2, 7, 1, False, False),
    (4, 2, 256, 128, False, True), (5, 2, 70, 0, False, True)])
def test_merge_is_the_sorted_union_and_the_kernel_equals_it(seed, rows, C, E, per_row, shuffled):
    g = torch.Generator().manual_seed(seed)
    grid, chunk = 3 * (C + E), 8
    starts, lens = _chunks(g, rows, C, grid, chunk, sort=True)
    if shuffled:
        order = torch.randperm(C, generator=g)
        starts, lens = starts[:, order].contiguous(), lens[:, order].contiguous()
    extra_starts, extra_lens = _chunks(g, rows if per_row else 1, E, grid, chunk, sort=False)
    if not per_row:
        extra_starts, extra_lens = extra_starts[0], extra_lens[0]
    # Some extra chunks repeat a listed one (same start): they must be dropped, never attended twice.
    out_s, out_l = merge_chunks(starts, lens, extra_starts, extra_lens)
    want = [a | {x for x in b if x[0] not in {s for s, _ in a}}
            for a, b in zip(_as_set(starts, lens), _as_set(extra_starts.expand(rows, -1), extra_lens.expand(rows, -1)))]
    assert out_s.shape == (rows, C + E)
    for r in range(rows):
        n = len(want[r])
        got = list(zip(out_s[r, :n].tolist(), out_l[r, :n].tolist()))
        assert got == sorted(want[r])  # listed chunks first, in position order
        assert (out_s[r, n:] == 0).all() and (out_l[r, n:] == 0).all()  # then (0, 0) empties
    args = [t.to(DEVICE) for t in (starts, lens, extra_starts, extra_lens)]
    k_s, k_l = merge_chunks(*args, impl="triton")
    assert torch.equal(k_s.cpu(), out_s) and torch.equal(k_l.cpu(), out_l)


def test_an_extra_chunk_already_listed_is_dropped():
    starts, lens = torch.tensor([[16, 32, 0]]), torch.tensor([[8, 8, 0]])
    for impl in ("reference", "triton"):
        s, n = merge_chunks(starts.to(DEVICE), lens.to(DEVICE), torch.tensor([32, 24]).to(DEVICE),
                            torch.tensor([8, 8]).to(DEVICE), impl=impl)
        assert s.tolist() == [[16, 24, 32, 0, 0]] and n.tolist() == [[8, 8, 8, 0, 0]], impl


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_rows_into_pool_rows_where_active(impl):
    """Three rows' joins written into rows (4, 0, 2) of a pool [5, C + E] where the refresh flags (a strided column of a
    [M, S] mask) say: each active row as merge_chunks returns it, the inactive one and the rows nobody names untouched."""
    g = torch.Generator().manual_seed(7)
    C, E = 40, 12
    starts, lens = _chunks(g, 3, C, 512, 8, sort=True)
    extra_starts, extra_lens = _chunks(g, 3, E, 512, 8, sort=False)
    args = [t.to(DEVICE) for t in (starts, lens, extra_starts, extra_lens)]
    rows = torch.tensor([4, 0, 2], device=DEVICE)
    active = torch.tensor([[True, False], [False, True], [True, True]], device=DEVICE)[:, 0]
    out = tuple(torch.full((5, C + E), -3, dtype=torch.long, device=DEVICE) for _ in range(2))
    got = merge_chunks(*args, impl=impl, out=out, rows=rows, active=active)
    assert got[0] is out[0] and got[1] is out[1]
    want_s, want_l = merge_chunks(*args, impl="reference")
    for m, r in enumerate(rows.tolist()):
        if active[m]:
            assert torch.equal(out[0][r], want_s[m]) and torch.equal(out[1][r], want_l[m])
    for r in (0, 1, 3):  # row 0 is the inactive sequence's, 1 and 3 nobody's
        assert (out[0][r] == -3).all() and (out[1][r] == -3).all()
    with pytest.raises(ValueError, match="pass out"):
        merge_chunks(*args, impl=impl, rows=rows)

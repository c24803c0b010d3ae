"""keep_top_chunks (end of a decode pruning stage): Triton kernel vs the eager oracle, and the oracle vs its
definition (the W best non-empty chunks, ties to the earlier one, in position order)."""

from __future__ import annotations


import pytest
import torch

from infinitehip.attention.methods.infinitehip.topchunks.op import keep_top_chunks, keep_top_chunks_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(seed, N, empty_share, ties):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(N, generator=g) * 10
    if ties:
        scores = scores.round()  # many equal scores: the tie rule decides
    lens = torch.randint(1, 9, (N,), generator=g)
    lens[torch.rand(N, generator=g) < empty_share] = 0
    scores[lens == 0] = torch.where(torch.rand(int((lens == 0).sum()), generator=g) < 0.5, float("-inf"), 50.0)
    starts = torch.arange(N) * 8 + 16
    return scores.to(DEVICE), starts.to(DEVICE), lens.to(DEVICE)


@pytest.mark.parametrize("N,W", [(1, 4), (7, 3), (100, 32), (1000, 128), (4096, 128), (300, 300), (50, 64)])
@pytest.mark.parametrize("ties", [False, True])
def test_triton_matches_reference(N, W, ties):
    scores, starts, lens = _case(N + W, N, 0.2, ties)
    outs = []
    for impl in ("reference", "triton"):
        out_s = torch.full((W,), -7, dtype=torch.long, device=DEVICE)  # poisoned: every entry must be written
        out_l = torch.full((W,), -7, dtype=torch.long, device=DEVICE)
        keep_top_chunks(scores, starts, lens, out_s, out_l, impl=impl)
        outs.append((out_s, out_l))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_reference_keeps_the_best_nonempty_chunks_in_order():
    scores, starts, lens = _case(3, 200, 0.3, True)
    W = 40
    out_s = torch.empty(W, dtype=torch.long, device=DEVICE)
    out_l = torch.empty(W, dtype=torch.long, device=DEVICE)
    keep_top_chunks(scores, starts, lens, out_s, out_l, impl="reference")
    real = [i for i in range(200) if lens[i] > 0]
    best = sorted(real, key=lambda i: (-float(scores[i]), i))[:W]
    expect = sorted(best)
    assert out_s.tolist() == [int(starts[i]) for i in expect]
    assert out_l.tolist() == [int(lens[i]) for i in expect]


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_rows_of_a_batch_into_pool_rows_equal_each_row_alone(impl):
    """Three sequences' candidates [3, N] kept into rows (2, 0, 4) of a pool [5, W] in one call: each row as the
    single-row op writes it; the other rows untouched."""
    N, W = 300, 32
    cases = [_case(40 + g, N, 0.2, ties=g == 1) for g in range(3)]
    scores, starts, lens = (torch.stack([c[k] for c in cases]) for k in range(3))
    rows = torch.tensor([2, 0, 4], device=DEVICE)
    out_s = torch.full((5, W), -7, dtype=torch.long, device=DEVICE)
    out_l = torch.full((5, W), -7, dtype=torch.long, device=DEVICE)
    want_s, want_l = out_s.clone(), out_l.clone()
    keep_top_chunks_rows(scores, starts, lens, out_s, out_l, rows, impl=impl)
    for g, r in enumerate(rows.tolist()):
        keep_top_chunks(scores[g], starts[g], lens[g], want_s[r], want_l[r], impl="reference")
    assert torch.equal(out_s, want_s) and torch.equal(out_l, want_l)


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("N", [300, 0])
def test_inactive_rows_and_the_stage_limit_in_the_same_launch(impl, N):
    """Four sequences into rows (3, 1, 0, 5) of a pool: the two active ones are written as alone, with their limit into
    the stage's column of a [R, S] limits tensor (a strided view); the inactive ones' rows and limits stay as they were
    (the batched refresh of a stage that only some of the batch's sequences refresh). N = 0: nothing to rank."""
    W, S, stage = 32, 3, 1
    cases = [_case(60 + g, max(N, 1), 0.2, ties=g == 2) for g in range(4)]
    scores, starts, lens = (torch.stack([c[k] for c in cases])[:, :N] for k in range(3))
    rows = torch.tensor([3, 1, 0, 5], device=DEVICE)
    # active and limit as columns of [G, S] tensors (strided views: the batch's refresh mask, a column of limits)
    active = torch.tensor([[False, True, False], [True, False, False], [False, True, True], [True, False, True]],
                          device=DEVICE)[:, stage]
    limit = torch.tensor([[0, 101, 0], [0, 102, 0], [0, 103, 0], [0, 104, 0]], device=DEVICE)[:, stage]
    out_s = torch.full((6, W), -7, dtype=torch.long, device=DEVICE)
    out_l = torch.full((6, W), -7, dtype=torch.long, device=DEVICE)
    limits = torch.full((6, S), -1, dtype=torch.long, device=DEVICE)
    want_s, want_l, want_limits = out_s.clone(), out_l.clone(), limits.clone()
    keep_top_chunks_rows(scores, starts, lens, out_s, out_l, rows, impl=impl, active=active, limit=limit,
                         out_limits=limits[:, stage])
    for g, r in enumerate(rows.tolist()):
        if active[g]:
            keep_top_chunks(scores[g], starts[g], lens[g], want_s[r], want_l[r], impl="reference")
            want_limits[r, stage] = limit[g]
    assert torch.equal(out_s, want_s) and torch.equal(out_l, want_l) and torch.equal(limits, want_limits)
    assert (out_s[1] == -7).all() and (out_s[5] == -7).all()  # the inactive rows untouched


def test_limit_needs_its_output():
    scores, starts, lens = (t[None] for t in _case(1, 10, 0.2, False))
    out = torch.zeros(1, 4, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="limit and out_limits"):
        keep_top_chunks_rows(scores, starts, lens, out, out.clone(), None, limit=torch.zeros(1, dtype=torch.long))

"""queue_queries (deferred landmark saliency): Triton kernel vs the eager oracle over a stream of positions, one
sequence's queue and a batch's queues as rows of one pool (decode_pool.py)."""

from __future__ import annotations


import pytest
import torch

from infinitehip.attention.methods.infinitehip.pending.op import queue_queries

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("P", [1, 3, 8])
def test_triton_matches_reference(dtype, P):
    H, d = 5, 24
    bufs = {impl: (torch.full((1, P, H, d), -9.0, dtype=dtype, device=DEVICE),
                   torch.full((1, P), -1, dtype=torch.long, device=DEVICE)) for impl in ("reference", "triton")}
    g = torch.Generator(device=DEVICE).manual_seed(P)
    for step, pos in enumerate([0, 1, 2, 7, 8, 9, 100, 1001]):
        q = torch.randn(1, H, d, generator=g, device=DEVICE).to(dtype)
        position = torch.tensor([pos], device=DEVICE)
        for impl, (pq, pp) in bufs.items():
            queue_queries(q, position, pq, pp, impl=impl)
        assert torch.equal(bufs["reference"][0], bufs["triton"][0])
        assert torch.equal(bufs["reference"][1], bufs["triton"][1])
        assert torch.equal(bufs["triton"][0][0, pos % P], q[0]) and int(bufs["triton"][1][0, pos % P]) == pos


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_a_batch_into_pool_rows_equals_each_queue_alone(impl):
    """Queries of sequences in rows (5, 0, 3) of a pool of 6, in one call: each row as its sequence's own queue."""
    R, P, H, d = 6, 4, 3, 8
    g = torch.Generator(device=DEVICE).manual_seed(0)
    pool_q = torch.randn(R, P, H, d, generator=g, device=DEVICE)
    pool_pos = torch.full((R, P), -1, dtype=torch.long, device=DEVICE)
    want_q, want_pos = pool_q.clone(), pool_pos.clone()
    rows = torch.tensor([5, 0, 3], device=DEVICE)
    for positions in ([10, 3, 7], [11, 4, 8], [13, 5, 1000]):
        q = torch.randn(3, H, d, generator=g, device=DEVICE)
        pos = torch.tensor(positions, device=DEVICE)
        queue_queries(q, pos, pool_q, pool_pos, rows, impl=impl)
        for b, r in enumerate(rows.tolist()):  # alone: the row's own [1, P] queue
            queue_queries(q[b : b + 1], pos[b : b + 1], want_q[r : r + 1], want_pos[r : r + 1], impl="reference")
        assert torch.equal(pool_q, want_q) and torch.equal(pool_pos, want_pos)

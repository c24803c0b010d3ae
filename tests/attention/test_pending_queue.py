"""queue_query (deferred landmark saliency): Triton kernel vs the eager oracle over a stream of positions."""

from __future__ import annotations


import pytest
import torch

from infinitehip.attention.methods.infinitehip.pending.op import queue_query

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("P", [1, 3, 8])
def test_triton_matches_reference(dtype, P):
    H, d = 5, 24
    bufs = {impl: (torch.full((P, H, d), -9.0, dtype=dtype, device=DEVICE),
                   torch.full((P,), -1, dtype=torch.long, device=DEVICE)) for impl in ("reference", "triton")}
    g = torch.Generator(device=DEVICE).manual_seed(P)
    for step, pos in enumerate([0, 1, 2, 7, 8, 9, 100, 1001]):
        q = torch.randn(1, H, d, generator=g, device=DEVICE).to(dtype)
        position = torch.tensor([pos], device=DEVICE)
        for impl, (pq, pp) in bufs.items():
            queue_query(q, position, pq, pp, impl=impl)
        assert torch.equal(bufs["reference"][0], bufs["triton"][0])
        assert torch.equal(bufs["reference"][1], bufs["triton"][1])
        assert torch.equal(bufs["triton"][0][pos % P], q[0]) and int(bufs["triton"][1][pos % P]) == pos

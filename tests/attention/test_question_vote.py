"""The question's summed soft vote (attention/ops/question_vote): the Triton kernel against its eager reference, and the
reference against TokenSelect's per-row soft vote summed over rows (what question-time selection computed before).

Without CUDA the Triton kernel runs under the interpreter (tests/conftest.py).
"""

from __future__ import annotations

import pytest
import torch

from infinitehip.attention.ops.question_vote.op import summed_soft_vote
from infinitehip.attention.methods.tokenselect.soft_vote.op import soft_vote

pytest.importorskip("triton")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-3)}


def _inputs(queries: int, heads: int, kv_heads: int, d: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    page_size, pages = 16, 48
    k_flat = (2 * torch.randn(pages * page_size, kv_heads, d, generator=gen)).to(DEVICE, dtype)
    q = torch.randn(queries, heads, d, generator=gen).to(DEVICE)
    table = torch.randperm(pages, generator=gen)[:40].to(DEVICE, torch.int32)
    return q, k_flat, table, page_size


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("queries, heads, kv_heads, d, start, count", [
    (5, 6, 2, 40, 9, 470),  # rows (15) under one row block, a partial last tile, head_dim not a power of two
    (24, 12, 3, 64, 0, 130),  # 96 rows: two row blocks, the second partial
    (3, 4, 4, 64, 130, 1),  # one candidate
])
def test_kernel_matches_reference(dtype, queries, heads, kv_heads, d, start, count):
    q, k_flat, table, page_size = _inputs(queries, heads, kv_heads, d, dtype, seed=queries * heads + count)
    # fp32: raw q . k, as question-time selection scores; bf16: the attention's scale (the interpreter's bf16 dot
    # is not the GPU's fp32-accumulated one, and raw logits of tens turn its rounding into large vote differences)
    args = (q, k_flat, table, page_size, start, count, 1.0 if dtype == torch.float32 else d ** -0.5)
    ours = summed_soft_vote(*args, impl="triton")
    ref = summed_soft_vote(q.to(dtype), *args[1:], impl="reference")  # a 16-bit cache dots with the query rounded once
    assert ours.shape == ref.shape == (count,)
    torch.testing.assert_close(ours, ref, **TOL[dtype])
    # every (query, head)'s softmax sums to one: the votes sum to queries x heads
    torch.testing.assert_close(ref.sum(), torch.tensor(float(queries * heads), device=DEVICE), rtol=1e-4, atol=1e-3)


def test_reference_equals_per_row_soft_vote_summed():
    q, k_flat, table, page_size = _inputs(7, 6, 2, 32, torch.float32, seed=3)
    start, count = 20, 300
    ref = summed_soft_vote(q, k_flat, table, page_size, start, count, 0.5, impl="reference")
    n = q.shape[0]
    rows = soft_vote(q, k_flat, table[None].expand(n, -1), page_size, torch.full((n,), start), torch.full((n,), count),
                     count, 0.5, impl="reference")
    torch.testing.assert_close(ref, rows.sum(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("valid", [1, 64, 200, 300])
def test_a_device_count_votes_as_the_shorter_count(impl, valid):
    """valid (a device tensor, for a static bound in a CUDA graph): the first `valid` candidates vote as with count =
    valid, the rest of the bound get 0; tiles wholly past it (valid 1, 64) hold no candidate."""
    q, k_flat, table, page_size = _inputs(6, 6, 2, 32, torch.float32, seed=valid)
    start, bound = 17, 300
    ours = summed_soft_vote(q, k_flat, table, page_size, start, bound, 1.0, impl=impl,
                            valid=torch.tensor([valid], device=DEVICE))
    ref = summed_soft_vote(q, k_flat, table, page_size, start, valid, 1.0, impl="reference")
    assert ours.shape == (bound,)
    torch.testing.assert_close(ours[:valid], ref, **TOL[torch.float32])
    assert not ours[valid:].any()

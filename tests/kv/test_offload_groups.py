"""Grouping of representative scoring by the mask bank (`offload_access.RepresentativeKeys`), without a model:
every group's distinct representatives fit the bank, and the groups' scores put together are the scores of one
call over all chunks (decode: static groups of chunks; prefill: column groups, an oversize column by query blocks)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from infinitehip.attention.methods.infinitehip.offload_access import RepresentativeKeys
from infinitehip.kv.offload.planner import CapacityError


class FakeKeys(RepresentativeKeys):
    """Records each resolve call's distinct listed representatives instead of resolving them."""

    def __init__(self, bank_tokens: int):
        self.bank, self.calls = SimpleNamespace(bank_tokens=bank_tokens), []

    def __call__(self, reps, lens):
        listed = (lens > 0)[..., None].expand_as(reps)
        self.calls.append(int(reps[listed].unique().numel()))
        return ("k", "table", 1)


def _case(M, N, H, chunk, seed=0, shared_columns=False):
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, 50, (1 if shared_columns else M, N), generator=g).expand(M, N) * chunk
    lens = torch.randint(0, chunk + 1, (M, N), generator=g)
    if shared_columns:
        lens = lens[:1].expand(M, N)
    # A chunk's representatives depend on the chunk (start, len) and the head only, as the landmark ones do.
    heads = torch.arange(H)
    reps = starts[..., None] + (starts[..., None] * 7 + lens[..., None] * 3 + heads * 5) % lens.clamp(min=1)[..., None]
    full = torch.randn(M, N, generator=g)  # the scores of one call over everything

    def score(keys, rows, cols):
        assert keys == ("k", "table", 1)
        return full[rows, cols]
    return reps, starts, lens, full, score


@pytest.mark.parametrize("bank,groups", [(4, 11), (20, 3), (44, 1), (1000, 1)])
def test_decode_fixed_groups(bank, groups):
    reps, _, lens, full, score = _case(1, 11, 4, 16)
    keys = FakeKeys(bank)
    torch.testing.assert_close(keys.score_in_fixed_groups(reps, lens, 16, score), full, rtol=0, atol=0)
    assert len(keys.calls) == groups and max(keys.calls) <= bank  # G = bank // min(H, chunk) chunks per call


def test_decode_refuses_a_bank_below_one_chunk():
    reps, _, lens, _, score = _case(1, 5, 8, 16)
    with pytest.raises(CapacityError, match="mask_bank_tokens=7 is smaller than one chunk's representatives"):
        FakeKeys(7).score_in_fixed_groups(reps, lens, 16, score)
    FakeKeys(4).score_in_fixed_groups(reps, lens, 4, score)  # chunks of 4 tokens: at most 4 distinct, with 8 heads


@pytest.mark.parametrize("bank", [4, 12, 40, 1000])
@pytest.mark.parametrize("shared", [False, True])
def test_prefill_groups_split_oversize_columns_by_query_blocks(bank, shared):
    reps, starts, lens, full, score = _case(6, 9, 4, 8, seed=bank, shared_columns=shared)
    keys = FakeKeys(bank)
    torch.testing.assert_close(keys.score_in_groups(reps, starts, lens, 8, score), full, rtol=0, atol=0)
    assert max(keys.calls) <= bank
    if bank == 4 and not shared:  # a column of 6 distinct chunks x 4 heads: its query blocks one at a time
        assert len(keys.calls) > 9

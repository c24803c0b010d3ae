"""Pruning RoPE positions (`positions.scoring_positions`): the `clamped` style against brute-force distances."""

import pytest
import torch

from infinitehip.attention.infinitehip.positions import scoring_positions
from infinitehip.config.infinitehip import InfiniteHiPConfig


def key_positions(p, starts, lens):
    """Per token t of chunk j: key_pos_base + rep_offset + t // group -> list of (m, t, pos)."""
    out = []
    for m in range(starts.shape[0]):
        for j in range(starts.shape[1]):
            for t in range(int(starts[m, j]), int(starts[m, j] + lens[m, j])):
                out.append((m, t, int(p.key_pos_base[m, j]) + p.rep_offset + (t // p.token_pos_group)))
    return out


def make_chunks(M=3, N=12, c=16, e0=5000, seed=0):
    g = torch.Generator().manual_seed(seed)
    starts = torch.sort(torch.randperm(e0 // c - 40, generator=g)[: M * N].view(M, N) * c, dim=1).values
    lens = torch.randint(1, c + 1, (M, N), generator=g)
    last = e0 + 64 * torch.arange(M)
    qpos = last[:, None] - torch.arange(63, -1, -1)[None, :]  # [M, 64] blocks of 64 queries
    return qpos, starts, lens


@pytest.mark.parametrize("trained", [1024, 3000])
def test_clamped_caps_every_distance_and_keeps_near_ones(trained):
    qpos, starts, lens = make_chunks()
    p = scoring_positions("clamped", qpos, lens, 256, int(qpos.max()) + 1, trained, starts)
    assert torch.equal(p.query_pos, qpos)
    cap = trained - 1
    for m, t, pos in key_positions(p, starts, lens):
        e = int(qpos[m, -1])
        start = int(starts[m][(starts[m] <= t) & (t < starts[m] + lens[m])][0])
        # the chunk's first token at distance min(e - start, cap) from the last query, offsets inside it kept
        assert e - pos == min(e - start, cap) - (t - start)
        if e - start <= cap:
            assert pos == t  # near chunks: original positions, exactly as `none`


def test_clamped_is_none_inside_the_trained_length():
    qpos, starts, lens = make_chunks()
    a = scoring_positions("clamped", qpos, lens, 256, int(qpos.max()) + 1, 8192, starts)
    b = scoring_positions("none", qpos, lens, 256, int(qpos.max()) + 1, 8192)
    assert torch.equal(a.query_pos, b.query_pos) and torch.equal(a.key_pos_base, b.key_pos_base)
    assert (a.token_pos_group, a.left_offset, a.right_offset, a.rep_offset) == (1, 0, 0, 0)
    with pytest.raises(ValueError, match="chunk_starts"):
        scoring_positions("clamped", qpos, lens, 256, 6000, 8192)


def test_config_accepts_clamped():
    c = InfiniteHiPConfig(early_pruning_rope="clamped", late_pruning_rope="clamped")
    assert c.pruning_rope_for(0) == c.pruning_rope_for(10) == "clamped"

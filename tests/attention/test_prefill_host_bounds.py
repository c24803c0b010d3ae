"""The prefill's host-side bounds (no device reads): RoPE extents of chunk scoring and block-sparse attention, the
widest streaming window and the first stage's candidate count, each against the value read back from the tensors
it replaces, over every RoPE style, context lengths inside and past the trained length, and chunk positions."""

import pytest
import torch

from infinitehip.attention.methods.infinitehip.positions import (ATTENTION_ROPE_STYLES_DECODE, attention_extent,
                                                         attention_positions, scoring_extent, scoring_positions)
from infinitehip.attention.methods.infinitehip.pruning import (host_limit, initial_chunks, prefill_window_width, query_blocks,
                                                       sparse_limit)
from infinitehip.attention.methods.infinitehip.config import PRUNING_ROPE_STYLES

SINK, STREAM, TRAINED = 16, 64, 1024
CASES = [(start, n, size) for start in (0, 5, 70, 1000, 5000) for n in (1, 31, 64, 200) for size in (1, 16, 64)]


def blocks_of(start: int, n: int, size: int):
    return query_blocks(torch.zeros(n, 2, 8), start, size)


@pytest.mark.parametrize("start,n,size", CASES)
def test_window_width_and_first_stage_candidates_match_the_tensors(start, n, size):
    blocks = blocks_of(start, n, size)
    assert blocks.last == int(blocks.positions.max())
    window_start = sparse_limit(blocks.last_position, SINK, STREAM)
    read_back = max(0, int((blocks.last_position + 1 - window_start).max()))
    assert prefill_window_width(blocks.last, SINK, STREAM) == read_back
    limit = window_start
    assert host_limit(blocks.last, SINK, STREAM) == int(limit.max())
    starts, lens = initial_chunks(limit, SINK, 16, host_limit(blocks.last, SINK, STREAM))
    n_read = max(0, -(-(int(limit.max()) - SINK) // 16))  # what initial_chunks read from the device before
    assert starts.shape[1] == n_read and (lens.sum(1) == (limit - SINK).clamp(min=0)).all()


@pytest.mark.parametrize("style", PRUNING_ROPE_STYLES)
@pytest.mark.parametrize("start,n,size", CASES[::3])
def test_scoring_extent_bounds_every_position_the_scoring_reads(style, start, n, size):
    blocks = blocks_of(start, n, size)
    context = start + n
    g = torch.Generator().manual_seed(start + n + size)
    N = 40
    lens = torch.randint(0, 17, (blocks.q.shape[0], N), generator=g)
    lens[:, -5:] = 0  # padding chunks last, as a stage's candidates
    pos = scoring_positions(style, blocks.positions, lens, STREAM, context, TRAINED)
    extent = scoring_extent(style, N, STREAM, context, TRAINED)
    assert extent >= int(pos.query_pos.max()) + 1
    # keys: key_pos_base + offsets (<= 1), or + token // group for grouped styles: the bound run_stage grew to before
    key_bound = int(pos.key_pos_base.max()) + (context // pos.token_pos_group if pos.token_pos_group else 0) + 2
    assert extent >= key_bound
    assert extent <= max(context, N + STREAM) + 2  # never far past what the context needs (the table doubles)


@pytest.mark.parametrize("style", ATTENTION_ROPE_STYLES_DECODE)
@pytest.mark.parametrize("context", [50, 700, 3000, 20000])
def test_attention_extent_bounds_every_position_the_attention_reads(style, context):
    n = min(64, context)
    blocks = blocks_of(context - n, n, 16)
    window_start = sparse_limit(blocks.last_position, SINK, STREAM)
    g = torch.Generator().manual_seed(context)
    M, K = blocks.q.shape[0], 300
    rows = []
    for m in range(M):  # sink + a random selection below the window + the window, sorted, padded with 0
        e, ws = int(blocks.last_position[m]), int(window_start[m])
        sel = torch.randperm(max(0, ws - SINK), generator=g)[:200] + SINK
        toks = torch.cat([torch.arange(min(SINK, e + 1)), sel, torch.arange(ws, e + 1)]).unique().sort().values[:K]
        rows.append(toks)
    counts = torch.tensor([len(r) for r in rows])
    width = int(counts.max())
    key_tokens = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
    query_pos = torch.arange(context - n, context)
    query_block = torch.arange(n) // 16
    key_rope, query_rope = attention_positions(style, key_tokens, counts, window_start, query_pos, query_block,
                                               context, TRAINED)
    extent = attention_extent(style, width, STREAM, context, TRAINED)
    assert extent >= max(int(key_rope.max()), int(query_rope.max())) + 1
    assert extent <= context + 1

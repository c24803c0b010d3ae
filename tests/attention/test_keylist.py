"""The decode key list (sink + selected chunks + window, with RoPE positions): Triton kernel vs the eager oracle,
and the oracle against its definition (ascending, unique, exactly the allowed tokens)."""

from __future__ import annotations


import pytest
import torch

from infinitehip.attention.methods.infinitehip.keylist.op import decode_key_list, key_list_width

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(seed: int, B: int, C: int, chunk: int, sink: int, stream: int, lag: int):
    """Random but valid decode states: chunks in position order below (and some across) each window start."""
    g = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 40 * chunk * C, (B,), generator=g)
    positions[0] = sink // 2  # a sequence still inside its sink
    limits = (positions[:, None] + 1 - stream - torch.randint(0, lag, (B, 3), generator=g)).clamp(min=sink)
    starts = torch.zeros(B, C, dtype=torch.long)
    lens = torch.zeros(B, C, dtype=torch.long)
    for b in range(B):
        ws = int(limits[b].min())
        slots = max(0, (ws + 2 * chunk - sink) // chunk)  # candidate chunk slots, a few past the window start
        n = min(C, slots, int(torch.randint(0, C + 1, (1,), generator=g)))
        if n:
            chosen = torch.randperm(slots, generator=g)[:n].sort().values
            starts[b, :n] = sink + chosen * chunk
            lens[b, :n] = torch.randint(0, chunk + 1, (n,), generator=g)
    return starts, lens, limits, positions


@pytest.mark.parametrize("style", ["streaming", "none", "dynamic", "infllm"])
@pytest.mark.parametrize("seed,C,chunk", [(0, 16, 8), (1, 40, 4), (2, 7, 32), (3, 200, 2)])
def test_triton_matches_reference(style, seed, C, chunk):
    sink, stream, lag = 16, 64, 9
    starts, lens, limits, positions = (t.to(DEVICE) for t in _case(seed, 5, C, chunk, sink, stream, lag))
    window = stream + lag
    ref = decode_key_list(starts, lens, chunk, limits, positions, sink, window, style, 3, impl="reference")
    out = decode_key_list(starts, lens, chunk, limits, positions, sink, window, style, 3, impl="triton")
    for a, b, name in zip(out, ref, ("tokens", "counts", "key_rope", "query_rope")):
        assert a.dtype == b.dtype == torch.int32, name
        assert torch.equal(a, b), name
    assert out[0].shape[1] == key_list_width(sink, C, chunk, window)


def test_reference_holds_exactly_the_allowed_tokens():
    sink, stream, lag, chunk = 16, 64, 9, 8
    starts, lens, limits, positions = _case(7, 6, 24, chunk, sink, stream, lag)
    tokens, counts, key_rope, query_rope = decode_key_list(starts, lens, chunk, limits, positions, sink, stream + lag,
                                                           "streaming", 1, impl="reference")
    for b in range(6):
        e, ws = int(positions[b]), int(limits[b].min())
        allowed = set(range(min(sink, e + 1))) | set(range(ws, e + 1))
        for s, n in zip(starts[b].tolist(), lens[b].tolist()):
            allowed |= {t for t in range(s, s + n) if t < ws}
        got = tokens[b, : counts[b]].tolist()
        assert got == sorted(allowed)  # ascending, unique, nothing else
        assert key_rope[b, : counts[b]].tolist() == list(range(int(counts[b])))
        assert int(query_rope[b]) == int(counts[b]) - 1 and got[-1] == e  # the query is its own last key

"""The decode key list as one Triton kernel (same signature and outputs as `reference.py`).

Kernel design (`_key_list_kernel`): one program per sequence.
- window_start = min of the S stage limits; e = the decode position.
- Sink: tokens 0 .. min(sink, e + 1) - 1 at list indices 0.. .
- Chunks, in tiles of BLOCK_C: each chunk contributes its tokens below window_start, a run of
  n_c = clamp(min(len, window_start - start), 0) tokens; an inclusive tl.cumsum over the tile plus the running
  total of earlier tiles gives each run's offset, and the run is stored as a [BLOCK_C, CHUNK] masked scatter
  (chunks are in position order, so the list stays ascending).
- Window: window_start .. e after them; every index from the count to K is zeroed (the reference's padding).
- RoPE positions from (list index, token, window_start) per style, so the step needs no other kernel.
Integer work only; a few KB per sequence.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.attention.methods.infinitehip.keylist.reference import key_list_width
from infinitehip.attention.methods.infinitehip.positions import ATTENTION_ROPE_STYLES_DECODE
from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()

_STYLE_IDS = {name: i for i, name in enumerate(ATTENTION_ROPE_STYLES_DECODE)}  # streaming 0, none 1, dynamic 2, infllm 3


@triton.jit
def _rope_of(idx, tok, ws, group, STYLE: tl.constexpr):
    if STYLE == 0:
        return idx
    elif STYLE == 1:
        return tok
    elif STYLE == 2:
        return tok // group
    else:
        return tl.where(tok >= ws, 1 + tok - ws, 0)


@triton.jit
def _key_list_kernel(
    Starts, Lens, Limits, Positions, Tokens, Counts, KeyRope, QueryRope,
    C, S, sink, window, K, group, stride_sb, stride_lb, stride_limb, stride_tb, stride_rb,
    CHUNK: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, STYLE: tl.constexpr,
):
    b = tl.program_id(0)
    e = tl.load(Positions + b).to(tl.int64)
    ws = tl.load(Limits + b * stride_limb).to(tl.int64)
    for s in range(1, S):
        ws = tl.minimum(ws, tl.load(Limits + b * stride_limb + s).to(tl.int64))
    tok_base = Tokens + b * stride_tb
    rope_base = KeyRope + b * stride_rb

    # Sink.
    n_sink = tl.minimum(sink, e + 1)
    for k0 in range(0, sink, BLOCK_K):
        idx = k0 + tl.arange(0, BLOCK_K)
        ok = idx < n_sink
        tok = idx.to(tl.int64)
        tl.store(tok_base + idx, tok.to(tl.int32), mask=ok)
        tl.store(rope_base + idx, _rope_of(idx.to(tl.int64), tok, ws, group, STYLE).to(tl.int32), mask=ok)

    # Selected chunks below the window.
    total = n_sink
    offs_j = tl.arange(0, CHUNK)
    for c0 in range(0, C, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        c_ok = offs_c < C
        start = tl.load(Starts + b * stride_sb + offs_c, mask=c_ok, other=0).to(tl.int64)
        length = tl.load(Lens + b * stride_lb + offs_c, mask=c_ok, other=0).to(tl.int64)
        n = tl.maximum(tl.minimum(length, ws - start), 0)
        n = tl.where(c_ok, tl.minimum(n, CHUNK), 0)
        run_end = tl.cumsum(n, axis=0)
        first = total + run_end - n  # [BLOCK_C] list index of each run's first token
        idx = first[:, None] + offs_j[None, :]
        ok = offs_j[None, :] < n[:, None]
        tok = start[:, None] + offs_j[None, :]
        tl.store(tok_base + idx, tok.to(tl.int32), mask=ok)
        tl.store(rope_base + idx, _rope_of(idx, tok, ws, group, STYLE).to(tl.int32), mask=ok)
        total += tl.sum(n, axis=0)

    # Window [ws, e], then zero padding up to K.
    n_win = tl.maximum(e + 1 - ws, 0)
    count = total + n_win
    for k0 in range(0, window, BLOCK_K):
        j = k0 + tl.arange(0, BLOCK_K)
        ok = j < n_win
        idx = total + j
        tok = ws + j
        tl.store(tok_base + idx, tok.to(tl.int32), mask=ok)
        tl.store(rope_base + idx, _rope_of(idx, tok, ws, group, STYLE).to(tl.int32), mask=ok)
    for k0 in range(0, K, BLOCK_K):
        idx = k0 + tl.arange(0, BLOCK_K)
        pad = idx >= count
        tl.store(tok_base + idx, tl.zeros([BLOCK_K], tl.int32), mask=pad & (idx < K))
        tl.store(rope_base + idx, tl.zeros([BLOCK_K], tl.int32), mask=pad & (idx < K))
    tl.store(Counts + b, count.to(tl.int32))
    q_rope = _rope_of(count - 1, e, ws, group, STYLE)
    tl.store(QueryRope + b, q_rope.to(tl.int32))


def decode_key_list_triton(
    starts: torch.Tensor, lens: torch.Tensor, chunk_size: int, limits: torch.Tensor, positions: torch.Tensor,
    sink: int, window: int, style: str, group: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """See `reference.decode_key_list_reference`."""
    if style not in _STYLE_IDS:
        raise ValueError(f"unknown attention RoPE style {style!r}")
    B, C = starts.shape
    K = key_list_width(sink, C, chunk_size, window)
    device = positions.device
    tokens = torch.empty(B, K, dtype=torch.int32, device=device)
    key_rope = torch.empty_like(tokens)
    counts = torch.empty(B, dtype=torch.int32, device=device)
    query_rope = torch.empty_like(counts)
    if B == 0:
        return tokens, counts, key_rope, query_rope
    if starts.stride(1) != 1 or lens.stride(1) != 1 or limits.stride(1) != 1:
        raise ValueError("starts, lens and limits must be contiguous along their last dimension")
    S = limits.shape[1]
    _key_list_kernel[(B,)](
        starts, lens, limits, positions, tokens, counts, key_rope, query_rope,
        C, S, sink, window, K, group, starts.stride(0), lens.stride(0), limits.stride(0), tokens.stride(0),
        key_rope.stride(0),
        CHUNK=triton.next_power_of_2(chunk_size), BLOCK_C=min(128, triton.next_power_of_2(max(C, 1))),
        BLOCK_K=1024, STYLE=_STYLE_IDS[style],
    )
    return tokens, counts, key_rope, query_rope

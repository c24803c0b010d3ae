"""Sparse attention through torch SDPA (the CPU path): same signatures and semantics as `reference.py`
(tested against it), for CPU, where the reference's per-block loop is too slow for long prompts and Triton
needs a GPU.

Prefill takes the query blocks in runs (`_groups`: up to GROUP_KEYS listed keys, one run per chunk once the
lists stop growing): per run the listed keys and values are gathered into reused buffers ([g, K, Hkv, d];
padding entries read the block's first listed key and are masked), the keys rotated once with full-width
cos/sin rows of their RoPE positions (one [K] row shared by all blocks when their positions agree, as the
streaming style's 0..K-1 do), and the run attended in two parts (`two_part_attention.py`): the leading keys
every query of the run sees through torch's CPU flash kernel without a mask, GQA heads packed into its query
rows, the rest (the blocks' own tokens, padding) through the same kernel with a mask, merged by log-sum-exp.
Decode gathers every sequence's list at once (one query each: the gather is the cost).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infinitehip.attention.ops.sparse.reference import _rope
from infinitehip.attention.ops.sparse.scratch import ScratchBuffers
from infinitehip.attention.ops.sparse.two_part_attention import attend_two_parts, pack_gqa, unpack_gqa
from infinitehip.kv.paged_cache import token_slots
from infinitehip.model.rope import apply_rotary_fused

# Listed keys gathered per run of blocks in prefill: few, large ops (with a core taken by another process every
# parallel op waits for it, so many small ones cost far more than the cache misses of large ones).
GROUP_KEYS = 1 << 18
MAX_TAIL_KEYS = 1024  # most keys per run attended under a mask
_SCRATCH = ScratchBuffers()  # reused gather buffers (one engine thread per process)


def _gathered(k_flat, v_flat, page_table, page_size, key_tokens, key_counts, key_rope_pos, cos, sin, dtype):
    """-> k, v [M, Hkv, K, d] (k rotated), valid [M, K]."""
    M, K = key_tokens.shape
    valid = torch.arange(K, device=key_tokens.device)[None, :] < key_counts[:, None].long()
    slots = token_slots(page_table, torch.where(valid, key_tokens, 0), page_size)  # [M, K]; padding reads token 0
    rope_pos = torch.where(valid, key_rope_pos, 0)
    k = _rope(k_flat[slots.flatten()], rope_pos.flatten(), cos, sin).view(M, K, *k_flat.shape[1:])
    v = v_flat[slots].to(torch.float32)
    # Padding entries may name any token: zero them so nothing unlisted (even NaN) reaches the softmax.
    k = k.masked_fill(~valid[:, :, None, None], 0.0)
    v = v.masked_fill(~valid[:, :, None, None], 0.0)
    return k.to(dtype).transpose(1, 2), v.to(dtype).transpose(1, 2), valid


def _rope_tables(key_rope_pos: torch.Tensor, valid: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Full-width rotation tables of every listed key: (cos | cos, -sin | sin) [1, K, 1, d] when all blocks' rows
    agree (the streaming style numbers every list 0..K-1), else [M, K, 1, d]. Padding takes the longest list's."""
    pos = key_rope_pos.long()
    longest = valid.sum(1).argmax()
    row = torch.where(valid[longest], pos[longest], 0)  # [K] in range
    pos = torch.where(valid, pos, row[None, :])
    if bool((pos == row[None, :]).all()):
        pos = row[None, :]
    c, s = cos[pos], sin[pos]  # [M or 1, K, d/2]
    return torch.cat([c, c], -1)[:, :, None], torch.cat([-s, s], -1)[:, :, None]


def _rotate_into(out: torch.Tensor, x: torch.Tensor, cos_full: torch.Tensor, sin_signed: torch.Tensor) -> None:
    """out = x * (cos | cos) + (x2 | x1) * (-sin | sin): rotate-half RoPE, x and out [..., d] fp32."""
    half = x.shape[-1] // 2
    torch.cat([x[..., half:], x[..., :half]], dim=-1, out=out)
    out.mul_(sin_signed).addcmul_(x, cos_full)


def sparse_attention_prefill(q, k_flat, v_flat, page_table, page_size, key_tokens, key_counts, key_rope_pos,
                             query_pos, query_rope_pos, query_block_size, cos, sin, sm_scale):
    n, H, d = q.shape
    M, K = key_tokens.shape
    Hkv, b = k_flat.shape[1], query_block_size
    compute = torch.float32
    pad = M * b - n
    qr = query_rope_pos.long()
    q_rot = apply_rotary_fused(q.float(), cos[qr][:, None], sin[qr][:, None])  # [n, H, d]
    q_rot = pack_gqa(F.pad(q_rot, (0, 0, 0, 0, 0, pad)).view(M, b, H, d), Hkv)
    qpos = F.pad(query_pos.long(), (0, pad), value=-1).view(M, b)
    tokens = key_tokens.long()
    counts = key_counts.long()
    valid = torch.arange(K, device=q.device)[None, :] < counts[:, None]  # [M, K]
    # Leading entries every query of the block sees (token <= the block's first query): attended without a mask.
    first_query = torch.where(qpos >= 0, qpos, torch.iinfo(torch.int64).max).amin(1)
    hidden = ~(valid & (tokens <= first_query[:, None]))
    prefix = torch.where(hidden.any(1), hidden.long().argmax(1), K)  # [M]
    # Padding entries read the block's first listed key (finite: listed keys are written); the mask hides them.
    first = torch.where(counts > 0, tokens[:, 0], 0)
    slots = token_slots(page_table, torch.where(valid, tokens, first[:, None]), page_size)  # [M, K]
    rope_cos, rope_sin = _rope_tables(key_rope_pos, valid, cos, sin)
    k_rows, v_rows = k_flat.view(k_flat.shape[0], -1), v_flat.view(v_flat.shape[0], -1)  # [S, Hkv * d]
    out = torch.empty(M, b, H, d, dtype=compute, device=q.device)
    for m0, m1, p, end in _groups(prefix, counts, GROUP_KEYS):
        g, rows = m1 - m0, slots[m0:m1, :end].flatten()
        k_raw = _SCRATCH.take("k_raw", (g, end, Hkv, d), k_flat.dtype, q.device)
        torch.index_select(k_rows, 0, rows, out=k_raw.view(g * end, Hkv * d))
        if k_raw.dtype != compute:
            k_raw = _SCRATCH.take("k32", k_raw.shape, compute, q.device).copy_(k_raw)
        k = _SCRATCH.take("k", (g, end, Hkv, d), compute, q.device)
        tables = slice(m0, m1) if rope_cos.shape[0] > 1 else slice(None)
        _rotate_into(k, k_raw, rope_cos[tables, :end], rope_sin[tables, :end])
        v = _SCRATCH.take("v", (g, end, Hkv, d), v_flat.dtype, q.device)
        torch.index_select(v_rows, 0, rows, out=v.view(g * end, Hkv * d))
        if v.dtype != compute:
            v = _SCRATCH.take("v32", v.shape, compute, q.device).copy_(v)
        tail_visible = valid[m0:m1, None, p:end] & (tokens[m0:m1, None, p:end] <= qpos[m0:m1, :, None])  # [g, b, W]
        o = unpack_gqa(attend_two_parts(q_rot[m0:m1], k, v, p, tail_visible, sm_scale), b)  # [g, b, H, d]
        seen = (p > 0) | tail_visible.any(-1)  # [g, b]
        out[m0:m1] = o.masked_fill_(~seen[:, :, None, None], 0.0)  # also clears NaN read through empty lists
    return out.view(M * b, H, d)[:n].to(q.dtype)


def _groups(prefix: torch.Tensor, counts: torch.Tensor, max_keys: int):
    """(m0, m1, shared prefix, listed end) of runs of consecutive blocks: a run's keys [0, end) are gathered
    together (at most max_keys of them) and [0, shared prefix) attended without a mask, so a run ends before
    its masked tail (end - shared prefix) would pass MAX_TAIL_KEYS (where lists still grow, in a first chunk)."""
    prefix, counts = prefix.tolist(), counts.tolist()
    m0 = 0
    while m0 < len(prefix):
        p, end, m1 = prefix[m0], counts[m0], m0 + 1
        while m1 < len(prefix):
            p_next, end_next = min(p, prefix[m1]), max(end, counts[m1])
            if end_next - p_next > max(MAX_TAIL_KEYS, end - p) or (m1 + 1 - m0) * end_next > max_keys:
                break
            p, end, m1 = p_next, end_next, m1 + 1
        yield m0, m1, p, end
        m0 = m1


def sparse_attention_decode(q, k_flat, v_flat, page_tables, page_size, key_tokens, key_counts, key_rope_pos,
                            query_rope_pos, cos, sin, sm_scale, num_splits=None):
    B, H, d = q.shape
    compute = torch.float32
    ks, vs = [], []
    for b in range(B):  # each sequence has its own page table
        k, v, _ = _gathered(k_flat, v_flat, page_tables[b], page_size, key_tokens[b : b + 1], key_counts[b : b + 1],
                            key_rope_pos[b : b + 1], cos, sin, compute)
        ks.append(k)
        vs.append(v)
    K = key_tokens.shape[1]
    valid = torch.arange(K, device=q.device)[None, :] < key_counts[:, None].long()
    seen = valid.any(-1)
    mask = (valid | ~seen[:, None])[:, None, None, :]
    q_rot = _rope(q, query_rope_pos, cos, sin).to(compute)[:, :, None, :]  # [B, H, 1, d]
    out = F.scaled_dot_product_attention(q_rot, torch.cat(ks), torch.cat(vs), attn_mask=mask, scale=sm_scale, enable_gqa=True)
    out = out.masked_fill(~seen[:, None, None, None], 0.0)
    return out[:, :, 0].to(q.dtype)

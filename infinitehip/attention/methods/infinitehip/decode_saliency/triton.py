"""add_decode_logits as one Triton kernel (same effect as `reference.py`, up to fp32 summation order).

One program per key of the windows' union and sequence (a batch's sequences in one launch, each one's queues a row of
a pool, decode_pool.py): it rotates its key, loops over the P queued queries, rotates and
scores each one that reaches it (all heads at once), and writes the key's sum and count: overwritten when the key
is a query's own (its sums restart), added otherwise. Keys of the union have distinct slots, so no two programs
write the same row (keys before the sequence, key_pos < 0, are reached by no query and write nothing).
Replaces ~50 launches of the eager update at every mask refresh."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def _decode_saliency_kernel(Q, Positions, Rows, KeyPos, Slots, Keys, Cos, Sin, Total, Count, P, window,
                            stride_qr, stride_qp, stride_qh, stride_pr, stride_kpg, stride_sg, stride_kg, stride_kw,
                            stride_kh, stride_cos, stride_total,
                            H: tl.constexpr, GROUP: tl.constexpr, HALF: tl.constexpr, HAS_ROWS: tl.constexpr,
                            BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    w = tl.program_id(0)
    g = tl.program_id(1).to(tl.int64)  # the sequence: its keys (g) and its queue row (rows[g])
    if HAS_ROWS:
        row = tl.load(Rows + g).to(tl.int64)
    else:
        row = g
    Q += row * stride_qr
    Positions += row * stride_pr
    KeyPos += g * stride_kpg
    Slots += g * stride_sg
    Keys += g * stride_kg
    kp = tl.load(KeyPos + w).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    hm = heads < H
    dm = dims < HALF
    m2 = hm[:, None] & dm[None, :]
    at = tl.maximum(kp, 0)
    kc = tl.load(Cos + at * stride_cos + dims, mask=dm, other=0.0)[None, :]
    ks = tl.load(Sin + at * stride_cos + dims, mask=dm, other=0.0)[None, :]
    kbase = Keys + w * stride_kw + (heads // GROUP)[:, None] * stride_kh + dims[None, :]  # head h reads kv head h // G
    k1 = tl.load(kbase, mask=m2, other=0.0).to(tl.float32)
    k2 = tl.load(kbase + HALF, mask=m2, other=0.0).to(tl.float32)
    r1 = k1 * kc - k2 * ks
    r2 = k2 * kc + k1 * ks
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    hits = 0
    own = 0
    for p in range(P):
        pos = tl.load(Positions + p).to(tl.int64)
        dist = pos - kp
        if (pos >= 0) & (kp >= 0) & (dist >= 0) & (dist < window):
            qc = tl.load(Cos + pos * stride_cos + dims, mask=dm, other=0.0)[None, :]
            qs = tl.load(Sin + pos * stride_cos + dims, mask=dm, other=0.0)[None, :]
            qbase = Q + p * stride_qp + heads[:, None] * stride_qh + dims[None, :]
            q1 = tl.load(qbase, mask=m2, other=0.0).to(tl.float32)
            q2 = tl.load(qbase + HALF, mask=m2, other=0.0).to(tl.float32)
            acc += tl.sum((q1 * qc - q2 * qs) * r1 + (q2 * qc + q1 * qs) * r2, axis=1)
            hits += 1
            own += (dist == 0).to(tl.int32)
    if hits > 0:
        slot = tl.load(Slots + w).to(tl.int64)
        dst = Total + slot * stride_total + heads  # a new name: Triton types a name once per scope (row is int64)
        if own > 0:
            tl.store(dst, acc, mask=hm)
            tl.store(Count + slot, hits.to(tl.float32))
        else:
            tl.store(dst, tl.load(dst, mask=hm, other=0.0) + acc, mask=hm)
            tl.store(Count + slot, tl.load(Count + slot) + hits.to(tl.float32))


def add_decode_logits_triton(q: torch.Tensor, positions: torch.Tensor, key_pos: torch.Tensor, slots: torch.Tensor,
                             keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, total: torch.Tensor,
                             count: torch.Tensor, window: int) -> None:
    add_decode_logits_batched_triton(q[None], positions[None], None, key_pos[None], slots[None], keys[None], cos, sin,
                                     total, count, window)


def add_decode_logits_batched_triton(q: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None,
                                     key_pos: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor, cos: torch.Tensor,
                                     sin: torch.Tensor, total: torch.Tensor, count: torch.Tensor, window: int) -> None:
    R, P, H, d = q.shape
    G, Wp, Hkv, _ = keys.shape
    if positions.shape != (R, P) or (rows is None and R != G) or (rows is not None and rows.shape != (G,)):
        raise ValueError(f"queues q {tuple(q.shape)}, positions {tuple(positions.shape)} do not match {G} sequences")
    if d % 2 or H % Hkv or cos.shape[-1] != d // 2 or key_pos.shape != (G, Wp) or slots.shape != (G, Wp):
        raise ValueError(f"shapes do not match: q {tuple(q.shape)}, keys {tuple(keys.shape)}, cos {tuple(cos.shape)}, "
                         f"key_pos {tuple(key_pos.shape)}, slots {tuple(slots.shape)}")
    if q.stride(-1) != 1 or keys.stride(-1) != 1 or positions.stride(1) != 1 or key_pos.stride(1) != 1 \
            or slots.stride(1) != 1 or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError("q, keys and the RoPE tables need a contiguous last dimension")
    if not (total.is_contiguous() and count.is_contiguous()) or total.dtype != torch.float32:
        raise ValueError("total [S + 1, H] fp32 and count [S + 1] must be contiguous")
    if G == 0:
        return
    _decode_saliency_kernel[(Wp, G)](
        q, positions, positions if rows is None else rows, key_pos, slots, keys, cos, sin, total, count, P, window,
        q.stride(0), q.stride(1), q.stride(2), positions.stride(0), key_pos.stride(0), slots.stride(0), keys.stride(0),
        keys.stride(1), keys.stride(2), cos.stride(0), total.stride(0),
        H=H, GROUP=H // Hkv, HALF=d // 2, HAS_ROWS=rows is not None, BLOCK_H=triton.next_power_of_2(H),
        BLOCK_D=triton.next_power_of_2(d // 2))

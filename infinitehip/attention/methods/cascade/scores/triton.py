"""The cascade's attention with scores as two Triton kernels (same results as `reference.py` up to fp32 rounding).

`_attention_kernel`, FlashAttention-style. Grid: (query tiles, KV heads, key shares). A program packs the G query
heads of one KV head with BLOCK_Q queries into the rows of its dots (row r: query r // G_PAD, head r % G_PAD), so
each key tile is read once per group; it walks the keys up to its last query's slot (slot-causal: key j <= K - n +
i), online softmax in the exp2 domain, and writes the output and each row's log2-sum-exp. A launch of one query
tile (decode) splits the keys into shares (flash-decoding) whose partial outputs merge by their log2-sum-exps.

`_scores_kernel`. Grid: (key tiles, KV heads). A program holds one tile of BLOCK_N keys and walks the query tiles
that see any of them: per head g of the group, log2 p = q_g.k * scale * log2(e) - lse2_g (the probabilities of
the forward's softmax, from one more product, no normalization pass), reduced over the group (max: before the exp2;
mean: after), masked (slot-causal), weighted by the EMA's query weights and summed over the queries; then
score <- score * decay^(queries that see the key) + that sum, written once.

fp32 inputs use IEEE fp32 dots (they match the fp32 oracle), 16-bit inputs tensor-core dots with fp32
accumulation. Head dims need not be powers of two (masked padding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.attention.methods.cascade.scores.ema import ema_factors
from infinitehip.triton_interpreter import fix_interpreter_if_active

_LOG2E = 1.4426950408889634

fix_interpreter_if_active()


@triton.jit
def _attention_kernel(Q, K, V, Out, Lse2, n, num_keys, qk_scale, per_split,
                      stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh,
                      stride_os, stride_on, stride_oh, stride_ls,
                      G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                      BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD
    tile = tl.program_id(0)
    hkv = tl.program_id(1)
    split = tl.program_id(2)  # a share of per_split keys (several: one query tile, as in decode)
    offs_m = tl.arange(0, BLOCK_M)
    query = tile * BLOCK_Q + offs_m // G_PAD
    g = offs_m % G_PAD
    row_ok = (query < n) & (g < G)
    head = hkv * G + g
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    q = tl.load(Q + query[:, None].to(tl.int64) * stride_qn + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q_slot = num_keys - n + query  # [M]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    key_lo = split * per_split
    key_hi = tl.minimum(num_keys, num_keys - n + (tile + 1) * BLOCK_Q)  # past the tile's last query: invisible
    key_hi = tl.minimum(key_hi, key_lo + per_split)
    k_base = K + hkv * stride_kh
    v_base = V + hkv * stride_vh
    for start in range(key_lo, key_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < key_hi
        k = tl.load(k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None],
                    mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # [D_PAD, BLOCK_N]
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(n_ok[None, :] & (offs_n[None, :] <= q_slot[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # padded rows see nothing
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vn + offs_d[None, :],
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o_ptrs = (Out + split.to(tl.int64) * stride_os + query[:, None].to(tl.int64) * stride_on
              + head[:, None] * stride_oh + offs_d[None, :])
    tl.store(o_ptrs, (acc / l_safe[:, None]).to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    lse2 = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))  # a split's rows may see none of its keys
    tl.store(Lse2 + split.to(tl.int64) * stride_ls + head.to(tl.int64) * n + query, lse2, mask=row_ok)


@triton.jit
def _scores_kernel(Q, K, Lse2, Weights, Keep, Scores, n, num_keys, qk_scale,
                   stride_qn, stride_qh, stride_kn, stride_kh, stride_sh,
                   G: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, MEAN: tl.constexpr,
                   BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    tile = tl.program_id(0)
    hkv = tl.program_id(1)
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < num_keys
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    k = tl.load(K + hkv * stride_kh + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None],
                mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # [D_PAD, BLOCK_N]
    first_slot = num_keys - n  # the first query's slot
    q_lo = tl.maximum(tile * BLOCK_N - first_slot, 0) // BLOCK_Q * BLOCK_Q  # earlier queries see none of the tile
    total = tl.zeros([BLOCK_N], tl.float32)
    for q0 in range(q_lo, n, BLOCK_Q):
        offs_q = q0 + tl.arange(0, BLOCK_Q)
        q_ok = offs_q < n
        visible = q_ok[:, None] & n_ok[None, :] & (offs_n[None, :] <= first_slot + offs_q[:, None])
        if MEAN:
            reduced = tl.zeros([BLOCK_Q, BLOCK_N], tl.float32)
        else:
            reduced = tl.full([BLOCK_Q, BLOCK_N], float("-inf"), tl.float32)
        for g in range(G):
            head = hkv * G + g
            q = tl.load(Q + offs_q[:, None].to(tl.int64) * stride_qn + head * stride_qh + offs_d[None, :],
                        mask=q_ok[:, None] & d_ok[None, :], other=0.0)
            lse2 = tl.load(Lse2 + head.to(tl.int64) * n + offs_q, mask=q_ok, other=0.0)
            log2p = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale - lse2[:, None]
            if MEAN:
                reduced += tl.exp2(log2p)
            else:
                reduced = tl.maximum(reduced, log2p)
        probs = reduced / G if MEAN else tl.exp2(reduced)
        w = tl.load(Weights + offs_q, mask=q_ok, other=0.0)
        total += tl.sum(tl.where(visible, probs, 0.0) * w[:, None], 0)
    seen = tl.where(offs_n < first_slot, n, num_keys - offs_n)  # queries that see each key
    keep = tl.load(Keep + seen, mask=n_ok, other=0.0)
    s_ptrs = Scores + hkv * stride_sh + offs_n
    tl.store(s_ptrs, tl.load(s_ptrs, mask=n_ok, other=0.0) * keep + total, mask=n_ok)


MAX_SPLITS, SPLIT_KEYS = 64, 512  # key shares of a one-tile launch: at most 64, of at least 512 keys


def _merge_splits(out: torch.Tensor, lse2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial outputs [S, n, H, d] (each normalized over its share) and log2-sum-exps [S, H, n] -> the whole
    attention's output [n, H, d] fp32 and log2-sum-exp [H, n]."""
    top = lse2.amax(0)  # every row sees key 0, in the first share: finite
    w = torch.exp2(lse2 - top)  # [S, H, n]
    total = w.sum(0)
    merged = (out * w.transpose(1, 2)[..., None]).sum(0) / total.t()[..., None]
    return merged, top + torch.log2(total)


def _blocks(d_pad: int, rows: int, group_pad: int) -> tuple[int, int, int]:
    """(BLOCK_Q, BLOCK_N, num_warps) of the attention kernel: 128 packed rows (64 for head dims past 128), key
    tiles that fit beside them."""
    block_q = max(1, min((64 if d_pad > 128 else 128) // group_pad, triton.next_power_of_2(rows)))
    block_q = max(block_q, -(-16 // group_pad))  # tl.dot needs 16 rows
    block_n = 32 if d_pad > 128 else 64
    return block_q, block_n, 8 if d_pad >= 128 else 4


def attention_with_scores_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor,
                                 scale: float, decay: float, reduction: str) -> torch.Tensor:
    """op.attention_with_scores's arguments (slot order) -> out [n, H, d] in q's dtype; scores updated in place."""
    n, H, d = q.shape
    K, Hkv = k.shape[:2]
    G = H // Hkv
    if k.dtype != q.dtype:
        k = k.to(q.dtype)
    if v.dtype != q.dtype:
        v = v.to(q.dtype)
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    if scores.stride(-1) != 1:
        raise ValueError("cascade attention: scores must be contiguous in their last dim")
    weights, keep = ema_factors(n, decay, q.device)
    d_pad, g_pad = triton.next_power_of_2(d), triton.next_power_of_2(G)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    qk_scale = scale * _LOG2E
    block_q, block_n, warps = _blocks(d_pad, n, g_pad)
    tiles = triton.cdiv(n, block_q)
    # One query tile (decode, short chunks): the keys in shares over programs, merged by log-sum-exp below
    splits = 1 if tiles > 1 else max(1, min(MAX_SPLITS, K // SPLIT_KEYS))
    per_split = triton.cdiv(triton.cdiv(K, splits), block_n) * block_n
    if splits == 1:
        out, lse2 = torch.empty_like(q), torch.empty(1, H, n, dtype=torch.float32, device=q.device)
    else:
        out = torch.empty(splits, n, H, d, dtype=torch.float32, device=q.device)
        lse2 = torch.empty(splits, H, n, dtype=torch.float32, device=q.device)
    o_strides = (out.stride(0), out.stride(1), out.stride(2)) if splits > 1 else (0, out.stride(0), out.stride(1))
    _attention_kernel[(tiles, Hkv, splits)](
        q, k, v, out, lse2, n, K, qk_scale, per_split, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0), v.stride(1), *o_strides, lse2.stride(0), G=G, G_PAD=g_pad, D=d, D_PAD=d_pad, BLOCK_Q=block_q,
        BLOCK_N=block_n, DOT_PRECISION=precision, num_warps=warps)
    if splits > 1:
        out, lse2 = _merge_splits(out, lse2)
        out = out.to(q.dtype)
    lse2 = lse2.reshape(H, n)
    score_q = 16 if n <= 16 else 64
    score_n = 32 if d_pad > 128 else 64
    _scores_kernel[(triton.cdiv(K, score_n), Hkv)](
        q, k, lse2, weights, keep, scores, n, K, qk_scale, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        scores.stride(0), G=G, D=d, D_PAD=d_pad, MEAN=reduction == "mean", BLOCK_Q=score_q, BLOCK_N=score_n,
        DOT_PRECISION=precision, num_warps=4)
    return out

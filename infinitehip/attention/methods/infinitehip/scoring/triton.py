"""Chunk scoring of one pruning stage as a single Triton kernel (same signature and outputs as `reference.py`).

Paper Sec. 3.1 / App. A (Alg. 2 lines 6-11, Alg. 3): for query block m, candidate chunk j and head h, SelectRep
bisects the chunk (left half = (size + 1) // 2 tokens, ties go left), scoring the first token of each half by
the max over the block's valid queries of q . k; the chunk score is the max over heads of the representative's
score (at `rep_offset`). One kernel serves every stage; stages differ only in the arguments.

Kernel design (`_chunk_scores_kernel`)
- Grid: 1-D, M * H * cdiv(N, BLOCK_C) programs; a program = (query block m, query head h, BLOCK_C consecutive
  chunks), chunk blocks fastest so neighbouring programs share the block's queries in L2. Heads live in the
  grid rather than in a loop, so the dependent gathers of many bisections overlap across resident programs
  (decode has M = batch: a head loop would serialize H bisections per program).
- The block's rotated queries of head h are loaded once, as two halves [d/2, b] (rotate-half pairs
  (i, i + d/2)), and reused by every dot of the program; blocks of more than 64 queries are streamed from
  L1/L2 in tiles of 64 instead of being held.
- Bisection state per chunk row lives in registers: lo, size and the cached scores of token lo at the left and
  right offsets. A `while` loop runs until every chunk of the program has size <= 1. That is the reference's
  global ceil(log2(max len)) iterations (extra iterations are no-ops for converged chunks) without a host
  sync for the max. Each iteration gathers, for the still-splittable chunks only, the key of `mid` and -- only
  where lo's score at left_offset is not known yet -- the key of `lo` (after "go left" lo is unchanged, so its
  score is reused bitwise: ~25% fewer gathers). A gather is token -> page_table[t // page_size] * page_size
  + t % page_size -> the two halves of k[slot, h // (H / Hkv)] and the cos/sin rows of the key's RoPE position
  key_pos_base[m, j] + offset (+ t // token_pos_group), rotated in fp32; then S = k1r @ q1 + k2r @ q2
  ([BLOCK_C, d/2] x [d/2, BLOCK_Q], fp32 accumulation), invalid queries set to finfo(fp32).min like the
  reference, max over queries. go_right = right > left.
- The representative's score is the cached left/right score when rep_offset equals that offset, else one
  more gather. Scores are max-reduced over heads with a float atomic_max into a -inf-initialized [M, N] buffer
  (padding chunks are never touched and stay -inf; max is order independent, so results are deterministic).
  Representatives are stored per (m, j, h).
- Masked lanes read nothing: padding chunks (len 0), converged chunks, padded dims and queries issue no loads,
  so only tokens inside candidate chunks (and their page-table entries) are ever read. (The reference reads
  token chunk_starts[m, j] of padding chunks; the kernel does not.)
- Dot operands: 16-bit caches round the fp32-rotated key once to the cache dtype and use bf16/fp16 tensor-core
  dots (q of the same dtype is exact), fp32 accumulation; this is what keeps the kernel spill-free at
  BLOCK_C = 64 (wgmma on Hopper). fp32 caches use 3xTF32 dots (~fp32 accuracy, no FMA-loop spills; set
  FP32_DOT_PRECISION = "ieee" for bitwise-closer, much slower dots). Blocks of fewer than 16 queries (decode)
  use an fp32 broadcast-multiply-sum instead of tl.dot; d/2 < 16 is zero-padded to 16 for tl.dot.
- Token/slot arithmetic is int64 (caches beyond 2^31 elements); head dims need not be powers of two.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

_FP32_MIN = tl.constexpr(-3.4028234663852886e38)  # torch.finfo(torch.float32).min, the reference's query mask
MAX_BLOCK_Q = 64  # query tile held for the whole program; larger blocks are streamed in tiles of this size
FP32_DOT_PRECISION = "tf32x3"
_OP_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


fix_interpreter_if_active()


@triton.jit
def _load_q(Q, q_base, QValid, qv_base, q0, b, stride_qb, stride_qd, stride_vb,
            HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_Q: tl.constexpr, OP_DTYPE: tl.constexpr):
    """Query halves [BLOCK_HALF, BLOCK_Q] (OP_DTYPE) of queries q0 .. q0 + BLOCK_Q, and their validity."""
    offs_q = q0 + tl.arange(0, BLOCK_Q)
    offs_h = tl.arange(0, BLOCK_HALF)
    in_b = offs_q < b
    q_ok = in_b & (tl.load(QValid + qv_base + offs_q * stride_vb, mask=in_b, other=0) != 0)
    if HALF == BLOCK_HALF:
        mask = q_ok[None, :]
    else:
        mask = q_ok[None, :] & (offs_h[:, None] < HALF)
    ptrs = Q + q_base + offs_q[None, :] * stride_qb + offs_h[:, None] * stride_qd
    q1 = tl.load(ptrs, mask=mask, other=0.0).to(OP_DTYPE)
    q2 = tl.load(ptrs + HALF * stride_qd, mask=mask, other=0.0).to(OP_DTYPE)
    return q1, q2, q_ok


@triton.jit
def _max_qk(k1r, k2r, q1, q2, q_ok, USE_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Max over valid queries of q . k per row: k halves [BLOCK_C, BH] fp32, q halves [BH, BLOCK_Q] -> [BLOCK_C]."""
    if USE_DOT:
        s = tl.dot(k1r.to(q1.dtype), q1, input_precision=DOT_PRECISION)
        s = tl.dot(k2r.to(q2.dtype), q2, s, input_precision=DOT_PRECISION)
    else:
        s = tl.sum(k1r[:, :, None] * q1[None, :, :], axis=1) + tl.sum(k2r[:, :, None] * q2[None, :, :], axis=1)
    s = tl.where(q_ok[None, :], s, _FP32_MIN)
    return tl.max(s, axis=1)


@triton.jit
def _score_tokens(
    tok, pos, rows,  # [BLOCK_C] int64 tokens, int64 RoPE positions, bool rows to compute (others: garbage)
    q1, q2, q_ok,  # held query tile (Q_TILES == 1)
    K, PageTable, Cos, Sin, k_head_off, stride_ks, stride_kd, stride_cos, page_size,
    Q, q_base, QValid, qv_base, b, stride_qb, stride_qd, stride_vb,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_Q: tl.constexpr, Q_TILES: tl.constexpr,
    USE_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """[BLOCK_C] fp32: max over the block's valid queries of q . rope(k[tok], pos). Rows outside `rows` read
    nothing (their keys are zeros)."""
    offs_h = tl.arange(0, BLOCK_HALF)
    page = tl.load(PageTable + tok // page_size, mask=rows, other=0).to(tl.int64)
    slot = page * page_size + tok % page_size
    if HALF == BLOCK_HALF:
        mask = rows[:, None]
    else:
        mask = rows[:, None] & (offs_h[None, :] < HALF)
    k_ptrs = K + k_head_off + slot[:, None] * stride_ks + offs_h[None, :] * stride_kd
    k1 = tl.load(k_ptrs, mask=mask, other=0.0).to(tl.float32)
    k2 = tl.load(k_ptrs + HALF * stride_kd, mask=mask, other=0.0).to(tl.float32)
    cs = pos[:, None] * stride_cos + offs_h[None, :]
    cos = tl.load(Cos + cs, mask=mask, other=0.0)
    sin = tl.load(Sin + cs, mask=mask, other=0.0)
    k1r = k1 * cos - k2 * sin
    k2r = k2 * cos + k1 * sin
    if Q_TILES == 1:
        best = _max_qk(k1r, k2r, q1, q2, q_ok, USE_DOT, DOT_PRECISION)
    else:
        best = tl.full(tok.shape, _FP32_MIN, tl.float32)
        for t in tl.static_range(Q_TILES):
            p1, p2, p_ok = _load_q(Q, q_base, QValid, qv_base, t * BLOCK_Q, b, stride_qb, stride_qd, stride_vb,
                                   HALF, BLOCK_HALF, BLOCK_Q, q1.dtype)
            best = tl.maximum(best, _max_qk(k1r, k2r, p1, p2, p_ok, USE_DOT, DOT_PRECISION))
    return best


@triton.jit
def _chunk_scores_kernel(
    Q, QValid, K, PageTable, Starts, Lens, Base, Cos, Sin, Scores, Reps,
    N, H, b, kv_group, page_size, pos_group, left_offset, right_offset, rep_offset, num_chunk_blocks,
    stride_qm, stride_qb, stride_qh, stride_qd, stride_vm, stride_vb,
    stride_ks, stride_kh, stride_kd, stride_cos,
    HAS_POS_GROUP: tl.constexpr,
    REP_IS_LEFT: tl.constexpr,  # rep_offset == left_offset: a known left score of lo is the rep score
    REP_IS_RIGHT: tl.constexpr,  # rep_offset == right_offset: a known right score of lo is the rep score
    RIGHT_IS_LEFT: tl.constexpr,  # right_offset == left_offset: after "go right", lo's left score is known
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_Q: tl.constexpr,
    Q_TILES: tl.constexpr, USE_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, OP_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    cb = pid % num_chunk_blocks
    h = (pid // num_chunk_blocks) % H
    m = pid // (num_chunk_blocks * H)

    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < N
    mn = m.to(tl.int64) * N + offs_c  # the [M, N] inputs/outputs are contiguous
    start = tl.load(Starts + mn, mask=c_ok, other=0).to(tl.int64)
    length = tl.load(Lens + mn, mask=c_ok, other=0).to(tl.int64)
    base = tl.load(Base + mn, mask=c_ok, other=0).to(tl.int64)

    k_head_off = (h // kv_group).to(tl.int64) * stride_kh
    q_base = m.to(tl.int64) * stride_qm + h.to(tl.int64) * stride_qh
    qv_base = m.to(tl.int64) * stride_vm
    if Q_TILES == 1:
        q1, q2, q_ok = _load_q(Q, q_base, QValid, qv_base, 0, b, stride_qb, stride_qd, stride_vb,
                               HALF, BLOCK_HALF, BLOCK_Q, OP_DTYPE)
    else:  # streamed inside _score_tokens; these only carry the dtype
        q1 = tl.zeros((BLOCK_HALF, BLOCK_Q), OP_DTYPE)
        q2 = q1
        q_ok = tl.arange(0, BLOCK_Q) < 0

    lo = start
    size = length  # 0 for padding chunks and lanes past N: never split, never read
    s_left = tl.zeros((BLOCK_C,), tl.float32)  # score of token lo at left_offset, valid where has_left
    s_right = tl.zeros((BLOCK_C,), tl.float32)  # score of token lo at right_offset, valid where has_right
    has_left = offs_c < 0
    has_right = offs_c < 0
    while tl.max(size, axis=0) > 1:
        split = size > 1
        half = (size + 1) // 2
        mid = lo + half

        need_left = split & (has_left == 0)
        pos = base + left_offset
        if HAS_POS_GROUP:
            pos += lo // pos_group
        s = _score_tokens(lo, pos, need_left, q1, q2, q_ok, K, PageTable, Cos, Sin, k_head_off, stride_ks,
                          stride_kd, stride_cos, page_size, Q, q_base, QValid, qv_base, b, stride_qb, stride_qd,
                          stride_vb, HALF, BLOCK_HALF, BLOCK_Q, Q_TILES, USE_DOT, DOT_PRECISION)
        s_left = tl.where(need_left, s, s_left)
        has_left = has_left | need_left

        pos = base + right_offset
        if HAS_POS_GROUP:
            pos += mid // pos_group
        s_mid = _score_tokens(mid, pos, split, q1, q2, q_ok, K, PageTable, Cos, Sin, k_head_off, stride_ks,
                              stride_kd, stride_cos, page_size, Q, q_base, QValid, qv_base, b, stride_qb,
                              stride_qd, stride_vb, HALF, BLOCK_HALF, BLOCK_Q, Q_TILES, USE_DOT, DOT_PRECISION)

        go_right = split & (s_mid > s_left)  # ties go left
        lo = tl.where(go_right, mid, lo)
        size = tl.where(go_right, size - half, tl.where(split, half, size))
        s_right = tl.where(go_right, s_mid, s_right)
        has_right = has_right | go_right
        if RIGHT_IS_LEFT:
            s_left = tl.where(go_right, s_mid, s_left)
        else:
            has_left = has_left & (go_right == 0)

    real = length > 0
    need_rep = real
    cached = s_left
    if REP_IS_LEFT:
        need_rep = need_rep & (has_left == 0)
        if REP_IS_RIGHT:
            cached = tl.where(has_left, s_left, s_right)
            need_rep = need_rep & (has_right == 0)
    elif REP_IS_RIGHT:
        need_rep = need_rep & (has_right == 0)
        cached = s_right
    pos = base + rep_offset
    if HAS_POS_GROUP:
        pos += lo // pos_group
    s = _score_tokens(lo, pos, need_rep, q1, q2, q_ok, K, PageTable, Cos, Sin, k_head_off, stride_ks,
                      stride_kd, stride_cos, page_size, Q, q_base, QValid, qv_base, b, stride_qb, stride_qd,
                      stride_vb, HALF, BLOCK_HALF, BLOCK_Q, Q_TILES, USE_DOT, DOT_PRECISION)
    rep_score = tl.where(need_rep, s, cached)

    tl.atomic_max(Scores + mn, rep_score, mask=c_ok & real, sem="relaxed")
    tl.store(Reps + mn * H + h, lo, mask=c_ok)


def _launch_config(b: int, half: int, n: int, lowp: bool) -> dict:
    """Tile sizes and warps, from ptxas -v for sm_90a (b = 64 queries): with 16-bit operands BLOCK_C = 64 runs
    on wgmma spill-free (d = 128: 8 warps, 188 registers; d = 64: 4 warps, 174), BLOCK_C = 16 on mma.sync
    (4 warps, ~250); BLOCK_C = 32 spills, so it is skipped. 3xTF32 (fp32 caches) spills a little at any
    size, least with 4 warps."""
    block_q = min(triton.next_power_of_2(max(b, 1)), MAX_BLOCK_Q)
    use_dot = block_q >= 16
    # tl.dot needs K >= 16: tiny head dims are zero-padded (otherwise the compiler turns the broadcast-sum
    # below into a TF32 dot on its own)
    block_half = max(16 if use_dot else 1, triton.next_power_of_2(half))
    num_stages = 3  # Triton's default on CUDA
    if use_dot:
        block_c = 16 if n <= 16 else 64
        num_warps = 8 if block_c == 64 and block_half >= 64 and lowp else 4
        if not lowp and block_half >= 128:  # fp32 at d = 256: 3 stages of [64, d] keys exceed shared memory
            block_c, num_stages = min(block_c, 32), 2
    else:  # broadcast product [BLOCK_C, BLOCK_HALF, BLOCK_Q] fp32 in registers: keep it at ~4K elements
        block_c = min(64, max(16, triton.next_power_of_2(n)), max(16, 4096 // (block_half * block_q)))
        num_warps = 4
    return dict(BLOCK_Q=block_q, Q_TILES=triton.cdiv(b, block_q), BLOCK_HALF=block_half, BLOCK_C=block_c,
                USE_DOT=use_dot, num_warps=num_warps, num_stages=num_stages)


def chunk_scores_triton(
    q_rot: torch.Tensor,  # [M, b, H, d] rotated queries of each query block
    q_valid: torch.Tensor,  # [M, b] bool: padded query rows are False
    k_flat: torch.Tensor,  # [S, Hkv, d] keys without RoPE (flat paged cache of one layer)
    page_table: torch.Tensor,  # [P] int
    page_size: int,
    chunk_starts: torch.Tensor,  # [M, N] int64 first token of each candidate chunk
    chunk_lens: torch.Tensor,  # [M, N] int64 tokens in the chunk; 0 marks padding
    key_pos_base: torch.Tensor,  # [M, N] int64
    token_pos_group: int | None,  # None: keys' own positions are not used
    left_offset: int,
    right_offset: int,
    rep_offset: int,
    cos: torch.Tensor,  # [P_rope, d/2] fp32
    sin: torch.Tensor,
    max_elements: int = 1 << 25,  # the reference's memory bound; unused (O(1) state per chunk and head)
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (scores [M, N] fp32, -inf for padding chunks; representatives [M, N, H] int64 token positions)."""
    del max_elements
    M, b, H, d = q_rot.shape
    N = chunk_starts.shape[1]
    if N == 0 or M == 0:
        return q_rot.new_full((M, N), float("-inf"), dtype=torch.float32), chunk_starts.new_zeros(M, N, H)
    Hkv = k_flat.shape[1]
    if H % Hkv or d % 2 or k_flat.shape[2] != d or cos.shape[-1] != d // 2 or sin.shape != cos.shape:
        raise ValueError(f"shape mismatch: q {tuple(q_rot.shape)}, k {tuple(k_flat.shape)}, cos {tuple(cos.shape)}")
    if token_pos_group is not None and token_pos_group <= 0:
        raise ValueError(f"token_pos_group must be positive, got {token_pos_group}")
    half = d // 2
    scores = torch.full((M, N), float("-inf"), dtype=torch.float32, device=q_rot.device)
    reps = torch.empty((M, N, H), dtype=torch.int64, device=q_rot.device)
    qv = q_valid.view(torch.uint8) if q_valid.dtype == torch.bool else q_valid
    cos, sin = cos.contiguous(), sin.contiguous()
    cfg = _launch_config(b, half, N, k_flat.dtype in _OP_DTYPES)
    op_dtype = _OP_DTYPES.get(k_flat.dtype, tl.float32) if cfg["USE_DOT"] else tl.float32
    num_chunk_blocks = triton.cdiv(N, cfg["BLOCK_C"])
    _chunk_scores_kernel[(M * H * num_chunk_blocks,)](
        q_rot, qv, k_flat, page_table, chunk_starts.contiguous(), chunk_lens.contiguous(),
        key_pos_base.contiguous(), cos, sin, scores, reps,
        N, H, b, H // Hkv, page_size, token_pos_group or 1, left_offset, right_offset, rep_offset,
        num_chunk_blocks,
        *q_rot.stride(), *qv.stride(), *k_flat.stride(), cos.stride(0),
        HAS_POS_GROUP=token_pos_group is not None,
        REP_IS_LEFT=rep_offset == left_offset, REP_IS_RIGHT=rep_offset == right_offset,
        RIGHT_IS_LEFT=right_offset == left_offset,
        HALF=half, DOT_PRECISION=FP32_DOT_PRECISION if op_dtype == tl.float32 else "tf32", OP_DTYPE=op_dtype,
        **cfg,
    )
    return scores, reps

"""Chunk scores from given representatives (landmark mode) as one Triton kernel (same signature and outputs
as `reference.representative_scores_reference`).

score[m, j] = max over heads h and the block's valid queries i of q_rot[m, i, h] . rope(k[reps[m, j, h]], pos),
pos = key_pos_base[m, j] + rep_offset (+ reps[m, j, h] // token_pos_group); -inf for padding chunks.

Kernel design (`_rep_scores_kernel`)
- Grid: 1-D, M * HEAD_SPLITS * cdiv(N, BLOCK_N) programs; a program = (query block m, a group of heads,
  BLOCK_N consecutive chunks), chunk tiles fastest so programs running together share the block's queries in
  L2 (and, in stage 1 where every block has the same representatives, the same key rows). Prefill keeps all
  heads in one program (HEAD_SPLITS = 1); decode (M = 1) splits the heads over the grid so that ~2K programs
  overlap their dependent gathers.
- Per head: reps[m, tile, h] -> page_table[t // page_size] * page_size + t % page_size (int64) -> the two
  halves of k[slot, h // (H / Hkv)] [BLOCK_N, d/2] (GQA: a query head reads its own representatives, so
  there is nothing to share between the heads of a group), then S = k1 @ q1 + k2 @ q2 ([BLOCK_N, d/2] x
  [d/2, BLOCK_Q], tensor cores, fp32 accumulation), invalid queries set to finfo(fp32).min like the
  reference, max over queries, running max over the program's heads; blocks of more than 64 queries stream
  their queries in tiles of 64. One float atomic_max per chunk into a -inf-initialized [M, N] buffer (order
  free, so deterministic); padding chunks (len 0) are never touched and read nothing.
- RoPE without a host sync: when the tile's real chunks share one key position p (no token_pos_group and a
  constant key_pos_base over the tile: the relative / infllm styles, i.e. most layers), the queries are
  rotated back by p instead (<R(a)q, R(p)k> = <R(a-p)q, k>) and the raw cache keys go straight into the dot;
  otherwise (chunk_indexed, dynamic, none) each key row is rotated in fp32 at its own position. The choice is
  a runtime branch per program between two compiled copies of the head loop.
- Dot operands: 16-bit caches use bf16/fp16 dots (rotated operands rounded once to the cache dtype), fp32
  caches 3xTF32 (~fp32 accuracy); blocks of fewer than 16 queries (decode) an fp32 broadcast-multiply-sum;
  d/2 < 16 is zero-padded for tl.dot; head dims need not be powers of two.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.attention.methods.infinitehip.scoring.triton import (
    _FP32_MIN, _OP_DTYPES, FP32_DOT_PRECISION, MAX_BLOCK_Q, _load_q, _max_qk,
)
from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()

TARGET_PROGRAMS = 2048  # split heads over the grid until this many programs run (decode)


@triton.jit
def _heads_max(
    best, h_lo, h_hi, rep_base, stride_rh, real, pos_base, qcos, qsin,
    Q, q_base, QValid, qv_base, b, stride_qb, stride_qh, stride_qd, stride_vb,
    K, PageTable, Cos, Sin, kv_group, page_size, pos_group, stride_ks, stride_kh, stride_kd, stride_cos,
    ROTATE_KEYS: tl.constexpr, HAS_POS_GROUP: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_Q: tl.constexpr, Q_TILES: tl.constexpr, USE_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    OP_DTYPE: tl.constexpr,
):
    """best [BLOCK_N] fp32 maxed with the scores of heads h_lo .. h_hi - 1. ROTATE_KEYS: keys at pos_base
    (+ token // pos_group); else raw keys and queries rotated back by (qcos, qsin) [BLOCK_HALF]."""
    offs_d = tl.arange(0, BLOCK_HALF)
    if HALF == BLOCK_HALF:
        kmask = real[:, None]
    else:
        kmask = real[:, None] & (offs_d[None, :] < HALF)
    for h in range(h_lo, h_hi):
        tok = tl.load(rep_base + h * stride_rh, mask=real, other=0).to(tl.int64)  # [BLOCK_N]
        page = tl.load(PageTable + tok // page_size, mask=real, other=0).to(tl.int64)
        slot = page * page_size + tok % page_size
        k_ptrs = K + (h // kv_group) * stride_kh + slot[:, None] * stride_ks + offs_d[None, :] * stride_kd
        k1 = tl.load(k_ptrs, mask=kmask, other=0.0)
        k2 = tl.load(k_ptrs + HALF * stride_kd, mask=kmask, other=0.0)
        if ROTATE_KEYS:
            pos = pos_base
            if HAS_POS_GROUP:
                pos += tok // pos_group
            cs = pos[:, None] * stride_cos + offs_d[None, :]
            cos = tl.load(Cos + cs, mask=kmask, other=0.0)
            sin = tl.load(Sin + cs, mask=kmask, other=0.0)
            k1f, k2f = k1.to(tl.float32), k2.to(tl.float32)
            k1 = (k1f * cos - k2f * sin).to(OP_DTYPE)
            k2 = (k2f * cos + k1f * sin).to(OP_DTYPE)
        qh = q_base + h * stride_qh  # q_base is int64
        for t in tl.static_range(Q_TILES):
            q1, q2, q_ok = _load_q(Q, qh, QValid, qv_base, t * BLOCK_Q, b, stride_qb, stride_qd, stride_vb,
                                   HALF, BLOCK_HALF, BLOCK_Q, tl.float32)  # [BLOCK_HALF, BLOCK_Q]
            if not ROTATE_KEYS:
                q1, q2 = q1 * qcos[:, None] + q2 * qsin[:, None], q2 * qcos[:, None] - q1 * qsin[:, None]
            best = tl.maximum(best, _max_qk(k1, k2, q1.to(OP_DTYPE), q2.to(OP_DTYPE), q_ok, USE_DOT, DOT_PRECISION))
    return best


@triton.jit
def _rep_scores_kernel(
    Q, QValid, K, PageTable, Reps, Lens, Base, Cos, Sin, Scores,
    N, H, b, kv_group, page_size, pos_group, rep_offset, num_tiles, head_splits, heads_per_prog,
    stride_qm, stride_qb, stride_qh, stride_qd, stride_vm, stride_vb,
    stride_ks, stride_kh, stride_kd, stride_cos,
    stride_rm, stride_rn, stride_rh, stride_lm, stride_ln, stride_bm, stride_bn,
    HAS_POS_GROUP: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_Q: tl.constexpr, Q_TILES: tl.constexpr, USE_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    OP_DTYPE: tl.constexpr,
):
    pid = tl.program_id(0)
    tile = pid % num_tiles
    split = (pid // num_tiles) % head_splits
    m = (pid // (num_tiles * head_splits)).to(tl.int64)

    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    length = tl.load(Lens + m * stride_lm + offs_n * stride_ln, mask=n_ok, other=0)
    real = n_ok & (length > 0)  # padding chunks and lanes past N read nothing
    base = tl.load(Base + m * stride_bm + offs_n * stride_bn, mask=real, other=0).to(tl.int64)
    h_lo = split * heads_per_prog
    h_hi = tl.minimum(h_lo + heads_per_prog, H)
    h_hi = tl.where(tl.max(real.to(tl.int32), axis=0) > 0, h_hi, h_lo)  # no real chunk: skip the heads

    rep_base = Reps + m * stride_rm + offs_n.to(tl.int64) * stride_rn  # [BLOCK_N] pointers, + h * stride_rh
    q_base = m * stride_qm
    qv_base = m * stride_vm
    pos_base = base + rep_offset
    best = tl.full((BLOCK_N,), _FP32_MIN, tl.float32)
    if HAS_POS_GROUP:
        qcos = tl.zeros((BLOCK_HALF,), tl.float32)
        best = _heads_max(best, h_lo, h_hi, rep_base, stride_rh, real, pos_base, qcos, qcos,
                          Q, q_base, QValid, qv_base, b, stride_qb, stride_qh, stride_qd, stride_vb,
                          K, PageTable, Cos, Sin, kv_group, page_size, pos_group, stride_ks, stride_kh, stride_kd,
                          stride_cos, True, HAS_POS_GROUP, HALF, BLOCK_HALF, BLOCK_Q, Q_TILES, USE_DOT,
                          DOT_PRECISION, OP_DTYPE)
    else:
        big = 1 << 62
        p_min = tl.min(tl.where(real, pos_base, big), axis=0)
        p_max = tl.max(tl.where(real, pos_base, -big), axis=0)
        if p_min == p_max:  # one key position for the whole tile: rotate the queries back by it instead
            offs_d = tl.arange(0, BLOCK_HALF)
            d_ok = offs_d < HALF
            qcos = tl.load(Cos + p_min * stride_cos + offs_d, mask=d_ok, other=0.0)
            qsin = tl.load(Sin + p_min * stride_cos + offs_d, mask=d_ok, other=0.0)
            best = _heads_max(best, h_lo, h_hi, rep_base, stride_rh, real, pos_base, qcos, qsin,
                              Q, q_base, QValid, qv_base, b, stride_qb, stride_qh, stride_qd, stride_vb,
                              K, PageTable, Cos, Sin, kv_group, page_size, pos_group, stride_ks, stride_kh,
                              stride_kd, stride_cos, False, HAS_POS_GROUP, HALF, BLOCK_HALF, BLOCK_Q, Q_TILES,
                              USE_DOT, DOT_PRECISION, OP_DTYPE)
        else:
            qcos = tl.zeros((BLOCK_HALF,), tl.float32)
            best = _heads_max(best, h_lo, h_hi, rep_base, stride_rh, real, pos_base, qcos, qcos,
                              Q, q_base, QValid, qv_base, b, stride_qb, stride_qh, stride_qd, stride_vb,
                              K, PageTable, Cos, Sin, kv_group, page_size, pos_group, stride_ks, stride_kh,
                              stride_kd, stride_cos, True, HAS_POS_GROUP, HALF, BLOCK_HALF, BLOCK_Q, Q_TILES,
                              USE_DOT, DOT_PRECISION, OP_DTYPE)
    tl.atomic_max(Scores + m * N + offs_n, best, mask=real, sem="relaxed")


def _launch_config(M: int, N: int, H: int, b: int, half: int, lowp: bool) -> tuple[dict, int, int]:
    """Tile sizes, warps and the head split -> (kernel config, head_splits, heads_per_prog). BLOCK_N is the
    dot's M dimension (chunks), BLOCK_Q its N (the block's queries), d/2 its K. From ptxas -v for sm_90a at
    d = 128 (`git show 29b96eb:bench/ptxas_report.py`): bf16 BLOCK_N = 128 / 8 warps runs on wgmma with 224 registers and no
    spills (BLOCK_N = 128 / 4 warps spills); 3xTF32 (fp32 caches) spills a little at any size, least with 8
    warps; decode (b = 1, broadcast-sum) BLOCK_N = 32 / 4 warps: 128 registers, no spills (64: 168, spills)."""
    block_q = min(triton.next_power_of_2(max(b, 1)), MAX_BLOCK_Q)
    use_dot = block_q >= 16
    block_half = max(16 if use_dot else 1, triton.next_power_of_2(half))
    if use_dot:
        block_n = 128 if lowp and N > 64 else 64
        num_warps, num_stages = 8, 3
        if not lowp and block_half >= 128:  # fp32 at d = 256: 3 stages of [64, d] keys + Q exceed 227 KiB
            block_n, num_stages = 32, 2
    else:  # broadcast product [BLOCK_N, BLOCK_HALF, BLOCK_Q] fp32 in registers: ~2K elements
        block_n = min(32, max(16, triton.next_power_of_2(N)), max(16, 2048 // (block_half * block_q)))
        num_warps, num_stages = 4, 1  # decode splits the heads over the grid: nothing to pipeline
    tiles = M * triton.cdiv(N, block_n)
    splits = 1
    while splits < H and tiles * splits < TARGET_PROGRAMS:
        splits *= 2
    heads_per_prog = triton.cdiv(H, min(splits, H))
    cfg = dict(BLOCK_Q=block_q, Q_TILES=triton.cdiv(b, block_q), BLOCK_HALF=block_half, BLOCK_N=block_n,
               USE_DOT=use_dot, num_warps=num_warps, num_stages=num_stages)
    return cfg, triton.cdiv(H, heads_per_prog), heads_per_prog


def representative_scores_triton(
    q_rot: torch.Tensor,  # [M, b, H, d] rotated queries of each query block
    q_valid: torch.Tensor,  # [M, b] bool
    k_flat: torch.Tensor,  # [S, Hkv, d] keys without RoPE
    page_table: torch.Tensor,  # [P] int
    page_size: int,
    reps: torch.Tensor,  # [M, N, H] int64 representative token of each chunk per head (any strides)
    chunk_lens: torch.Tensor,  # [M, N] int64, 0 = padding
    key_pos_base: torch.Tensor,  # [M, N] int64
    token_pos_group: int | None,
    rep_offset: int,
    cos: torch.Tensor,  # [P_rope, d/2] fp32
    sin: torch.Tensor,
    max_elements: int = 1 << 25,  # the reference's memory bound; unused
) -> torch.Tensor:
    """-> [M, N] fp32: max over heads and the block's valid queries of q . k_rep; -inf for padding chunks."""
    del max_elements
    M, b, H, d = q_rot.shape
    N = reps.shape[1]
    scores = torch.full((M, N), float("-inf"), dtype=torch.float32, device=q_rot.device)
    if N == 0 or M == 0:
        return scores
    Hkv = k_flat.shape[1]
    if H % Hkv or d % 2 or k_flat.shape[2] != d or cos.shape[-1] != d // 2 or sin.shape != cos.shape:
        raise ValueError(f"shape mismatch: q {tuple(q_rot.shape)}, k {tuple(k_flat.shape)}, cos {tuple(cos.shape)}")
    if reps.shape != (M, N, H) or chunk_lens.shape != (M, N) or key_pos_base.shape != (M, N):
        raise ValueError(f"reps {tuple(reps.shape)}, lens {tuple(chunk_lens.shape)}, base {tuple(key_pos_base.shape)}"
                         f" do not match M={M}, N={N}, H={H}")
    if token_pos_group is not None and token_pos_group <= 0:
        raise ValueError(f"token_pos_group must be positive, got {token_pos_group}")
    half = d // 2
    qv = q_valid.view(torch.uint8) if q_valid.dtype == torch.bool else q_valid
    cos, sin = cos.contiguous(), sin.contiguous()
    cfg, head_splits, heads_per_prog = _launch_config(M, N, H, b, half, k_flat.dtype in _OP_DTYPES)
    op_dtype = _OP_DTYPES.get(k_flat.dtype, tl.float32) if cfg["USE_DOT"] else tl.float32
    num_tiles = triton.cdiv(N, cfg["BLOCK_N"])
    _rep_scores_kernel[(M * head_splits * num_tiles,)](
        q_rot, qv, k_flat, page_table, reps, chunk_lens, key_pos_base, cos, sin, scores,
        N, H, b, H // Hkv, page_size, token_pos_group or 1, rep_offset, num_tiles, head_splits, heads_per_prog,
        *q_rot.stride(), *qv.stride(), *k_flat.stride(), cos.stride(0),
        *reps.stride(), *chunk_lens.stride(), *key_pos_base.stride(),
        HAS_POS_GROUP=token_pos_group is not None, HALF=half,
        DOT_PRECISION=FP32_DOT_PRECISION if op_dtype == tl.float32 else "tf32", OP_DTYPE=op_dtype, **cfg,
    )
    return scores

"""Triton paged dot-product kernel and head soft vote (same signature and output as `reference.py`).

Paper Sec. 4.3: the selection reads keys straight from the paged cache, never making them contiguous.

Pass 1, `_paged_logits_kernel`. Grid (candidate tiles x kv heads, rows), kv head fastest. A program takes
BLOCK_N consecutive candidates of row r and one kv head g: token -> slot (page_table[t // page_size] *
page_size + t % page_size) -> one [BLOCK_N, d] key tile, loaded once for the GROUP = H / Hkv query heads that
read kv head g (padded to 16 rows for tl.dot). It writes the logits sm_scale * q . k [GROUP, BLOCK_N] (fp32) and, per head,
the tile's max and sum of exp(logit - max): the softmax normaliser in streaming form, without a second read of
the keys. The [R, H, tiles] partials are merged in torch (log-sum-exp, tiny next to the logits).
Pass 2, `_soft_vote_kernel`. Grid (tiles, rows): vote[t] = sum_h exp(logit[h, t] - lse[h]), -inf past the
row's count. Reading the fp32 logits back (4 bytes per query head and token) is cheaper than re-reading the
keys (2 * d bytes per kv head and token for 16-bit caches).

Key traffic per scored row is one read of its candidates' keys, like a dense decode's K half. Rows are
launched in groups so the logits buffer stays under `max_logit_elements`. 16-bit caches dot in their own
dtype (the fp32 query rounded once) with fp32 accumulation; fp32 caches use IEEE fp32 dots.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

_OP_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
BLOCK_N = 64  # candidates per pass-1 program
VOTE_BLOCK_N = 256  # candidates per pass-2 program

fix_interpreter_if_active()


@triton.jit
def _paged_logits_kernel(
    Q, K, PageTables, Starts, Counts, Logits, TileMax, TileSum,
    H, kv_group, num_kv_heads, page_size, sm_scale, num_tiles,
    stride_qr, stride_qh, stride_ks, stride_kh, stride_pr, stride_lr, stride_lh,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_PAD: tl.constexpr,
    OP_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # the kv heads of one tile are neighbouring programs: they read the same slots' 2 KB rows close in time
    t = tl.program_id(0) // num_kv_heads
    g = tl.program_id(0) % num_kv_heads
    r = tl.program_id(1).to(tl.int64)
    count = tl.load(Counts + r)
    start = tl.load(Starts + r).to(tl.int64)

    offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < count
    tok = start + offs_n.to(tl.int64)
    page = tl.load(PageTables + r * stride_pr + tok // page_size, mask=n_ok, other=0).to(tl.int64)
    slot = page * page_size + tok % page_size
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    k = tl.load(K + slot[:, None] * stride_ks + g * stride_kh + offs_d[None, :], mask=n_ok[:, None] & d_ok[None, :],
                other=0.0)  # [BLOCK_N, BLOCK_D]

    offs_g = tl.arange(0, GROUP_PAD)
    g_ok = offs_g < kv_group
    h = g * kv_group + offs_g
    q = tl.load(Q + r * stride_qr + h[:, None] * stride_qh + offs_d[None, :], mask=g_ok[:, None] & d_ok[None, :],
                other=0.0)  # [GROUP_PAD, BLOCK_D]
    s = tl.dot(q.to(OP_DTYPE), tl.trans(k.to(OP_DTYPE)), input_precision=DOT_PRECISION) * sm_scale

    valid = g_ok[:, None] & n_ok[None, :]
    tl.store(Logits + r * stride_lr + h[:, None] * stride_lh + offs_n[None, :], s, mask=valid)
    s = tl.where(valid, s, float("-inf"))
    m = tl.max(s, axis=1)  # -inf for a tile past the row's count
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    l = tl.sum(tl.exp(s - m_safe[:, None]), axis=1)
    stat = (r * H + h) * num_tiles + t  # [R, H, tiles], contiguous
    tl.store(TileMax + stat, m, mask=g_ok)
    tl.store(TileSum + stat, l, mask=g_ok)


@triton.jit
def _soft_vote_kernel(Logits, Lse, Counts, Votes, H, width, stride_lr, stride_lh, stride_vr, BLOCK_N: tl.constexpr):
    t = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    count = tl.load(Counts + r)
    offs = t * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = offs < count
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for h in range(H):
        lse = tl.load(Lse + r * H + h)
        s = tl.load(Logits + r * stride_lr + h * stride_lh + offs, mask=ok, other=float("-inf"))
        acc += tl.exp(s - lse)
    tl.store(Votes + r * stride_vr + offs, tl.where(ok, acc, float("-inf")), mask=offs < width)


def _soft_vote_rows(q_rot, k_flat, page_tables, page_size, starts, counts, width, sm_scale, block_n: int = BLOCK_N,
                    num_warps: int = 4) -> torch.Tensor:
    R, H, d = q_rot.shape
    Hkv = k_flat.shape[1]
    group = H // Hkv
    num_tiles = triton.cdiv(width, block_n)
    device = q_rot.device
    logits = torch.empty((R, H, width), dtype=torch.float32, device=device)
    tile_max = torch.empty((R, H, num_tiles), dtype=torch.float32, device=device)
    tile_sum = torch.empty_like(tile_max)
    op_dtype = _OP_DTYPES.get(k_flat.dtype, tl.float32)
    _paged_logits_kernel[(num_tiles * Hkv, R)](
        q_rot, k_flat, page_tables, starts, counts, logits, tile_max, tile_sum,
        H, group, Hkv, page_size, sm_scale, num_tiles,
        q_rot.stride(0), q_rot.stride(1), k_flat.stride(0), k_flat.stride(1), page_tables.stride(0),
        logits.stride(0), logits.stride(1),
        D=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=block_n, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        OP_DTYPE=op_dtype, DOT_PRECISION="ieee" if op_dtype == tl.float32 else "tf32", num_warps=num_warps,
    )
    m = tile_max.amax(-1, keepdim=True)  # finite: every launched row has a candidate
    lse = (m + (tile_sum * torch.exp(tile_max - m)).sum(-1, keepdim=True).log()).squeeze(-1).contiguous()  # [R, H]
    votes = torch.empty((R, width), dtype=torch.float32, device=device)
    _soft_vote_kernel[(triton.cdiv(width, VOTE_BLOCK_N), R)](
        logits, lse, counts, votes, H, width, logits.stride(0), logits.stride(1), votes.stride(0), BLOCK_N=VOTE_BLOCK_N,
    )
    return votes


def soft_vote(
    q_rot: torch.Tensor,  # [R, H, d]
    k_flat: torch.Tensor,  # [S, Hkv, d]
    page_tables: torch.Tensor,  # [R, P] (a stride-0 expand of one table is fine)
    page_size: int,
    starts: torch.Tensor,  # [R] int64
    counts: torch.Tensor,  # [R] int64, each >= 1
    max_count: int,
    sm_scale: float,
    max_logit_elements: int = 1 << 28,  # fp32 logits buffer bound (1 GiB): rows are launched in groups
) -> torch.Tensor:
    """-> votes [R, max_count] fp32, -inf past each row's count (see reference.py)."""
    R, H, d = q_rot.shape
    if R == 0 or max_count == 0:
        return q_rot.new_full((R, max_count), float("-inf"), dtype=torch.float32)
    if H % k_flat.shape[1] or k_flat.shape[2] != d:
        raise ValueError(f"shape mismatch: q {tuple(q_rot.shape)}, k {tuple(k_flat.shape)}")
    if k_flat.stride(2) != 1 or q_rot.stride(2) != 1:
        raise ValueError("q_rot and k_flat need a contiguous head dimension")
    starts, counts = starts.to(torch.int64).contiguous(), counts.to(torch.int64).contiguous()
    rows = max(1, max_logit_elements // (H * max_count))
    parts = [
        _soft_vote_rows(q_rot[i : i + rows], k_flat, page_tables[i : i + rows], page_size, starts[i : i + rows],
                        counts[i : i + rows], max_count, sm_scale)
        for i in range(0, R, rows)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts)

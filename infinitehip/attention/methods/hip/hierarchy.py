"""HiP's hierarchical top-k estimation: which K key blocks each query block attends (HiP v1, Lee et al. 2024).

A query block's candidates are the keys [sink, end) (after the sinks, before its sliding window), cut into N key
blocks of `block_size` tokens (the last one may be shorter). The estimation splits the N blocks into 2K equal
segments (segment i: blocks [i * N // 2K, (i + 1) * N // 2K)), scores each by its center token, keeps the K best,
halves each kept segment (blocks [lo, mid) and [mid, hi), mid = (lo + hi) // 2) and repeats until every kept
segment is one key block: log2(N / K) rounds of 2K scores each. A segment of one block halves into itself and an
empty segment (never kept while K others exist), so a row whose segments are single blocks keeps them.

Center token of a segment over tokens [s, e): (s + e) // 2, at most e - 1. A segment's score: the largest dot product
of the center key with any query of the block and any head (queries and keys rotated at their original positions;
a GQA head reads its KV head): one selection per query block shared by all heads, as the block-sparse attention op
takes it (HiP selects per head). Ties keep the lower segment.

Two implementations with one signature: `select_blocks_reference`, the eager oracle (per row, every candidate
scored once, the hierarchy walked in Python), and `select_blocks`, the batched torch formulation (every row of a
level in a few GEMMs: CPU and GPU). Given `rounds` (`hierarchy_rounds` of the largest end the rows may have),
`select_blocks` runs that many score passes and reads nothing back to the host (decode, CUDA graphs): once a row's
kept segments are single blocks, a further pass keeps the same K blocks (their halves are themselves and empty
segments), so extra passes change nothing.

Oracle diagnostics (attention/common/needle_probe.py): `forced` tokens lift every segment holding one of them above
the others, so the hierarchy keeps their blocks (when they fit in K) whatever the center tokens score.
"""

from __future__ import annotations

from typing import Callable

import torch

from infinitehip.attention.common.needle_probe import FORCE_BONUS
from infinitehip.kv.paged_cache import token_slots
from infinitehip.model.rope import apply_rotary

SCORE_ELEMENTS = 1 << 26  # scores [rows, Hkv, b * g, 2K] materialised per pass of `select_blocks`


def _slots(page_table: torch.Tensor, tokens: torch.Tensor, page_size: int) -> torch.Tensor:
    """Cache slots of tokens [r, ...]: one page table [P] for every row, or one per row [r, P]."""
    if page_table.dim() == 1:
        return token_slots(page_table, tokens, page_size)
    tokens = tokens.long()
    pages = page_table.long().gather(1, (tokens // page_size).flatten(1)).view_as(tokens)
    return pages * page_size + tokens % page_size


def _rotated_keys(k_flat, page_table, page_size, tokens, cos, sin) -> torch.Tensor:
    """Keys of token positions `tokens` (any shape; [r, ...] with tables [r, P]) read through the page table,
    rotated there -> [..., Hkv, d] fp32."""
    k = k_flat[_slots(page_table, tokens, page_size)].float()
    return apply_rotary(k, cos[tokens].unsqueeze(-2), sin[tokens].unsqueeze(-2))


def _centers(lo: torch.Tensor, hi: torch.Tensor, sink: int, block_size: int, end: torch.Tensor) -> torch.Tensor:
    s = sink + lo * block_size
    e = torch.minimum(sink + hi * block_size, end)
    return torch.minimum((s + e) // 2, e - 1)


def _forced_rows(forced: torch.Tensor, M: int) -> torch.Tensor:
    """Forced tokens [n] (every row) or [M, n] (padding -1: never inside a segment) -> [M, n] sorted int64."""
    forced = forced.long()
    return (forced.expand(M, -1) if forced.dim() == 1 else forced).sort(dim=1).values.contiguous()


def _holds(forced: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, sink: int, block_size: int,
           end: torch.Tensor) -> torch.Tensor:
    """Whether segments lo/hi [M, S] (blocks) hold any of the rows' sorted forced tokens [M, n] -> [M, S] bool."""
    s = sink + lo * block_size
    e = torch.minimum(sink + hi * block_size, end)
    return torch.searchsorted(forced, e) > torch.searchsorted(forced, s)  # tokens in [s, e)


def num_blocks(ends: torch.Tensor, sink: int, block_size: int) -> torch.Tensor:
    """Candidate key blocks of each row: ceil((end - sink) / block_size)."""
    return (ends - sink + block_size - 1) // block_size


def hierarchy_rounds(max_end: int, sink: int, top_k_blocks: int, block_size: int) -> int:
    """Score passes that bring every row with candidates up to `max_end` down to single blocks: the first pass
    scores segments of at most ceil(N / 2K) blocks, each later one halves them (rounding up)."""
    n = max(2 * top_k_blocks, -(-(max_end - sink) // block_size))
    return 1 + (-(-n // (2 * top_k_blocks)) - 1).bit_length()


def select_blocks(q_rot: torch.Tensor, k_flat: torch.Tensor, page_table: torch.Tensor, page_size: int,
                  cos: torch.Tensor, sin: torch.Tensor, ends: torch.Tensor, sink: int, top_k_blocks: int,
                  block_size: int, reduce: Callable | None = None, rounds: int | None = None,
                  forced: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q_rot [M, b, H, d] rotated queries of M query blocks (a short block padded with copies of its queries: the
    max ignores them); page_table [P], or [M, P] one per row; ends [M] int64, each at least
    sink + 2 * top_k_blocks * block_size; reduce: combines the [M, 2K] scores over tensor-parallel ranks ("max"),
    None single-process; rounds: score passes (`hierarchy_rounds`; None: until every kept segment is one block,
    read back each pass); forced: oracle tokens [n] (every row) or [M, n] (padding -1), None normally.

    -> (starts [M, K] int64 first token of each selected block, ascending; lens [M, K] tokens of each)
    """
    M, b, H, d = q_rot.shape
    Hkv, K = k_flat.shape[1], top_k_blocks
    device = q_rot.device
    ends = ends.long().to(device)
    N = num_blocks(ends, sink, block_size)[:, None]  # [M, 1]
    idx = torch.arange(2 * K + 1, device=device)[None, :]
    bounds = idx * N // (2 * K)
    lo, hi = bounds[:, :-1], bounds[:, 1:]  # [M, 2K]
    q = q_rot.float().view(M, b, Hkv, H // Hkv, d).permute(0, 2, 1, 3, 4).reshape(M, Hkv, -1, d)
    rows = max(1, SCORE_ELEMENTS // max(1, H * b * 2 * K))
    forced = None if forced is None else _forced_rows(forced.to(device), M)
    passes = 0
    while True:
        centers = _centers(lo, hi, sink, block_size, ends[:, None])
        scores = torch.empty(M, 2 * K, device=device)
        for a in range(0, M, rows):
            z = min(a + rows, M)
            table = page_table if page_table.dim() == 1 else page_table[a:z]
            k = _rotated_keys(k_flat, table, page_size, centers[a:z].clamp(min=0), cos, sin)  # [r, 2K, Hkv, d]
            s = torch.matmul(q[a:z], k.permute(0, 2, 3, 1))  # [r, Hkv, b * g, 2K]
            scores[a:z] = s.amax(dim=(1, 2))
        if reduce is not None:
            scores = reduce(scores, "max")
        if forced is not None:
            scores = scores.masked_fill(_holds(forced, lo, hi, sink, block_size, ends[:, None]), FORCE_BONUS)
        scores = scores.masked_fill(hi <= lo, float("-inf"))
        # topk of (score, -index): ties keep the lower segment whatever the backend's topk order
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :K]
        lo, hi = lo.gather(1, order), hi.gather(1, order)
        passes += 1
        if (passes == rounds) if rounds is not None else bool(((hi - lo) <= 1).all()):
            break
        mid = (lo + hi) // 2
        lo, hi = torch.cat([lo, mid], 1), torch.cat([mid, hi], 1)
    lo = lo.sort(dim=1).values
    starts = sink + lo * block_size
    lens = torch.minimum(starts + block_size, ends[:, None]) - starts
    return starts, lens


def select_blocks_reference(q_rot: torch.Tensor, k_flat: torch.Tensor, page_table: torch.Tensor, page_size: int,
                            cos: torch.Tensor, sin: torch.Tensor, ends: torch.Tensor, sink: int, top_k_blocks: int,
                            block_size: int, reduce: Callable | None = None, rounds: int | None = None,
                            forced: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle of `select_blocks` (same arguments and result; rounds is not needed: it reads ends on the host):
    per row, every candidate's score, then the hierarchy over Python lists."""
    M, b, H, d = q_rot.shape
    Hkv, K = k_flat.shape[1], top_k_blocks
    g = H // Hkv
    forced_rows = None if forced is None else _forced_rows(forced, M).tolist()
    starts, lens = [], []
    for m in range(M):
        end = int(ends[m])
        tokens = torch.arange(sink, end, device=q_rot.device)
        table = page_table if page_table.dim() == 1 else page_table[m]
        k = _rotated_keys(k_flat, table, page_size, tokens, cos, sin).repeat_interleave(g, dim=1)  # [T, H, d]
        token_score = torch.einsum("bhd,thd->tbh", q_rot[m].float(), k).amax(dim=(1, 2))  # [T]
        if reduce is not None:
            token_score = reduce(token_score, "max")

        def score(lo: int, hi: int) -> float:
            if hi <= lo:
                return float("-inf")
            s, e = sink + lo * block_size, min(sink + hi * block_size, end)
            if forced_rows is not None and any(s <= t < e for t in forced_rows[m]):
                return FORCE_BONUS
            return float(token_score[min((s + e) // 2, e - 1) - sink])

        n = (end - sink + block_size - 1) // block_size
        segments = [(i * n // (2 * K), (i + 1) * n // (2 * K)) for i in range(2 * K)]
        while True:
            ranked = sorted(range(len(segments)), key=lambda i: (-score(*segments[i]), i))
            kept = [segments[i] for i in ranked[:K]]
            if all(hi - lo <= 1 for lo, hi in kept):
                break
            segments = [(lo, (lo + hi) // 2) for lo, hi in kept] + [((lo + hi) // 2, hi) for lo, hi in kept]
        first = sorted(sink + lo * block_size for lo, _ in kept)
        starts.append(first)
        lens.append([min(s + block_size, end) - s for s in first])
    as_tensor = lambda x: torch.tensor(x, dtype=torch.long, device=q_rot.device).view(M, K)
    return as_tensor(starts), as_tensor(lens)

"""One InfiniPot distillation step (paper Sec. 3.3.3, App. B): which slots each layer/KV head keeps, and
moving their k/v to the first cache slots.

Slots are described by `slot_tokens` [L, Hkv, S]: the sequence index of the token each layer/head holds
in each slot. Every row is strictly increasing (distillation keeps the original order and new tokens are
appended), so a token's slot in a row is found with searchsorted. After the first distillation the rows
differ (CaP picks per head); NuC is token-level, so it only picks tokens that every row still holds
(all tokens since the last distillation, the earlier NuC picks, and whatever every head's CaP kept).
"""

from __future__ import annotations

import torch

from infinitehip.kv.paged_cache import PagedKVCache


def tokens_in_every_row(slot_tokens: torch.Tensor) -> torch.Tensor:
    """slot_tokens [R..., S] (sorted rows) -> bool [S] over the first row's slots: is that token in every row."""
    rows = slot_tokens.reshape(-1, slot_tokens.shape[-1])
    first = rows[0].expand_as(rows).contiguous()
    at = torch.searchsorted(rows, first).clamp(max=rows.shape[1] - 1)
    return (rows.gather(1, at) == first).all(0)


def novelty_tokens(slot_tokens: torch.Tensor, slot_nll: torch.Tensor, nll_known: torch.Tensor, count: int) -> torch.Tensor:
    """NuC: the `count` highest-NLL tokens among those every layer/head holds -> sorted token indices [<= count].

    slot_tokens/slot_nll/nll_known [L, Hkv, S]; a token's NLL is the same in every row that holds it, so the
    first row's values are read. Tokens whose NLL is unknown (the first of each step) are not candidates.
    """
    candidate = tokens_in_every_row(slot_tokens) & nll_known[0, 0]
    tokens, nll = slot_tokens[0, 0][candidate], slot_nll[0, 0][candidate]
    picked = nll.topk(min(count, tokens.numel())).indices
    return tokens[picked].sort().values


def pool_scores(cap_scores: torch.Tensor, window: int) -> torch.Tensor:
    """Each slot's score [L, Hkv, S] -> the max over the `window` slots centred on it (odd window; 1 = unchanged)."""
    if window == 1:
        return cap_scores
    L, H, S = cap_scores.shape
    pooled = torch.nn.functional.max_pool1d(cap_scores.float().reshape(L * H, 1, S), window, stride=1,
                                            padding=window // 2)
    return pooled.reshape(L, H, S)


def select_slots(cap_scores: torch.Tensor, slot_tokens: torch.Tensor, novel: torch.Tensor, keep: int) -> torch.Tensor:
    """Slots [L, Hkv, keep] (ascending) each layer/KV head keeps: the NuC tokens `novel` [t] first (every row
    holds them), then the keep - t other slots with the highest catalyst scores cap_scores [L, Hkv, S]."""
    L, H, S = slot_tokens.shape
    if not novel.numel() <= keep <= S:
        raise ValueError(f"cannot keep {keep} of {S} slots with {novel.numel()} novelty tokens")
    novel_slots = torch.searchsorted(slot_tokens, novel.expand(L, H, -1).contiguous())  # [L, Hkv, t]
    taken = torch.zeros(L, H, S, dtype=torch.bool, device=slot_tokens.device).scatter_(2, novel_slots, True)
    rest = cap_scores.float().masked_fill(taken, float("-inf")).topk(keep - novel.numel(), dim=2).indices
    return torch.cat([novel_slots, rest], dim=2).sort(dim=2).values


def compact_cache(cache: PagedKVCache, page_table: torch.Tensor, keep: torch.Tensor) -> None:
    """Move each layer/head's kept slots keep [L, Hkv, C] (ascending, < S) to its slots 0..C-1, in order.

    Reads the S slots the indices point into before writing, so overlapping moves are safe.
    """
    L, H, C = keep.shape
    S = int(keep.max()) + 1
    slots = cache.slots(page_table, 0, S)
    for layer in range(L):
        k, v = cache.read(layer, slots)  # [S, Hkv, d]
        index = keep[layer].T[:, :, None].expand(C, H, k.shape[-1])  # [C, Hkv, d]: source slot per head
        cache.write(layer, slots[:C], k.gather(0, index), v.gather(0, index))

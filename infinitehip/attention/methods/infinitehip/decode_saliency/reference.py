"""Eager decode saliency update: the oracle of `triton.py`."""

from __future__ import annotations

import torch

from infinitehip.model.rope import apply_rotary


def add_decode_logits_reference(q: torch.Tensor, positions: torch.Tensor, key_pos: torch.Tensor, slots: torch.Tensor,
                                keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, total: torch.Tensor,
                                count: torch.Tensor, window: int) -> None:
    """Queries q [P, H, d] (pre-RoPE) at positions [P] (< 0: no query) and the union of their windows: keys [Wp, Hkv, d]
    (as cached, before RoPE) at key_pos [Wp] (consecutive, the last Wp positions up to the newest query; < 0: before
    the sequence) in flat cache slots [Wp]. Query p reaches key w when 0 <= positions[p] - key_pos[w] < window.
    Each query's own key is new: its sum total[slot] [H] fp32 and count[slot] restart from zero; then every reached
    key gets the sum of its reaching queries' logits (q_rot . k_rot per head, kv head h // group) and their number.
    cos / sin [N, d / 2]: RoPE tables covering the positions. The last row of total / count is scratch."""
    P, H, d = q.shape
    scratch = total.shape[0] - 1
    valid = positions >= 0
    dist = positions[:, None] - key_pos[None, :]  # [P, Wp]
    reach = (dist >= 0) & (dist < window) & valid[:, None] & (key_pos >= 0)[None, :]
    own = torch.where(valid, slots[(positions - key_pos[0]).clamp(min=0)], scratch)  # a query's own key is in the union
    total.index_fill_(0, own, 0)
    count.index_fill_(0, own, 0)
    at = key_pos.clamp(min=0)
    k = apply_rotary(keys.float(), cos[at][:, None], sin[at][:, None])  # [Wp, Hkv, d]
    mine = positions.clamp(min=0)
    q_rot = apply_rotary(q.float(), cos[mine][:, None], sin[mine][:, None])
    Hkv = k.shape[1]
    logits = torch.einsum("pkgd,wkd->pwkg", q_rot.view(P, Hkv, H // Hkv, d), k).reshape(P, -1, H)  # [P, Wp, H]
    logits = (logits * reach[..., None]).sum(0)  # [Wp, H]
    hits = reach.sum(0)  # [Wp]
    target = torch.where(hits > 0, slots, scratch)
    total.index_add_(0, target, logits)
    count.index_add_(0, target, hits.float())


def add_decode_logits_batched_reference(q: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None,
                                        key_pos: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor, cos: torch.Tensor,
                                        sin: torch.Tensor, total: torch.Tensor, count: torch.Tensor, window: int) -> None:
    """`add_decode_logits_reference` for each sequence g: queues q[rows[g]] [P, H, d], positions[rows[g]] [P]
    (rows None: row g), keys key_pos[g] / slots[g] [Wp], keys[g] [Wp, Hkv, d]."""
    if rows is not None:
        q, positions = q.index_select(0, rows), positions.index_select(0, rows)
    for g in range(keys.shape[0]):
        add_decode_logits_reference(q[g], positions[g], key_pos[g], slots[g], keys[g], cos, sin, total, count, window)

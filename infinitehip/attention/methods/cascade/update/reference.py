"""The cascade's cache update in eager PyTorch (the oracle of update/triton.py, and the CPU path)."""

from __future__ import annotations

import torch

from infinitehip.attention.methods.cascade.schedule import COMPARE, FILL, NONE, PASS


def cascade_update_reference(k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor, flat_slots: torch.Tensor,
                             ops: torch.Tensor, slots: torch.Tensor, first: int) -> None:
    """Push tokens first .. first + n - 1 (sequence slots) through the sub-caches, in place.

    k, v: [L, num_slots, Hkv, d] every layer's flat cache; scores: [L, Hkv, >= slots used] fp32 by sequence slot;
    flat_slots: [>= slots used] int64, sequence slot -> flat cache slot; ops, slots: [n, C] the plan
    (schedule.plan_pushes). A COMPARE keeps the carried token where its score is at least the newest's (case 4).
    """
    n, C = ops.shape
    L, _, Hkv, _ = k.shape
    used = max(first + n, int(slots.max()) + 1 if slots.numel() else 0)
    device = scores.device
    source = torch.arange(used, device=device).expand(L, Hkv, used).clone()  # whose k/v each slot ends with
    score = scores[..., :used].clone()
    ops_host, slots_host = ops.tolist(), slots.tolist()
    for j in range(n):
        carry = torch.full((L, Hkv), first + j, dtype=torch.long, device=device)
        carry_score = score[..., first + j].clone()
        for op, s in zip(ops_host[j], slots_host[j]):
            if op == NONE:
                break
            if op == COMPARE:
                wins = carry_score >= score[..., s]
                source[..., s] = torch.where(wins, carry, source[..., s])
                score[..., s] = torch.where(wins, carry_score, score[..., s])
                break
            held, held_score = source[..., s].clone(), score[..., s].clone()
            source[..., s], score[..., s] = carry, carry_score
            if op == FILL:
                break
            assert op == PASS
            carry, carry_score = held, held_score
    scores[..., :used] = score
    rows = flat_slots[:used]
    for cache in (k, v):
        seq = cache[:, rows].transpose(1, 2)  # [L, Hkv, used, d]
        moved = seq.gather(2, source[..., None].expand(-1, -1, -1, seq.shape[-1]))
        cache[:, rows] = moved.transpose(1, 2)

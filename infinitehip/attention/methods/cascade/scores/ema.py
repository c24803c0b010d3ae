"""The score EMA's factors shared by the CPU and Triton formulations of the cascade's attention with scores: a
query's weight in a chunk's update and the decay of a score that m of the chunk's queries see."""

from __future__ import annotations

import torch


def ema_factors(n: int, decay: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """-> weights [n] fp32, (1 - decay) * decay^(n - 1 - q) of query q's attention, and keep [n + 1] fp32, decay^m
    of a score that m of the chunk's queries see; in float64 first, as the reference."""
    powers = decay ** torch.arange(n + 1, device=device, dtype=torch.float64)
    return ((1 - decay) * powers[:n].flip(0)).float(), powers.float()


def visible_counts(n: int, num_keys: int, device: torch.device) -> torch.Tensor:
    """[num_keys] int64: queries of the chunk that see each key (all n for kept keys, n - j for its own j-th)."""
    counts = torch.full((num_keys,), n, dtype=torch.long, device=device)
    counts[num_keys - n :] = torch.arange(n, 0, -1, device=device)
    return counts

"""RoPE cos / sin tables for kernel tests, built independently of `infinitehip.model.rope` (float64, then fp32)."""

from __future__ import annotations

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def rope_tables(positions: int, d: int, theta: float = 10000.0, device: torch.device = DEVICE):
    """-> (cos, sin), each [positions, d / 2] fp32 on `device`."""
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.outer(torch.arange(positions, dtype=torch.float64), inv)
    return ang.cos().float().to(device), ang.sin().float().to(device)

"""Composing a sequence's page table with a bank: the tables existing kernels read instead of the paged cache.

The sparse-attention kernels read key `t` of a list through `page_table[t // page_size] * page_size +
t % page_size` into a flat [slots, Hkv, d] tensor. After a resolve, the bank index of each listed key is
known, so the decode kernels can read the bank unchanged with page_size 1, list tokens 0..K-1 and, as
each sequence's "page table", the bank indices of its listed keys (decode attends every listed key, so
the tokens are used only to find the rows; their RoPE positions are passed separately).
"""

from __future__ import annotations

import torch


def list_slots(page_tables: torch.Tensor, page_size: int, key_tokens: torch.Tensor, key_counts: torch.Tensor) -> torch.Tensor:
    """Store slots [B, K] of each sequence's listed keys; entries past key_counts are -1 (padding).

    page_tables [B, P] int, key_tokens [B, K] token positions, key_counts [B]."""
    tokens = key_tokens.long()
    listed = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < key_counts[:, None]
    tokens = torch.where(listed, tokens, 0)  # padding may hold any value; read page 0 and drop it below
    slots = page_tables.long().gather(1, tokens // page_size) * page_size + tokens % page_size
    return torch.where(listed, slots, -1)


def decode_tables(bank_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """bank_index [B, K] int32 from resolve -> (page_tables [B, K] int32, key_tokens [B, K] int32, page_size 1)
    for `sparse_attention_decode` over `bank.flat_k(layer)` / `bank.flat_v(layer)`."""
    B, K = bank_index.shape
    tokens = torch.arange(K, dtype=torch.int32, device=bank_index.device).expand(B, K).contiguous()
    return bank_index.to(torch.int32), tokens, 1

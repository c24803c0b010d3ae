"""Worst-case distinct slots one resolve call requests in InfiniteHiP decode, and the check that banks hold them.

A resolve call with more distinct slots than its bank holds cannot be served (there are fewer victims
than misses) and detecting it per call would need a host sync, so the bank sizes are checked against
the worst case once, from the method config, before decoding starts.

Per decoding sequence and layer (paper Alg. 4, `attention/methods/infinitehip/method.py`):
- mask bank, calls per pruning stage: the stage reads representative keys of its candidate chunks, per
  query head. Stage 0's candidates are all chunks of [sink, context - stream); stage i > 0 cuts the
  previous stage's kept tokens into chunk_sizes[i] chunks. Landmark representatives are one key per chunk
  and head (SelectRep bisection reads 1 + log2(chunk) keys per chunk and head), never more than the chunk.
  The candidates are scored in groups of mask_bank_tokens // (one chunk's keys) chunks, one resolve call
  per group (`offload_access.RepresentativeKeys`), so the smallest mask bank holds one chunk's keys (of
  the stage with the most); a bank of the largest stage's keys scores every stage in one group.
- attention bank, one call before block-sparse attention: sink + the last stage's kept tokens (the
  larger of keep_tokens[-1] and early_last_keep_tokens) + the stream window, which reaches back to the
  oldest cached stage's limit (up to max(refresh_intervals) further tokens). Never more than the context.
The attention call batches the decoding sequences: `num_seqs` of them request up to num_seqs times as many.
Mask calls are per sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.kv.offload.planner import CapacityError


@dataclass(frozen=True)
class BankRequests:
    mask_tokens: int  # smallest mask bank: one chunk's representative keys (of the stage with the most per chunk)
    attention_tokens: int  # most distinct slots one attention-bank resolve requests
    mask_stage: int  # the stage that needs mask_tokens
    mask_stage_tokens: int = 0  # a mask bank this large scores every stage in one group (the largest stage's keys)

    def describe(self) -> str:
        return (f"mask bank {self.mask_tokens:,} tokens (one chunk's representatives, pruning stage {self.mask_stage}; "
                f"{self.mask_stage_tokens:,} score every stage in one group), "
                f"attention bank {self.attention_tokens:,} tokens")


def _keys_per_chunk(method: InfiniteHiPConfig, chunk_size: int, num_heads: int) -> int:
    if method.representative == "landmark":
        per_head = 1
    else:
        per_head = 1 + math.ceil(math.log2(chunk_size))
    return min(chunk_size, num_heads * per_head)


def decode_bank_requests(method: InfiniteHiPConfig, context_tokens: int, num_heads: int, num_seqs: int = 1) -> BankRequests:
    """Smallest banks when decoding at up to `context_tokens` tokens: the worst case of one resolve call, the
    mask bank's calls being groups of one chunk at the least (a larger bank makes fewer, larger groups)."""
    for name, value in (("context_tokens", context_tokens), ("num_heads", num_heads), ("num_seqs", num_seqs)):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    candidates = max(0, context_tokens - method.sink_tokens - method.stream_tokens)
    per_chunk, stage_tokens = [], []
    for i, chunk in enumerate(method.chunk_sizes):
        pool = candidates if i == 0 else min(candidates, method.keep_tokens[i - 1])
        per_chunk.append(_keys_per_chunk(method, chunk, num_heads))
        stage_tokens.append(min(pool, -(-pool // chunk) * per_chunk[-1]))
    stage = max(range(len(per_chunk)), key=per_chunk.__getitem__)
    last_keep = max(method.keep_tokens[-1], method.early_last_keep_tokens if method.early_layers else 0)
    window = method.stream_tokens + max(method.refresh_intervals)
    attention = min(context_tokens, method.sink_tokens + min(candidates, last_keep) + window)
    return BankRequests(per_chunk[stage], attention * num_seqs, stage, max(stage_tokens))


def check_bank_requests(config: OffloadConfig, requests: BankRequests) -> None:
    """Refuse bank sizes smaller than the worst case of one resolve call (naming the field and both numbers)."""
    for field, need in (("mask_bank_tokens", requests.mask_tokens), ("attention_bank_tokens", requests.attention_tokens)):
        have = getattr(config, field)
        if need > have:
            raise CapacityError(
                f"{field}={have:,} is smaller than one resolve call may request ({need:,} distinct tokens: "
                f"{requests.describe()}); raise {field.replace('_', '-')} to at least {need:,}"
            )

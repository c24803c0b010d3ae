"""Launch-config sweep for TokenSelect's chunk prefill step at one context (GPU): the paged-logits kernel's
candidates per program and warps, and the sparse prefill kernel's query tile (BLOCK_Q) for a 512-query block.

    python bench/tokenselect_tune.py --context 1048576
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_latency import LLAMA3_8B_LAYER, Timer  # noqa: E402
from tokenselect_latency import build_cache  # noqa: E402

from infinitehip.attention.base import ForwardBatch, SequenceSlice  # noqa: E402
from infinitehip.attention.sparse import triton as sparse_triton  # noqa: E402
from infinitehip.attention.tokenselect import triton as ts_triton  # noqa: E402
from infinitehip.attention.tokenselect.method import TokenSelectAttention  # noqa: E402
from infinitehip.config.tokenselect import TokenSelectConfig  # noqa: E402
from infinitehip.model.rope import RotaryEmbedding  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=1 << 20)
    p.add_argument("--chunk-tokens", type=int, default=512)
    args = p.parse_args()
    mc, T, C, device = LLAMA3_8B_LAYER, args.context, args.chunk_tokens, torch.device("cuda")
    cache, page_table = build_cache(T, 64, torch.bfloat16, device, 0)
    rope = RotaryEmbedding(mc, 1 << 14, device)
    timer = Timer(device, warmup=3, min_reps=10, max_reps=40, budget_s=1.5)
    q = torch.randn(1, mc.num_heads, mc.head_dim, device=device, dtype=torch.float32)
    count = T - 640
    starts = torch.tensor([128], device=device)
    counts = torch.tensor([count], device=device)
    print(f"| paged logits + vote at {T:,}: BLOCK_N | warps | us |\n| ---: | ---: | ---: |")
    with torch.inference_mode():
        for block_n in (64, 128, 256):
            for warps in (4, 8):
                us = timer(lambda: ts_triton._soft_vote_rows(q, cache.flat_k(0), page_table[None], 64, starts, counts, count,
                                                             0.088, block_n=block_n, num_warps=warps))["ms"] * 1e3
                print(f"| {block_n} | {warps} | {us:,.0f} |", flush=True)
        method = TokenSelectAttention(mc, TokenSelectConfig(query_block_size=C))
        q_chunk = torch.randn(C, mc.num_heads, mc.head_dim, device=device, dtype=torch.bfloat16)
        seq = SequenceSlice(0, 0, C, T - C, T - C, page_table, cache, method.new_state(), True)
        step = lambda: method.prefill(0, q_chunk, seq, ForwardBatch([seq], cache, rope, C))  # noqa: E731
        default = sparse_triton.prefill_config
        print(f"\n| chunk prefill step at {T:,}: BLOCK_Q | programs | us |\n| ---: | ---: | ---: |")
        for block_q in (None, 64, 32, 16, 8):
            if block_q is not None:
                def config(half_pad, group_pad, query_block_size, block_q=block_q):
                    cfg = default(half_pad, group_pad, query_block_size)
                    m = block_q * group_pad
                    warps = 8 if m * 2 * half_pad >= 256 * 128 else 4
                    return dict(cfg, BLOCK_Q=block_q, num_warps=warps, BLOCK_N=64 if warps == 8 and half_pad <= 64 else 32)
                sparse_triton.prefill_config = config
            cfg = sparse_triton.prefill_config(64, 4, C)
            programs = -(-C // cfg["BLOCK_Q"]) * mc.num_kv_heads
            us = timer(step)["ms"] * 1e3
            print(f"| {'default ' + str(cfg['BLOCK_Q']) if block_q is None else block_q} | {programs} | {us:,.0f} |", flush=True)
            sparse_triton.prefill_config = default


if __name__ == "__main__":
    main()

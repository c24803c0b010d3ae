"""Where the time of one infinitehip decode step goes (GPU): kernels per refresh pattern, one Llama-3-8B layer.

For each refresh pattern of the preset, `InfiniteHiPAttention.decode` (the engine's sync-free step) runs under
torch.profiler; the table lists its kernels by total device time, their count, the summed kernel time, and the
step's CUDA-graph replay time (kernel time + the gaps between launches that a graph still has).

    python bench/decode_profile.py --context 1048576 --preset 3k-fast
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from attention_latency import LAYER, LLAMA3_8B_LAYER, Timer, time_graph  # noqa: E402

from infinitehip.attention.base import ForwardBatch, SequenceSlice  # noqa: E402
from infinitehip.attention.infinitehip.method import InfiniteHiPAttention  # noqa: E402
from infinitehip.config.infinitehip import PRESETS  # noqa: E402
from infinitehip.kv.paged_cache import PagedKVCache  # noqa: E402
from infinitehip.model.rope import RotaryEmbedding  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--context", type=int, default=1 << 20)
    p.add_argument("--preset", default="3k-fast")
    p.add_argument("--top", type=int, default=14)
    args = p.parse_args()
    device, dtype, mc = torch.device("cuda"), torch.bfloat16, LLAMA3_8B_LAYER
    T = args.context
    cache = PagedKVCache(1, T // 64, 64, mc.num_kv_heads, mc.head_dim, dtype, device)
    cache.k.normal_()
    cache.v.normal_()
    page_table = torch.arange(T // 64, dtype=torch.int32, device=device)
    rope = RotaryEmbedding(mc, T + 1, device)
    cfg = dataclasses.replace(PRESETS[args.preset], early_layers=0)
    method = InfiniteHiPAttention(mc, cfg)
    state = method.new_state()
    seq = SequenceSlice(0, 0, 1, T - 1, T - 1, page_table, cache, state, False)
    batch = ForwardBatch([seq], cache, rope, 1)
    q = torch.randn(1, mc.num_heads, mc.head_dim, device=device, dtype=dtype)
    with torch.inference_mode():
        method.saliency._buffers(LAYER, cache, mc.num_heads)[0].normal_()
        method.decode(LAYER, q, [seq], batch)
        timer = Timer(device, 2, 5, 50, 1.0)
        intervals = cfg.refresh_intervals
        patterns = {}
        for step in range(max(intervals)):
            patterns.setdefault(tuple(step % r == 0 for r in intervals), step)
        for pattern, step in patterns.items():
            def fn(step=step):
                state.decode_steps[LAYER] = step
                return method.decode(LAYER, q, [seq], batch)
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
            kernels = collections.defaultdict(lambda: [0.0, 0])
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    kernels[e.name][0] += e.device_time / 5
                    kernels[e.name][1] += 1 / 5
            total = sum(v[0] for v in kernels.values())
            graph = time_graph(timer, fn)
            print(f"\n### pattern {pattern} (stages refreshed), T = {T:,}: {sum(v[1] for v in kernels.values()):.0f} kernels, "
                  f"kernel time {total:.1f} us, graph replay {graph['ms'] * 1e3:.1f} us\n")
            print("| kernel | us | count |\n| --- | ---: | ---: |")
            for name, (us, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[: args.top]:
                print(f"| {name[:90]} | {us:.1f} | {n:.0f} |")


if __name__ == "__main__":
    main()

"""Latency of the chunk-list join (attention/chunk_merge) on its decode shapes, replayed in a CUDA graph.

At every last-stage refresh infinitehip's default joins the last stage's chunks (keep / chunk: 2048 / 16 = 128,
or 4096 / 16 in early layers) with the question's (question_keep_tokens / chunk: 128), one row per sequence.
Reports the graph-replay time of the Triton kernel and of the eager reference (its argsort) per shape, median of
--reps replays of a graph holding --inner calls, as JSON with the device and versions.

    python bench/chunk_merge_latency.py --output chunk_merge_latency.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess

import torch
import triton

from infinitehip.attention.chunk_merge import merge_chunks


def chunk_lists(rows: int, width: int, extra: int, grid: int, device: str) -> tuple[torch.Tensor, ...]:
    """Random distinct chunk starts on a grid of `grid` tokens; a few empties and shared starts, as in decode."""
    g = torch.Generator().manual_seed(0)
    pool = torch.randperm(1 << 16, generator=g)[: width + extra].sort().values * grid
    starts = pool[:width][torch.randperm(width, generator=g)].expand(rows, -1).contiguous()
    extra_starts = torch.cat([pool[width:], pool[: extra // 8]])[:extra].expand(rows, -1).contiguous()
    lens = torch.full_like(starts, grid)
    lens[:, -4:] = 0
    extra_lens = torch.full_like(extra_starts, grid)
    return tuple(t.to(device) for t in (starts, lens, extra_starts, extra_lens))


def graph_time_us(fn, inner: int, reps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / inner)
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["1x128x128", "1x256x128", "4x128x128"],
                   help="ROWSxCHUNKSxEXTRA: sequences, last-stage chunks, question chunks")
    p.add_argument("--inner", type=int, default=50, help="calls captured in one graph")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    results = []
    for shape in args.shapes:
        rows, width, extra = (int(x) for x in shape.split("x"))
        lists = chunk_lists(rows, width, extra, 16, "cuda")
        ref = merge_chunks(*lists, impl="reference")
        out = merge_chunks(*lists, impl="triton")
        exact = all(torch.equal(a, b) for a, b in zip(ref, out))
        row = {"shape": shape, "equal_to_reference": exact,
               "triton_us": graph_time_us(lambda: merge_chunks(*lists, impl="triton"), args.inner, args.reps),
               "reference_us": graph_time_us(lambda: merge_chunks(*lists, impl="reference"), args.inner, args.reps)}
        print(json.dumps(row), flush=True)
        results.append(row)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "git_commit": commit, "args": vars(args)}
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()

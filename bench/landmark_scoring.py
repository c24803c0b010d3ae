"""Landmark-mode pruning ops, reference vs Triton: representatives (dedupe + most salient token per chunk) and
representative chunk scores, at each stage's shapes, prefill and decode.

Llama-3-8B layer shapes (32 q / 8 kv heads, d 128, bf16, page size 64), the 3k preset's stages (query block 64,
chunks 256 / 32 / 8, keep 32K / 8K / 2K, sink 256, stream 1024) and a late layer's RoPE style (relative; --style
chunk_indexed for an early layer). Prefill = the last --chunk queries at context T (M = chunk / 64 blocks);
decode = one query (M = 1, b = 1). Stage 1's candidates are every chunk of [sink, limit) (all blocks share
them); stages 2 and 3 subdivide a random choice of the previous stage's keep per block (what the kernels see
after a real top-k). Saliency buffers are random (the cost does not depend on the values).

Timing: CUDA events after a device sync, warm-up first, median of --reps (the reference: --ref-reps, and skipped
above --ref-max-context). Each Triton result is checked against the reference where that ran (max |diff| of the
scores; representatives must be equal). The table is printed last.

    python bench/landmark_scoring.py                         # GPU, 128K..1M
    python bench/landmark_scoring.py --contexts 1048576 --ref-max-context 0
    python bench/landmark_scoring.py --smoke                 # CPU, Triton interpreter, tiny shapes
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

SMOKE = "--smoke" in sys.argv
if SMOKE and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

from infinitehip.attention.infinitehip.positions import scoring_positions  # noqa: E402
from infinitehip.attention.infinitehip.pruning import StageOutput, initial_chunks, query_blocks, sparse_limit, subdivide  # noqa: E402
from infinitehip.attention.infinitehip.saliency import KeySaliency  # noqa: E402
from infinitehip.attention.infinitehip.scoring import representative_scores  # noqa: E402
from infinitehip.model.rope import apply_rotary  # noqa: E402

FULL = dict(heads=32, kv_heads=8, d=128, page_size=64, block=64, sink=256, stream=1024, chunk_sizes=(256, 32, 8),
            keep=(32768, 8192, 2048), contexts=[131072, 262144, 524288, 1048576], chunk=32768)
TINY = dict(heads=4, kv_heads=2, d=32, page_size=16, block=16, sink=16, stream=64, chunk_sizes=(64, 16, 4),
            keep=(512, 128, 32), contexts=[2048], chunk=128)


def rope_tables(n: int, d: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / 500000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.outer(torch.arange(n, dtype=torch.float64), inv)
    return ang.cos().float().to(device), ang.sin().float().to(device)


def timed(fn, reps: int, cuda: bool) -> float:
    """Median ms of fn() over reps calls after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def stage_inputs(cfg: dict, T: int, q: torch.Tensor, start: int, style: str, gen: torch.Generator):
    """Per stage: (blocks, starts, lens, positions) as run_stage would see them."""
    size = cfg["block"] if q.shape[0] > 1 else 1
    blocks = query_blocks(q, start, size)
    limit = sparse_limit(blocks.last_position, cfg["sink"], cfg["stream"])
    out, parent = [], None
    for i, cs in enumerate(cfg["chunk_sizes"]):
        if parent is None:
            starts, lens = initial_chunks(limit, cfg["sink"], cs)
        else:
            starts, lens = subdivide(parent, cs, limit)
        pos = scoring_positions(style, blocks.positions, lens, cfg["stream"], T, 8192)
        out.append((blocks, starts, lens, pos))
        keep = cfg["keep"][i] // cs  # a random top-k stands in for the real one
        real = (lens > 0).float() + torch.rand(lens.shape, generator=gen, device=lens.device)
        idx = real.topk(min(keep, lens.shape[1]), dim=1).indices.sort(dim=1).values
        parent = StageOutput(starts.gather(1, idx), lens.gather(1, idx), cs, size, limit)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (Triton interpreter)")
    p.add_argument("--contexts", type=int, nargs="+", default=None)
    p.add_argument("--chunk", type=int, default=None, help="prefill queries")
    p.add_argument("--style", default="relative", choices=["relative", "chunk_indexed", "dynamic", "infllm", "none"])
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--ref-reps", type=int, default=1)
    p.add_argument("--ref-max-context", type=int, default=1 << 20, help="skip the reference above this context")
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    cfg = dict(TINY if args.smoke else FULL)
    cuda = torch.cuda.is_available() and not (args.smoke and not torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    contexts = args.contexts or cfg["contexts"]
    C = args.chunk or cfg["chunk"]
    reps = args.reps or (10 if cuda else 1)
    H, Hkv, d, ps = cfg["heads"], cfg["kv_heads"], cfg["d"], cfg["page_size"]
    print(f"device {torch.cuda.get_device_name() if cuda else 'cpu (Triton interpreter)'}, {dtype}, {H}/{Hkv} heads, "
          f"d {d}, style {args.style}, prefill chunk {C}", flush=True)
    rows = []
    for T in contexts:
        gen = torch.Generator(device=device).manual_seed(args.seed + T)
        n_pages = -(-T // ps)
        page_table = torch.randperm(n_pages, generator=torch.Generator().manual_seed(args.seed)).int().to(device)
        k_flat = torch.randn(n_pages * ps, Hkv, d, generator=gen, device=device, dtype=dtype)
        store = KeySaliency(window=512)
        store._sum[0] = torch.rand(n_pages * ps, H, generator=gen, device=device)
        store._count[0] = torch.randint(1, 512, (n_pages * ps,), generator=gen, device=device).float()
        cos, sin = rope_tables(T + 2, d, device)
        modes = [("prefill", torch.randn(C, H, d, generator=gen, device=device, dtype=dtype), T - C)]
        if not args.skip_decode:
            modes.append(("decode", torch.randn(1, H, d, generator=gen, device=device, dtype=dtype), T - 1))
        for mode, q, start in modes:
            for i, (blocks, starts, lens, pos) in enumerate(stage_inputs(cfg, T, q, start, args.style, gen)):
                q_rot = apply_rotary(blocks.q, cos[pos.query_pos][:, :, None], sin[pos.query_pos][:, :, None])
                cs = cfg["chunk_sizes"][i]

                def run(impl: str):
                    r = store.representatives(0, starts, lens, page_table, ps, cs, impl=impl)
                    s = representative_scores(q_rot, blocks.valid, k_flat, page_table, ps, r, lens, pos.key_pos_base,
                                              pos.token_pos_group, pos.rep_offset, cos, sin, impl=impl)
                    return r, s

                r_tri = store.representatives(0, starts, lens, page_table, ps, cs, impl="triton")
                t = {
                    "reps": timed(lambda: store.representatives(0, starts, lens, page_table, ps, cs, impl="triton"), reps, cuda),
                    "scores": timed(lambda: representative_scores(q_rot, blocks.valid, k_flat, page_table, ps, r_tri, lens,
                                                                  pos.key_pos_base, pos.token_pos_group, pos.rep_offset,
                                                                  cos, sin, impl="triton"), reps, cuda),
                }
                t["both"] = timed(lambda: run("triton"), reps, cuda)
                ref, check = None, "-"
                if T <= args.ref_max_context:
                    ref = timed(lambda: run("reference"), args.ref_reps, cuda)
                    (r1, s1), (r2, s2) = run("reference"), run("triton")
                    fin = torch.isfinite(s1)
                    same_inf = torch.equal(fin, torch.isfinite(s2))
                    diff = (s1[fin] - s2[fin]).abs().max().item() if fin.any() else 0.0
                    check = f"reps {'equal' if torch.equal(r1, r2) else 'DIFFER'}, max|ds| {diff:.3g}" + ("" if same_inf else ", -inf DIFFER")
                row = dict(T=T, mode=mode, stage=i + 1, M=int(starts.shape[0]), N=int(starts.shape[1]), ref=ref, **t, check=check)
                rows.append(row)
                print(row, flush=True)
        k_flat = store = None  # free before the next context
        if cuda:
            torch.cuda.empty_cache()

    fmt = lambda x: "n/a" if x is None else (f"{x:,.0f}" if x >= 1000 else f"{x:.3f}")  # noqa: E731
    print("\n| T | mode | stage | M x N | reference ms | triton reps ms | triton scores ms | triton total ms | speedup | check |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        sp = f"{r['ref'] / r['both']:.1f}x" if r["ref"] else "n/a"
        print(f"| {r['T']:,} | {r['mode']} | {r['stage']} | {r['M']} x {r['N']} | {fmt(r['ref'])} | {fmt(r['reps'])} | "
              f"{fmt(r['scores'])} | {fmt(r['both'])} | {sp} | {r['check']} |")


if __name__ == "__main__":
    main()

"""A decode op alone, one layer, against the bytes it must read: the dense paged decode
(attention/methods/dense/paged_decode/, `--op paged`) or the sparse decode over key lists (attention/ops/sparse/,
`--op sparse`, what infinitehip, tokenselect and hip decode through).

B sequences of T cached tokens each (Llama-3-8B's attention shape by default: 32 query / 8 KV heads, d 128, bf16,
pages of 64 in shuffled order), one query token each; the sparse op lists `--keys` of each sequence's tokens (random
64-token chunks in order, as a pruned decode's last stage lists them) and reads only those. Every launch variant
(keys a tile, warps, pipeline stages, the fused merge), rope-table dtype and `--splits` count is timed as a
CUDA-graph replay with a cold L2 (median); the bound is the K and V bytes the op reads at the device-to-device copy
bandwidth measured in the same run; each variant's output is compared with the default launch's (max abs
difference) and, for the smallest cell, with the eager reference.

    python -m bench paged-decode --contexts 32768 131072 --batch-sizes 1 8
    python -m bench paged-decode --launches 64:4:2 32:4:3 --tables fp32 fp16
    python -m bench paged-decode --op sparse --contexts 32768 --keys 3072 --batch-sizes 1 8
    python -m bench paged-decode --smoke        # CPU, Triton interpreter, a tiny shape
"""

from __future__ import annotations

import torch

from bench.common.cli import add_smoke_flag
from bench.common.timing import Timer, log, time_graph
from infinitehip.cli.options import parse_int

PAGE = 64
DEFAULT_LAUNCHES = ["default", "32:4:2", "64:4:3", "64:8:2", "64:8:3", "128:8:2", "128:8:3", "32:2:3"]


def parse_launch(text: str):
    """'default', 'fused' (the default tiles, merged by the last split), or BLOCK_N:WARPS:STAGES[:fused]."""
    from infinitehip.attention.ops.sparse.launch import DecodeLaunch

    if text in ("default", "fused"):
        return DecodeLaunch(fused_merge=text == "fused" or None)
    parts = text.split(":")
    fused = len(parts) == 4 and parts[3] == "fused"
    try:
        if len(parts) != 3 + fused:
            raise ValueError
        block_n, warps, stages = (int(x) for x in parts[:3])
    except ValueError:
        raise SystemExit(f"--launches: BLOCK_N:WARPS:STAGES[:fused], 'default' or 'fused' expected, "
                         f"got {text!r}") from None
    return DecodeLaunch(block_n=block_n, num_warps=warps, num_stages=stages, fused_merge=fused or None)


def rope_tables(positions: int, d: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [positions, d/2] fp32, rotate-half RoPE at base theta."""
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)
    angles = torch.arange(positions, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def build_cell(B: int, T: int, H: int, Hkv: int, d: int, dtype: torch.dtype, device: torch.device, seed: int):
    """Random pages for B sequences of T tokens (each sequence's pages shuffled over the pool), q, tables, lengths."""
    g = torch.Generator(device=device).manual_seed(seed)
    pages_per_seq = -(-T // PAGE)
    num_pages = B * pages_per_seq
    k = torch.randn(num_pages, PAGE, Hkv, d, generator=g, device=device, dtype=dtype)
    v = torch.randn(num_pages, PAGE, Hkv, d, generator=g, device=device, dtype=dtype)
    order = torch.randperm(num_pages, generator=g, device=device).to(torch.int32)
    tables = order.view(B, pages_per_seq).contiguous()
    q = torch.randn(B, H, d, generator=g, device=device, dtype=dtype)
    lengths = torch.full((B,), T, dtype=torch.int32, device=device)
    return q, k, v, tables, lengths


def listed_keys(B: int, T: int, K: int, device: torch.device, seed: int) -> torch.Tensor:
    """[B, K] int32: each sequence's K listed tokens, random 64-token chunks of its T in order (K <= T)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    chunks = K // PAGE
    rows = [torch.randperm(T // PAGE, generator=g)[:chunks].sort().values for _ in range(B)]
    starts = torch.stack(rows) * PAGE  # [B, chunks]
    return (starts[:, :, None] + torch.arange(PAGE)).view(B, chunks * PAGE).to(device, torch.int32)


def op_cell(B: int, T: int, args, device: torch.device, dtype: torch.dtype):
    """(the op as fn(cos, sin, launch, splits=None), its eager reference as ref(cos, sin), the K/V bytes it reads,
    the rope positions its tables need)."""
    q, k, v, tables, lengths = build_cell(B, T, args.heads, args.kv_heads, args.head_dim, dtype, device, seed=B + T)
    if args.op == "paged":
        from infinitehip.attention.methods.dense.paged_decode.reference import paged_decode_reference
        from infinitehip.attention.methods.dense.paged_decode.triton import paged_decode_triton

        def fn(cos, sin, launch, splits=None):
            return paged_decode_triton(q, k, v, tables, lengths, cos, sin, launch=launch, num_splits=splits)

        def ref(cos, sin):
            return paged_decode_reference(q, k, v, tables, lengths, cos, sin)

        return fn, ref, 2 * B * T * args.kv_heads * args.head_dim * k.element_size(), T
    from infinitehip.attention.ops.sparse import reference as sparse_reference
    from infinitehip.attention.ops.sparse import triton as sparse_triton

    K = min(args.keys, T) // PAGE * PAGE
    key_tokens = listed_keys(B, T, K, device, seed=B + T)
    counts = torch.full((B,), K, dtype=torch.int32, device=device)
    key_rope = torch.arange(K, dtype=torch.int32, device=device).expand(B, K).contiguous()
    query_rope = counts.clone()  # the query after its listed keys (streaming-style positions)
    flat_k, flat_v = (x.view(-1, *x.shape[2:]) for x in (k, v))
    common = (q, flat_k, flat_v, tables, PAGE, key_tokens, counts, key_rope, query_rope)

    def fn(cos, sin, launch, splits=None):
        return sparse_triton.sparse_attention_decode(*common, cos, sin, args.head_dim ** -0.5, num_splits=splits,
                                                     launch=launch)

    def ref(cos, sin):
        return sparse_reference.sparse_attention_decode(*common, cos, sin, args.head_dim ** -0.5)

    return fn, ref, 2 * B * K * args.kv_heads * args.head_dim * k.element_size(), K + 1


def run_cell(B: int, T: int, args, device: torch.device, dtype: torch.dtype, bandwidth: float | None,
             timer: Timer) -> list[dict]:
    op, ref, kv_bytes, positions = op_cell(B, T, args, device, dtype)
    cos32, sin32 = rope_tables(positions, args.head_dim, 500000.0, device)
    base = op(cos32, sin32, None).float()  # the op's defaults over fp32 tables
    ref_err = None
    if B * T <= args.reference_tokens:
        ref_err = (base - ref(cos32, sin32).float()).abs().max().item()
    # every launch at the op's own split count, then (the last table dtype, the default launch) every --splits
    variants = [(table, text, None) for table in args.tables for text in args.launches]
    variants += [(args.tables[-1], "default", n) for n in args.splits]
    rows = []
    for table, text, splits in variants:
        cos, sin = (cos32, sin32) if table == "fp32" else (cos32.half(), sin32.half())
        launch = parse_launch(text)

        def fn(cos=cos, sin=sin, launch=launch, splits=splits):
            return op(cos, sin, launch, splits)

        name = text if splits is None else f"{text}, {splits} splits"
        try:
            diff = (fn().float() - base).abs().max().item()
            ms = time_graph(timer, fn)["ms"] if device.type == "cuda" else timer(fn)["ms"]
        except Exception as exc:  # noqa: BLE001 - a launch that does not compile (registers) is a row, not the end
            log(f"  B={B} T={T} {table} {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            rows.append(dict(op=args.op, batch=B, context=T, tables=table, launch=text, splits=splits,
                             error=type(exc).__name__))
            continue
        row = dict(op=args.op, batch=B, context=T, tables=table, launch=text, splits=splits, us=ms * 1e3,
                   kv_bytes=kv_bytes, gb_s=kv_bytes / (ms / 1e3) / 1e9, max_diff_vs_default=diff,
                   reference_max_diff=ref_err)
        if bandwidth:
            row["bound_us"] = kv_bytes / bandwidth * 1e6
            row["fraction_of_bound"] = row["bound_us"] / row["us"]
        log(f"  B={B:>2} T={T:>7} {table} {name:>16}: {row['us']:8.1f} us {row['gb_s']:7.0f} GB/s"
            + (f" ({row['fraction_of_bound']:.0%} of the copy bandwidth)" if bandwidth else "")
            + f" diff {diff:.2e}")
        rows.append(row)
    return rows


def add_arguments(parser) -> None:
    parser.add_argument("--op", choices=("paged", "sparse"), default="paged",
                        help="paged: the dense paged decode over every cached token; sparse: the decode over key lists")
    parser.add_argument("--keys", type=parse_int, default=3072,
                        help="--op sparse: listed keys a sequence (64-token chunks; a 32K default decode lists ~3K)")
    parser.add_argument("--contexts", type=parse_int, nargs="+", default=[32768, 131072], help="cached tokens a sequence")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8], help="sequences, one query token each")
    parser.add_argument("--launches", nargs="+", default=DEFAULT_LAUNCHES,
                        help="BLOCK_N:WARPS:STAGES[:fused] launch variants ('default': the op's own; 'fused' or a "
                             "':fused' suffix: the last split merges, no merge kernel)")
    parser.add_argument("--splits", type=int, nargs="*", default=[],
                        help="also time the default launch over the last --tables dtype at these split counts")
    parser.add_argument("--tables", nargs="+", default=["fp32", "fp16"], choices=("fp32", "fp16"),
                        help="dtype of the rope cos/sin tables the kernel reads beside each key")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--reference-tokens", type=parse_int, default=32768,
                        help="compare with the eager reference where B x T is at most this")
    add_smoke_flag(parser, "a tiny shape on the CPU, the kernels in the Triton interpreter")


def run(args, out) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if args.smoke:
        args.contexts, args.batch_sizes, args.heads, args.kv_heads, args.head_dim = [200], [1, 2], 4, 2, 16
        args.keys = 128
        args.launches = ["default", "32:4:2:fused"]
    if device.type == "cpu":
        out.meta["device"] = "cpu"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    bandwidth = None
    if device.type == "cuda":
        from bench.suites.decode import hbm_bandwidth

        bandwidth = hbm_bandwidth()
        log(f"device-to-device copy: {bandwidth / 1e9:.0f} GB/s")
    timer = Timer(device, warmup=3, min_reps=10, max_reps=200, budget_s=0.5 if device.type == "cuda" else 0.0)
    body = dict(op=args.op, keys=args.keys if args.op == "sparse" else None, bandwidth_bytes_s=bandwidth, rows=[],
                shape=dict(heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim, page_size=PAGE))
    for T in args.contexts:
        for B in args.batch_sizes:
            body["rows"] += run_cell(B, T, args, device, dtype, bandwidth, timer)
            out.write(body)  # rewritten after every cell
    return body

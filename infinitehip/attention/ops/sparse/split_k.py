"""Split-K (flash-decoding) partials and their merge, shared by the decode kernels that split a query's keys over
programs (this package's sparse decode, dense's paged decode): each split writes its normalized partial output and
its log2-sum-exp, and one program per (sequence, head) row merges them; or (a fused merge, `merge_if_last_split`)
the last split program of each (sequence, kv head) to finish merges its rows itself, saving the merge's launch.

`dot_precision` is the dots' precision of these kernels: IEEE fp32 for fp32 inputs (so they match the fp32 oracles),
tensor cores of the input dtype otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def _merged_row(PartOut, PartLse, base, num_splits, D: tl.constexpr, D_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr):
    """The merge of one (sequence, head) row's split partials (rows base .. base + num_splits - 1) -> [D_PAD] fp32.
    `.cg` loads (L2): in a fused merge other programs wrote them, never this SM's L1."""
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, D_PAD)
    s_ok = offs_s < num_splits
    lse = tl.load(PartLse + base + offs_s, mask=s_ok, other=float("-inf"), cache_modifier=".cg")
    part = tl.load(PartOut + (base + offs_s)[:, None] * D + offs_d[None, :],
                   mask=s_ok[:, None] & (offs_d[None, :] < D), other=0.0, cache_modifier=".cg")
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    denom = tl.sum(w, 0)
    return tl.sum(w[:, None] * part, 0) / tl.where(denom > 0.0, denom, 1.0)


@triton.jit
def combine_splits_kernel(
    PartOut, PartLse, Out, num_heads, num_splits, stride_ob, stride_oh,
    D: tl.constexpr, D_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    row = tl.program_id(0)  # b * num_heads + h
    b = row // num_heads
    h = row % num_heads
    offs_d = tl.arange(0, D_PAD)
    out = _merged_row(PartOut, PartLse, row.to(tl.int64) * num_splits, num_splits, D, D_PAD, SPLITS_PAD)
    tl.store(Out + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d, out.to(Out.dtype.element_ty),
             mask=offs_d < D)


@triton.jit
def merge_if_last_split(
    PartOut, PartLse, Out, Counters, b, hkv, num_heads, num_splits, stride_ob, stride_oh,
    GROUP: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    """Called by every split program of a decode kernel's (sequence b, kv head hkv) after it stored its partials (grid
    (B, Hkv, num_splits)): the last of them to finish merges the GROUP heads' rows into Out and zeroes the pair's
    counter for the next launch (the merge kernel's work without its launch). Counters: `split_counters`."""
    tl.debug_barrier()  # every thread's partial stored before the program counts itself done (the release below)
    pair = b * tl.num_programs(1) + hkv
    done = tl.atomic_add(Counters + pair, 1, sem="acq_rel")
    if done == num_splits - 1:
        tl.debug_barrier()  # the acquire before any thread's loads of the others' partials
        offs_d = tl.arange(0, D_PAD)
        for g in tl.static_range(GROUP):
            h = hkv * GROUP + g
            out = _merged_row(PartOut, PartLse, (b * num_heads + h).to(tl.int64) * num_splits, num_splits, D, D_PAD,
                              SPLITS_PAD)
            tl.store(Out + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d, out.to(Out.dtype.element_ty),
                     mask=offs_d < D)
        tl.store(Counters + pair, 0)


_COUNTERS: dict[torch.device, torch.Tensor] = {}
MAX_SPLIT_PAIRS = 1 << 16  # (sequence, kv head) pairs of one fused-merge launch


def split_counters(device: torch.device, pairs: int) -> torch.Tensor:
    """The fused merge's per-(sequence, kv head) counters on `device`: one zeroed int32 buffer, allocated once and
    never replaced (CUDA graphs hold its address; every launch leaves it zeroed), so launches on one stream share it."""
    if pairs > MAX_SPLIT_PAIRS:
        raise ValueError(f"a fused split merge takes at most {MAX_SPLIT_PAIRS} (sequence, kv head) pairs, got {pairs}")
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(MAX_SPLIT_PAIRS, dtype=torch.int32, device=device)
    return _COUNTERS[device]


def rope_table_dtype(cos: torch.Tensor) -> torch.dtype:
    """The dtype a decode kernel reads its RoPE tables in: fp16 where given (16-bit caches,
    `RotaryEmbedding.decode_tables`), else fp32."""
    return torch.float16 if cos.dtype == torch.float16 else torch.float32


def dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # tf32 is ignored for 16-bit inputs


@dataclass
class SplitLaunch:
    """The buffers and switches of one split-K decode launch over `out` [B, H, d] (grid (B, Hkv, num_splits)):
    partial outputs [B, H, num_splits, d] and log2-sum-exps [B, H, num_splits] (fp32; with one split the kernel writes
    `out` itself and both are `out`, unused), the fused merge's counters (else the lse buffer, unused), and the
    kernels' SPLIT / FUSED_MERGE / SPLITS_PAD constexprs."""

    part_out: torch.Tensor
    part_lse: torch.Tensor
    counters: torch.Tensor
    split: bool
    fused: bool
    splits_pad: int

    def finish(self, out: torch.Tensor) -> None:
        """After the kernel: the merge kernel where the splits did not merge themselves."""
        if self.split and not self.fused:
            merge_splits(self.part_out, self.part_lse, out)


def split_launch(out: torch.Tensor, num_kv_heads: int, num_splits: int, fused_merge: bool | None) -> SplitLaunch:
    """`SplitLaunch` of a decode over `out` [B, H, d] split num_splits ways (fused_merge: `DecodeLaunch`'s)."""
    B, H, d = out.shape
    split = num_splits > 1
    fused = split and bool(fused_merge)
    if split:
        part_out = torch.empty(B, H, num_splits, d, dtype=torch.float32, device=out.device)
        part_lse = torch.empty(B, H, num_splits, dtype=torch.float32, device=out.device)
    else:
        part_out = part_lse = out
    counters = split_counters(out.device, B * num_kv_heads) if fused else part_lse
    return SplitLaunch(part_out, part_lse, counters, split, fused, max(2, triton.next_power_of_2(num_splits)))


def merge_splits(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """Write into `out` [B, H, d] the merge of a split-K launch's partials (`SplitLaunch`), one program per row."""
    B, H, d = out.shape
    num_splits = part_lse.shape[-1]
    combine_splits_kernel[(B * H,)](
        part_out, part_lse, out, H, num_splits, out.stride(0), out.stride(1),
        D=d, D_PAD=triton.next_power_of_2(d), SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
        num_warps=4 if d >= 128 else 2,
    )

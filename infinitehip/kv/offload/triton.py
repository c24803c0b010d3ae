"""Row copy between flat slot tensors, one Triton kernel; same semantics as `reference.py` (the oracle).

The rows are moved as raw words (int32 when a row's bytes allow it, else int16 / uint8), so every storage
dtype (fp32, bf16, fp16, fp8) is copied bit-exactly by one kernel. A second kernel converts a store in a
narrower dtype (kv_dtype fp8_* or bf16) into a bank in the model's dtype while copying: FP8 bytes are
decoded with integer ops (exact, and the same under the interpreter, which has no FP8 loads). Grid: (rows, row tiles); a program
whose source or destination row is negative loads and stores nothing (masked), so a resolve call with 90%
hits reads only the missed rows from host memory. On CUDA either side may be pinned host memory: with
unified virtual addressing its pointer is valid in kernels, so the copy needs no host sync and no
cudaMemcpy, and it can be captured in a CUDA graph. Under TRITON_INTERPRET=1 both sides are CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infinitehip.triton_interpreter import fix_interpreter_if_active

fix_interpreter_if_active()


@triton.jit
def _row_tile(SrcRows, DstRows, row_len, BLOCK: tl.constexpr):
    """This program's (source row, destination row, offsets in the row, mask): grid (rows, row tiles); a
    negative source or destination row masks everything."""
    r = tl.program_id(0)
    s = tl.load(SrcRows + r).to(tl.int64)
    d = tl.load(DstRows + r).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    return s, d, offs, (offs < row_len) & (s >= 0) & (d >= 0)


@triton.jit
def _copy_rows_kernel(Src, SrcRows, Dst, DstRows, row_words, stride_src, stride_dst, BLOCK: tl.constexpr):
    s, d, offs, ok = _row_tile(SrcRows, DstRows, row_words, BLOCK)
    x = tl.load(Src + s * stride_src + offs, mask=ok, other=0)
    tl.store(Dst + d * stride_dst + offs, x, mask=ok)


@triton.jit
def _copy_rows_convert_kernel(Src, SrcRows, Dst, DstRows, row_elems, stride_src, stride_dst, SRC_FORMAT: tl.constexpr,
                              BLOCK: tl.constexpr):
    """Dst: float rows. Src: rows Triton loads as floats (SRC_FORMAT 0) or the uint8 bytes of FP8 rows (1: e4m3fn,
    2: e5m2). FP8 normal values are rebuilt as fp32 bit patterns, subnormals as sign * 2^(1 - bias) * m / 2^M
    (exact products); e4m3fn has no infinities and one NaN code (e = 15, m = 7)."""
    s, d, offs, ok = _row_tile(SrcRows, DstRows, row_elems, BLOCK)
    if SRC_FORMAT == 0:  # a torch float dtype Triton loads (bf16 / fp16 / fp32)
        value = tl.load(Src + s * stride_src + offs, mask=ok, other=0).to(tl.float32)
        tl.store(Dst + d * stride_dst + offs, value.to(Dst.dtype.element_ty), mask=ok)
        return
    b = tl.load(Src + s * stride_src + offs, mask=ok, other=0).to(tl.int32)
    if SRC_FORMAT == 2:  # e5m2
        e = (b >> 2) & 0x1F
        m = b & 0x3
        normal = (((e + 112) << 23) | (m << 21)).to(tl.float32, bitcast=True)  # fp32 bits: exponent e - 15 + 127
        value = tl.where(e == 0, m.to(tl.float32) * 0.25 * 0.00006103515625, normal)  # 2^-14
        special = tl.where(m == 0, float("inf"), float("nan"))
        value = tl.where(e == 31, special, value)
    else:  # e4m3fn
        e = (b >> 3) & 0xF
        m = b & 0x7
        normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)  # fp32 bits: exponent e - 7 + 127
        value = tl.where(e == 0, m.to(tl.float32) * 0.125 * 0.015625, normal)  # 2^-6
        value = tl.where((e == 15) & (m == 7), float("nan"), value)
    # the sign as a bit (negating would turn -0 into +0 under the interpreter)
    value = (value.to(tl.int32, bitcast=True) | ((b & 0x80) << 24)).to(tl.float32, bitcast=True)
    tl.store(Dst + d * stride_dst + offs, value.to(Dst.dtype.element_ty), mask=ok)


@triton.jit
def _encode_fp8(x, MANT: tl.constexpr, BIAS: tl.constexpr, MAXV: tl.constexpr, NAN_CODE: tl.constexpr):
    """fp32 -> FP8 code (int32 0..255) with integer ops on the fp32 bits (the interpreter has no FP8 stores): saturate
    to +-MAXV, round to nearest even, NaN to NAN_CODE; as torch's clamp then cast (`store.to_storage_dtype`)."""
    nan = x != x
    x = tl.minimum(tl.maximum(x, -MAXV), MAXV)
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    exp = (a >> 23) - 127 + BIAS  # the FP8 biased exponent of a normal value
    SHIFT: tl.constexpr = 23 - MANT
    code = (exp << MANT) | ((a & 0x7FFFFF) >> SHIFT)
    rem = a & ((1 << SHIFT) - 1)
    half: tl.constexpr = 1 << (SHIFT - 1)
    code += ((rem > half) | ((rem == half) & ((code & 1) == 1))).to(tl.int32)  # a carry moves into the exponent
    # subnormal (exp <= 0): code = round-to-even(|x| * 2^(BIAS - 1 + MANT)); adding and removing 2^23 rounds an fp32
    # below 2^22 to an integer, to nearest even
    scaled = a.to(tl.float32, bitcast=True) * (2.0 ** (BIAS - 1 + MANT))
    sub = ((scaled + 8388608.0) - 8388608.0).to(tl.int32)
    code = tl.where(exp <= 0, sub, code)
    return tl.where(nan, NAN_CODE, code | sign)


@triton.jit
def _write_rows_kernel(Src, Dst, DstRows, row_elems, stride_src, stride_dst, DST_FORMAT: tl.constexpr,
                       BLOCK: tl.constexpr):
    """Dst[DstRows[r]] = Src[r] in Dst's dtype (DST_FORMAT 0: a float dtype Triton stores; 1 / 2: the uint8 bytes of
    FP8 e4m3fn / e5m2, saturated); a negative destination row writes nothing."""
    r = tl.program_id(0).to(tl.int64)
    d = tl.load(DstRows + r).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = (offs < row_elems) & (d >= 0)
    x = tl.load(Src + r * stride_src + offs, mask=ok, other=0).to(tl.float32)
    if DST_FORMAT == 0:
        tl.store(Dst + d * stride_dst + offs, x.to(Dst.dtype.element_ty), mask=ok)
    elif DST_FORMAT == 1:
        tl.store(Dst + d * stride_dst + offs, _encode_fp8(x, 3, 7, 448.0, 0x7F).to(tl.uint8), mask=ok)
    else:
        tl.store(Dst + d * stride_dst + offs, _encode_fp8(x, 2, 15, 57344.0, 0x7F).to(tl.uint8), mask=ok)


def _fp8_format(dtype: torch.dtype) -> int:
    """The kernels' code of a row dtype: 1 FP8 e4m3fn, 2 FP8 e5m2 (moved as uint8 bytes), 0 a float Triton loads."""
    return {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}.get(dtype, 0)


def _float_rows(rows: torch.Tensor, what: str) -> tuple[torch.Tensor, int]:
    """rows [N, E], each row contiguous -> (what the kernels address: FP8 rows as their uint8 bytes, others as they
    are; the dtype's `_fp8_format` code)."""
    if rows.stride(-1) != 1:
        raise ValueError(f"{what} needs rows that are contiguous in memory")
    fmt = _fp8_format(rows.dtype)
    return (rows.view(torch.uint8) if fmt else rows), fmt


def _row_tiles(row_elems: int) -> tuple[int, int]:
    """(block, tiles per row): rows of up to 1024 elements (or words) in one program, longer ones in tiles of 1024."""
    block = min(1024, triton.next_power_of_2(row_elems))
    return block, triton.cdiv(row_elems, block)


def write_rows_triton(src: torch.Tensor, dst: torch.Tensor, dst_rows: torch.Tensor) -> None:
    """dst[dst_rows[i]] = src[i] converted to dst's dtype (FP8 saturated), one launch: new tokens' K or V [T, ...]
    (rows may be strided, as heads split from a fused projection are) into a store layer (pinned host memory through
    UVA, or GPU memory). The eager form (`store.to_storage_dtype` then a row copy) made ~4 launches a tensor."""
    if src.shape[1:] != dst.shape[1:] or dst_rows.numel() != src.shape[0]:
        raise ValueError(f"write_rows: {src.shape[0]} rows {tuple(src.shape[1:])} into {dst_rows.numel()} rows "
                         f"{tuple(dst.shape[1:])}")
    if not src.is_floating_point() or src.dtype in FP8_DTYPES:
        raise ValueError(f"write_rows: source rows must be a float dtype Triton loads, got {src.dtype}")
    n = src.shape[0]
    if n == 0:
        return
    s, _ = _float_rows(src.reshape(n, -1), "write_rows")  # a view for a row-strided [T, H, d] with contiguous rows
    d, fmt = _float_rows(dst.view(dst.shape[0], -1), "write_rows")
    row_elems = s.shape[1]
    block, tiles = _row_tiles(row_elems)
    _write_rows_kernel[(n, tiles)](s, d, dst_rows, row_elems, s.stride(0), d.stride(0), DST_FORMAT=fmt, BLOCK=block)


def _as_words(t: torch.Tensor) -> torch.Tensor:
    """[rows, ...] -> a [rows, words] view of the same memory (never a copy: the kernel writes through it)."""
    rows = t.view(t.shape[0], -1) if t.dim() > 1 else t.view(-1, 1)
    if rows.stride(-1) != 1:
        raise ValueError("copy_rows needs rows that are contiguous in memory")
    raw = rows.view(torch.uint8)
    for word in (torch.int32, torch.int16):
        if raw.shape[1] % word.itemsize == 0:
            return raw.view(word)
    return raw


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def copy_rows_triton(src: torch.Tensor, src_rows: torch.Tensor, dst: torch.Tensor, dst_rows: torch.Tensor) -> None:
    convert = src.dtype != dst.dtype and dst.dtype.is_floating_point and dst.dtype not in FP8_DTYPES
    if (src.dtype != dst.dtype and not convert) or src.shape[1:] != dst.shape[1:]:
        raise ValueError(f"copy_rows: src {src.dtype} {tuple(src.shape[1:])} and dst {dst.dtype} {tuple(dst.shape[1:])} rows differ")
    n = src_rows.numel()
    if n != dst_rows.numel():
        raise ValueError(f"copy_rows: {n} source rows but {dst_rows.numel()} destination rows")
    if n == 0:
        return
    if convert:
        s, src_format = _float_rows(src.view(src.shape[0], -1), "copy_rows")
        d, _ = _float_rows(dst.view(dst.shape[0], -1), "copy_rows")
        row_elems = s.shape[1]
        block, tiles = _row_tiles(row_elems)
        _copy_rows_convert_kernel[(n, tiles)](s, src_rows, d, dst_rows, row_elems, s.stride(0), d.stride(0),
                                        SRC_FORMAT=src_format, BLOCK=block)
        return
    s, d = _as_words(src), _as_words(dst)
    row_words = s.shape[1]
    block, tiles = _row_tiles(row_words)
    _copy_rows_kernel[(n, tiles)](s, src_rows, d, dst_rows, row_words, s.stride(0), d.stride(0), BLOCK=block)

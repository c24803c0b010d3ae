"""The store's write kernel (kv/offload/triton.py `write_rows_triton`): new tokens' K / V converted and scattered in one
launch, against the eager form (`store.to_storage_dtype` then the row copy): every bf16 value into FP8 e4m3fn and
e5m2 (saturation, round to nearest even, subnormals, signed zeros, NaN), strided source rows, skipped rows, a float
store. Without a CUDA device the kernel runs under the Triton interpreter."""

import pytest
import torch

pytest.importorskip("triton")

from infinitehip.kv.offload.store import to_storage_dtype  # noqa: E402
from infinitehip.kv.offload.triton import write_rows_triton  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_every_bf16_value_converts_as_torch_does(fp8):
    values = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)  # every bf16 bit pattern
    src = values.view(64, 1024).to(DEVICE)
    dst = torch.zeros(64, 1024, dtype=fp8, device=DEVICE)
    write_rows_triton(src, dst, torch.arange(64, device=DEVICE))
    want = to_storage_dtype(src, fp8).view(torch.uint8)
    got = dst.view(torch.uint8)
    nan = torch.isnan(src)
    assert torch.equal(got[~nan], want[~nan])
    assert torch.isnan(dst[nan].float()).all()  # a NaN stays a NaN (its code may differ from torch's choice)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16, torch.float32])
def test_strided_rows_scatter_and_skip(dtype):
    g = torch.Generator().manual_seed(0)
    qkv = (torch.randn(5, 3 * 2 * 16, generator=g) * 40).to(torch.bfloat16).to(DEVICE)
    k = qkv[:, 32:64].view(5, 2, 16)  # a fused projection's key heads: rows strided
    dst = torch.zeros(9, 2, 16, dtype=dtype, device=DEVICE)
    rows = torch.tensor([7, -1, 0, 3, 8], device=DEVICE)
    write_rows_triton(k, dst, rows)
    want = torch.zeros_like(dst)
    keep = rows >= 0
    want[rows[keep]] = to_storage_dtype(k[keep], dtype)
    assert torch.equal(dst.view(torch.uint8), want.view(torch.uint8))

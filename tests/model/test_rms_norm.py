"""RMSNorm (model/rms_norm/): the Triton kernel against the eager oracle (the models' former code), both roundings,
strided per-head inputs, bf16 and fp32. Without a CUDA device the kernel runs under the Triton interpreter."""

import pytest
import torch

pytest.importorskip("triton")

from infinitehip.model.rms_norm import rms_norm  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(5, 96), (3, 4, 64), (1, 130)])
def test_kernel_matches_the_eager_rounding(gemma, dtype, shape):
    g = torch.Generator().manual_seed(len(shape) + shape[-1])
    x = (torch.randn(*shape, generator=g) * 3).to(dtype).to(DEVICE)
    w = (torch.randn(shape[-1], generator=g) * 0.5 + (0 if gemma else 1)).to(dtype).to(DEVICE)
    want = rms_norm(x, w, 1e-6, gemma, impl="reference")
    got = rms_norm(x, w, 1e-6, gemma, impl="triton")
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:  # the sum of squares in another order may move an element by one bf16 step; the interpreter rounds
        # fp32 -> bf16 toward zero (a GPU to nearest), so there two roundings may each lose one step
        steps = 1 if DEVICE.type == "cuda" else 2
        step = want.float().abs().clamp(min=1e-3) * 2 ** -7
        assert ((got.float() - want.float()).abs() <= steps * step).all()
        if DEVICE.type == "cuda":
            assert (got == want).float().mean() > 0.95


def test_kernel_reads_heads_split_from_a_fused_projection():
    """q [T, H, d] as a view of the fused qkv output (rows not contiguous), Qwen3-style per-head norm."""
    qkv = torch.randn(6, 4 * 32 + 2 * 2 * 32, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    q = qkv[:, : 4 * 32].view(6, 4, 32)
    w = torch.rand(32, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    torch.testing.assert_close(rms_norm(q, w, 1e-5, impl="triton"), rms_norm(q, w, 1e-5, impl="reference"),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="impl"):
        rms_norm(q, w, 1e-5, impl="cuda")

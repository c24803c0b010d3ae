"""RMSNorm (model/rms_norm/): the Triton kernel against the eager oracle (the models' former code), both roundings,
strided per-head inputs, bf16 and fp32. Without a CUDA device the kernel runs under the Triton interpreter."""

import pytest
import torch

pytest.importorskip("triton")

from infinitehip.model.rms_norm.op import add_rms_norm, rms_norm  # noqa: E402

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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(5, 96), (1, 4096), (3, 2, 130)])
def test_fused_residual_add_equals_the_add_then_the_norm(dtype, shape):
    """add_rms_norm's kernel: the sum as torch rounds it, and bit for bit the plain kernel's norm of that sum."""
    g = torch.Generator().manual_seed(shape[-1])
    x, r = ((torch.randn(*shape, generator=g) * 3).to(dtype).to(DEVICE) for _ in range(2))
    w = (torch.randn(shape[-1], generator=g) * 0.5 + 1).to(dtype).to(DEVICE)
    normed, total = add_rms_norm(x, r, w, 1e-6, impl="triton")
    if dtype == torch.float32 or DEVICE.type == "cuda":  # the interpreter rounds fp32 -> bf16 toward zero
        assert torch.equal(total, x + r)
    assert torch.equal(normed, rms_norm(total, w, 1e-6, impl="triton"))
    want_normed, want_total = add_rms_norm(x, r, w, 1e-6, impl="reference")
    if dtype == torch.float32:
        torch.testing.assert_close(normed, want_normed, rtol=1e-5, atol=1e-5)
    else:  # bf16 steps: the sum's rounding (the interpreter's only) and the norm's two
        steps = 1 if DEVICE.type == "cuda" else 3
        step = want_normed.float().abs().clamp(min=1e-3) * 2 ** -7
        assert ((normed.float() - want_normed.float()).abs() <= steps * step).all()
        assert ((total.float() - want_total.float()).abs() <= want_total.float().abs() * 2 ** -7).all()


def test_model_with_fused_residual_adds_matches_the_unfused_layer_arithmetic():
    """The Llama decoder's layers carry (sublayer output, residual stream); the hidden states are the plain
    `h = h + sublayer(norm(h))` chain's, bit for bit (CPU: the reference ops in float32; CUDA: the kernels in bf16)."""
    from infinitehip.config.model import ModelConfig
    from infinitehip.model.llama import LlamaModel

    torch.manual_seed(0)
    config = ModelConfig(model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=3,
                         num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                         max_position_embeddings=4096)
    model = LlamaModel(config).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model = model.to(DEVICE, torch.bfloat16 if DEVICE.type == "cuda" else torch.float32)
    ids = torch.randint(0, config.vocab_size, (7,)).to(DEVICE)
    attention = lambda layer, q, k, v: v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)  # a stand-in mixer
    with torch.no_grad():
        got = model(ids, attention)
        h = model.embed_tokens(ids)
        for layer in model.layers:
            h = h + layer.self_attn(layer.input_layernorm(h), attention)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        want = model.norm(h)
    assert torch.equal(got, want)

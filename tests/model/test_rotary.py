"""Rotation at gathered positions (model/rotary/): the Triton kernel against the eager oracle (`rope.apply_rotary` on
the gathered table rows), query blocks and strided heads, bf16 and fp32; the pruning stages' call on a real table.
Without a CUDA device the kernel runs under the Triton interpreter."""

import pytest
import torch

pytest.importorskip("triton")

from infinitehip.model.rotary.op import rotate_at  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _tables(positions: int, half: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.rand(positions, half, generator=torch.Generator().manual_seed(seed)) * 100
    return angles.cos().to(DEVICE), angles.sin().to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lead,H,d", [((3, 5), 4, 16), ((1, 1), 32, 128), ((7,), 3, 64), ((2, 64), 1, 256)])
def test_kernel_equals_the_eager_rotation(dtype, lead, H, d):
    g = torch.Generator().manual_seed(H * d)
    cos, sin = _tables(500, d // 2, H)
    x = (torch.randn(*lead, H, d, generator=g) * 4).to(dtype).to(DEVICE)
    pos = torch.randint(0, 500, lead, generator=g).to(DEVICE)
    want = rotate_at(x, pos, cos, sin, impl="reference")
    got = rotate_at(x, pos, cos, sin, impl="triton")
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    if dtype == torch.float32 or DEVICE.type == "cuda":
        assert torch.equal(got, want)  # the reference's products and sums, each rounded, in its order
    else:  # the interpreter rounds fp32 -> bf16 toward zero (a GPU to nearest): at most one bf16 step apart
        exact = rotate_at(x.float(), pos, cos, sin, impl="reference")
        step = exact.abs().clamp(min=1e-3) * 2 ** -7
        assert ((got.float() - want.float()).abs() <= step).all()


def test_kernel_reads_heads_split_from_a_fused_projection():
    """q [T, H, d] as a view of a fused qkv output (rows not contiguous), positions past a chunk grid."""
    qkv = torch.randn(6, 4 * 32 + 2 * 2 * 32, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    q = qkv[:, : 4 * 32].view(6, 4, 32)
    cos, sin = _tables(64, 16, 1)
    pos = torch.tensor([63, 0, 5, 5, 31, 2], device=DEVICE)
    assert torch.equal(rotate_at(q, pos, cos, sin, impl="triton"), rotate_at(q, pos, cos, sin, impl="reference"))


def test_stage_rotation_as_the_pruning_stages_call_it():
    """Query blocks [M, b, H, d] of a model's RoPE table at scoring positions, as pruning.run_stage passes them."""
    from infinitehip.config.model import ModelConfig
    from infinitehip.model.rope import RotaryEmbedding

    mc = ModelConfig(model_type="llama", vocab_size=16, hidden_size=64, intermediate_size=64, num_layers=1,
                     num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=500000.0,
                     max_position_embeddings=8192)
    rope = RotaryEmbedding(mc, 4096, DEVICE)
    q = torch.randn(3, 64, 4, 16, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    pos = torch.randint(0, 4096, (3, 64), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    got = rotate_at(q, pos, rope.cos, rope.sin, impl="triton")
    assert torch.equal(got, rotate_at(q, pos, rope.cos, rope.sin, impl="reference"))
    # and the rotation is one: rotating back by the same angles gives the queries again
    back = rotate_at(got, pos, rope.cos, -rope.sin, impl="triton")
    torch.testing.assert_close(back, q, rtol=1e-5, atol=1e-5)


def test_bad_shapes_are_refused():
    cos, sin = _tables(10, 8, 0)
    x = torch.randn(4, 2, 16).to(DEVICE)
    with pytest.raises(ValueError, match="positions"):
        rotate_at(x, torch.zeros(5, dtype=torch.long, device=DEVICE), cos, sin, impl="triton")
    with pytest.raises(ValueError, match="tables"):
        rotate_at(x, torch.zeros(4, dtype=torch.long, device=DEVICE), cos[:, :4], sin[:, :4], impl="triton")
    with pytest.raises(ValueError, match="impl"):
        rotate_at(x, torch.zeros(4, dtype=torch.long, device=DEVICE), cos, sin, impl="cuda")

"""Head aggregation of chunk scores (`head_aggregation`): per-head scores vs brute force, the aggregations vs
plain loops, Triton per-head vs reference, and a pruning stage that ranks by them.

Without a CUDA device the kernels run under the Triton interpreter, so shapes are kept small.
"""

import math

import pytest
import torch

pytest.importorskip("triton")

from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig  # noqa: E402
from infinitehip.attention.methods.infinitehip.pruning import StageSpec, query_blocks, run_stage  # noqa: E402
from infinitehip.attention.methods.infinitehip.scoring.op import chunk_scores, representative_scores  # noqa: E402
from infinitehip.attention.methods.infinitehip.scoring.aggregate import aggregate_heads  # noqa: E402
from infinitehip.config.model import ModelConfig  # noqa: E402
from infinitehip.kv.paged_cache import token_slots  # noqa: E402
from infinitehip.model.rope import RotaryEmbedding, apply_rotary  # noqa: E402
from tests.rope_helpers import rope_tables  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_case(M=3, b=8, H=6, Hkv=2, d=32, N=9, page_size=8, chunk=8, seed=0):
    """Representative-scores inputs with chunk-indexed positions (keys rotated per chunk) and a padding chunk."""
    g = torch.Generator().manual_seed(seed)
    T = N * chunk + 16
    n_pages = math.ceil(T / page_size)
    page_table = torch.randperm(n_pages + 3, generator=g)[:n_pages].to(torch.int32)
    k_flat = torch.randn((n_pages + 3) * page_size, Hkv, d, generator=g)
    q_rot = torch.randn(M, b, H, d, generator=g) * torch.linspace(0.5, 3.0, H)[:, None]  # unequal head scales
    q_valid = torch.rand(M, b, generator=g) < 0.8
    q_valid[:, 0] = True
    lens = torch.randint(1, chunk + 1, (M, N), generator=g)
    lens[:, -1] = 0  # padding
    starts = torch.arange(N)[None, :].expand(M, N) * chunk
    reps = starts[..., None] + (torch.rand(M, N, H, generator=g) * lens[..., None].clamp(min=1)).long()
    base = torch.cumsum((lens > 0).long(), 1) - 1
    cos, sin = rope_tables(int(base.max()) + 4, d)
    dev = lambda x: x.to(DEVICE)  # noqa: E731
    rep_args = (dev(q_rot), dev(q_valid), dev(k_flat), dev(page_table), page_size, dev(reps), dev(lens), dev(base),
                None, 1, cos, sin)
    chunk_args = (dev(q_rot), dev(q_valid), dev(k_flat), dev(page_table), page_size, dev(starts), dev(lens), dev(base),
                  None, 0, 1, 1, cos, sin)
    return rep_args, chunk_args


def brute_per_head(q_rot, q_valid, k_flat, page_table, page_size, reps, lens, base, _group, rep_offset, cos, sin):
    """Per (m, j, h): max over valid queries of q . rope(k_rep, base + offset), float64 loops."""
    M, b, H, d = q_rot.shape
    out = torch.full((M, reps.shape[1], H), float("-inf"), dtype=torch.float64)
    for m in range(M):
        for j in range(reps.shape[1]):
            if lens[m, j] == 0:
                continue
            for h in range(H):
                t = reps[m, j, h]
                k = k_flat[token_slots(page_table, t, page_size), h // (H // k_flat.shape[1])].double()
                pos = int(base[m, j]) + rep_offset
                k = apply_rotary(k, cos[pos].double(), sin[pos].double())
                out[m, j, h] = max(float(q_rot[m, i, h].double() @ k) for i in range(b) if q_valid[m, i])
    return out


def test_per_head_reference_matches_brute_force_and_fused_max():
    args, _ = make_case()
    per_head = representative_scores(*args, impl="reference", per_head=True)
    assert per_head.shape == (3, 9, 6)
    torch.testing.assert_close(per_head.double().cpu(), brute_per_head(*[a.cpu() if torch.is_tensor(a) else a for a in args]),
                               rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(aggregate_heads(per_head, args[6], "max", 0.1), representative_scores(*args, impl="reference"))


@pytest.mark.parametrize("op", ["representative", "bisection"])
def test_per_head_triton_matches_reference(op):
    rep_args, chunk_args = make_case(seed=1)
    if op == "representative":
        ref = representative_scores(*rep_args, impl="reference", per_head=True)
        tri = representative_scores(*rep_args, impl="triton", per_head=True)
    else:
        ref, ref_r = chunk_scores(*chunk_args, impl="reference", per_head=True)
        tri, tri_r = chunk_scores(*chunk_args, impl="triton", per_head=True)
        assert torch.equal(ref_r, tri_r) and ref_r.shape == (3, 9, 6)
        fused, fused_r = chunk_scores(*chunk_args, impl="reference")
        assert torch.equal(fused_r, ref_r)  # per-head bisection finds the same representatives
        torch.testing.assert_close(ref.amax(-1), fused)
    torch.testing.assert_close(tri, ref, rtol=1e-4, atol=1e-4)


def loop_aggregate(x, lens, mode, scale):
    """Plain loops over (m, h) in float64."""
    M, N, H = x.shape
    out = torch.full((M, N), float("-inf"), dtype=torch.float64)
    real = [[j for j in range(N) if lens[m, j] > 0] for m in range(M)]
    for m in range(M):
        acc = {j: (0.0 if mode == "softmax" else float("-inf")) for j in real[m]}
        for h in range(H if real[m] else 0):
            v = [float(x[m, j, h]) for j in real[m]]
            if mode == "softmax":
                z = [math.exp(scale * (a - max(v))) for a in v]
                for j, e in zip(real[m], z):
                    acc[j] += e / sum(z)
            else:
                mu = sum(v) / len(v)
                sd = max(math.sqrt(sum((a - mu) ** 2 for a in v) / len(v)), 1e-6)
                for j, a in zip(real[m], v):
                    acc[j] = max(acc[j], (a - mu) / sd)
        for j in real[m]:
            out[m, j] = acc[j]
    return out


@pytest.mark.parametrize("mode", ["softmax", "zscore"])
def test_aggregations_match_loops(mode):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 7, 5, generator=g) * 20
    lens = torch.randint(0, 3, (4, 7), generator=g)
    lens[:, 0] = 2
    lens[3] = 0  # a block with only padding: -inf everywhere, no NaN
    got = aggregate_heads(x, lens, mode, 0.125)
    assert torch.isneginf(got[lens == 0]).all() and not got.isnan().any()
    torch.testing.assert_close(got.double(), loop_aggregate(x, lens, mode, 0.125), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        aggregate_heads(x, lens, "nope", 1.0)


def test_softmax_is_not_dominated_by_one_loud_head():
    """Head 0 has a 10x logit scale and prefers chunk 0 slightly; heads 1-3 strongly prefer chunk 1."""
    x = torch.tensor([[[100.0, 1.0, 1.0, 1.0], [99.0, 30.0, 30.0, 30.0], [0.0, 0.0, 0.0, 0.0]]])
    lens = torch.ones(1, 3, dtype=torch.long)
    assert aggregate_heads(x, lens, "max", 0.125).argmax() == 0
    assert aggregate_heads(x, lens, "softmax", 0.125).argmax() == 1
    assert aggregate_heads(x, lens, "zscore", 0.125).argmax() == 1


def test_config_validates_head_aggregation():
    assert InfiniteHiPConfig().head_aggregation == "max"
    assert InfiniteHiPConfig(head_aggregation="softmax").head_aggregation == "softmax"
    with pytest.raises(ValueError, match="head_aggregation"):
        InfiniteHiPConfig(head_aggregation="mean")


@pytest.mark.parametrize("mode", ["max", "softmax"])
def test_stage_keeps_the_chunks_the_aggregation_ranks_first(mode):
    """run_stage (bisection, relative style) keeps exactly the top chunks of aggregate_heads(per-head scores)."""
    g = torch.Generator().manual_seed(2)
    H, Hkv, d, T, page_size = 4, 2, 32, 200, 8
    page_table = torch.arange(T // page_size + 1, dtype=torch.int32)
    k_flat = torch.randn((T // page_size + 1) * page_size, Hkv, d, generator=g)
    q = torch.randn(16, H, d, generator=g) * torch.tensor([4.0, 1.0, 1.0, 1.0])[:, None]
    mc = ModelConfig("llama", vocab_size=8, hidden_size=H * d, intermediate_size=8, num_layers=1, num_heads=H,
                     num_kv_heads=Hkv, head_dim=d, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256)
    rope = RotaryEmbedding(mc, 512)
    blocks = query_blocks(q, T - 16, 16)
    spec = StageSpec(16, 8, 40, "relative", mode)
    out = run_stage(spec, blocks, None, k_flat, page_table, page_size, 8, 32, rope, T, 256, "reference")
    # expected: score every chunk of [sink, limit) per head the same way, aggregate, keep the top 5
    limit = T - 32
    starts = torch.arange(8, limit, 8)[None]
    lens = (limit - starts).clamp(max=8)
    q_rot = apply_rotary(blocks.q, rope.cos[33], rope.sin[33])
    per_head, _ = chunk_scores(q_rot, blocks.valid, k_flat, page_table, page_size, starts, lens, torch.zeros_like(starts),
                               None, 0, 1, 1, rope.cos, rope.sin, impl="reference", per_head=True)
    top = aggregate_heads(per_head, lens, mode, d ** -0.5).topk(5).indices.sort().values
    assert torch.equal(out.chunk_starts[0], starts[0, top[0]])

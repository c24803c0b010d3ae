"""The prefill's landmark saliency sums (attention/methods/infinitehip/window_saliency/): the CPU formulation and the
Triton kernel against the pairwise oracle, and the oracle against a loop over single (query, key) pairs; then whole
`KeySaliency.update` calls through every impl over chunks that end anywhere. Without a CUDA device the kernel runs
under the Triton interpreter (tests/conftest.py), so shapes are kept small."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from infinitehip.attention.methods.infinitehip.saliency import KeySaliency  # noqa: E402
from infinitehip.attention.methods.infinitehip.window_saliency.op import window_counts, window_logit_sums  # noqa: E402
from infinitehip.attention.methods.infinitehip.window_saliency.triton import block_rows  # noqa: E402
from infinitehip.model.rope import RotaryEmbedding  # noqa: E402
from tests.attention.test_cpu_formulations import _cache, _model_config  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _case(n, first_key, H, Hkv, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, H, d, generator=g)
    k = torch.randn(n - first_key, Hkv, d, generator=g)
    return q.to(DEVICE), k.to(DEVICE)


def test_oracle_equals_a_loop_over_pairs():
    n, first_key, W = 23, -7, 8
    q, k = _case(n, first_key, 4, 2, 8, seed=0)
    out = window_logit_sums(q, k, first_key, W, impl="reference").cpu()
    expected = torch.zeros_like(out)
    for i in range(k.shape[0]):
        t = first_key + i
        for s in range(max(t, 0), min(t + W, n)):
            for h in range(4):
                expected[i, h] += (q[s, h] @ k[i, h // 2]).cpu()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    counts = window_counts(n, k.shape[0], first_key, W, torch.device("cpu"))
    assert counts.tolist() == [float(min(first_key + i + W, n) - max(first_key + i, 0)) for i in range(k.shape[0])]


@pytest.mark.parametrize("n, first_key, window, H, Hkv, d", [
    (100, 0, 32, 4, 2, 16),  # the prompt's first chunk: no key before it
    (130, -31, 32, 4, 2, 16),  # a later chunk: the previous chunk's last window - 1 keys receive its queries
    (70, -63, 64, 6, 2, 24),  # head dim not a power of two, a chunk shorter than two blocks
    (5, -47, 48, 2, 1, 16),  # window 48: blocks of 16; a chunk shorter than a block
    (200, -95, 96, 8, 8, 16),  # one query head per KV head; blocks of 32
    (600, -511, 512, 4, 2, 16),  # the default window: blocks of 64, seven whole blocks between the two partial ones
    (90, -63, 64, 4, 1, 160),  # the head dim in four slices of 64, the last one partly masked (Gemma 3's is 256)
])
@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_window_sums_equal_the_oracle(n, first_key, window, H, Hkv, d, impl):
    q, k = _case(n, first_key, H, Hkv, d, seed=n + window)
    ref = window_logit_sums(q, k, first_key, window, impl="reference")
    out = window_logit_sums(q, k, first_key, window, impl=impl)
    assert out.shape == ref.shape == (k.shape[0], H) and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-4)


def test_block_rows_follow_the_window():
    assert [block_rows(w) for w in (512, 48, 96, 40, 31)] == [64, 16, 32, 0, 0]  # 0: the CPU formulation runs
    q, k = _case(40, -39, 2, 1, 16, seed=1)  # window 40: no power-of-two block >= 16 divides it
    torch.testing.assert_close(window_logit_sums(q, k, -39, 40, impl="triton"),
                               window_logit_sums(q, k, -39, 40, impl="reference"), rtol=1e-5, atol=2e-4)


@pytest.mark.parametrize("window", [32, 96])
@pytest.mark.parametrize("chunks", [[(0, 150)], [(0, 37), (37, 100), (100, 101), (101, 165)]])
def test_saliency_updates_agree_across_impls(chunks, window):
    """Whole KeySaliency.update calls (RoPE, key reads, resets and scatter-adds) over chunks that end anywhere:
    the same sums and counts and the same representative token of every chunk."""
    gen = torch.Generator().manual_seed(len(chunks))
    H, Hkv, d, T = 4, 2, 16, chunks[-1][1]
    cache, page_table, q = _cache(T, H, Hkv, d, 16, gen)
    rope = RotaryEmbedding(_model_config(H, Hkv, d), 2 * T)
    impls = ("reference", "cpu", "triton") if DEVICE.type == "cpu" else ("reference", "cpu")  # a CPU cache
    stores = {impl: KeySaliency(window=window) for impl in impls}
    for impl, store in stores.items():
        for a, e in chunks:
            store.update(0, q[a:e], a, page_table, cache, rope, impl=impl)
    ref = stores["reference"]
    starts = torch.arange(0, T - 8, 8)[None]
    lens = torch.full_like(starts, 8)
    for impl in impls[1:]:
        assert torch.equal(stores[impl]._count[0], ref._count[0])
        torch.testing.assert_close(stores[impl]._sum[0], ref._sum[0], rtol=1e-5, atol=2e-4)
        assert torch.equal(stores[impl].representatives(0, starts, lens, page_table, 16, 8),
                           ref.representatives(0, starts, lens, page_table, 16, 8))

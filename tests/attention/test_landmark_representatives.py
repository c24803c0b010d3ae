"""Landmark representatives: key saliency accumulated chunk by chunk equals a brute-force oracle, the
representative is the chunk's most salient key per head, and the method runs end to end with it."""

import torch

from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.attention.methods.infinitehip.saliency import KeySaliency
from infinitehip.attention.methods.infinitehip.scoring.reference import representative_scores_reference
from infinitehip.config.model import ModelConfig
from infinitehip.kv.paged_cache import PagedKVCache, token_slots
from infinitehip.model.rope import RotaryEmbedding, apply_rotary


def _setup(T=300, H=4, Hkv=2, d=16, page_size=16, seed=0, max_positions=128, device="cpu"):
    """A one-layer config and T random keys [T, Hkv, d] in a shuffled paged cache on `device`, queries [T, H, d]."""
    g = torch.Generator().manual_seed(seed)
    config = ModelConfig.from_hf_dict({
        "model_type": "llama", "hidden_size": H * d, "num_attention_heads": H, "num_key_value_heads": Hkv,
        "num_hidden_layers": 1, "intermediate_size": 32, "vocab_size": 64, "max_position_embeddings": max_positions,
    })
    pages = -(-T // page_size)
    cache = PagedKVCache(1, pages + 3, page_size, Hkv, d, torch.float32, device)
    page_table = torch.randperm(pages + 3, generator=g)[:pages].int().to(device)
    k = torch.randn(T, Hkv, d, generator=g).to(device)
    cache.write(0, token_slots(page_table, torch.arange(T, device=device), page_size), k, torch.zeros_like(k))
    q = torch.randn(T, H, d, generator=g).to(device)
    return config, cache, page_table, q, k


def _oracle(q, k, rope, window):
    """saliency [T, H]: mean over queries s in [t, t + window) of q_s . k_t, both at their own positions."""
    T, H, _ = q.shape
    pos = torch.arange(T)
    qr = apply_rotary(q, rope.cos[pos][:, None], rope.sin[pos][:, None])
    kr = apply_rotary(k, rope.cos[pos][:, None], rope.sin[pos][:, None]).repeat_interleave(H // k.shape[1], 1)
    logits = torch.einsum("shd,thd->hst", qr, kr)
    dist = pos[:, None] - pos[None, :]
    reach = (dist >= 0) & (dist < window)
    return ((logits * reach).sum(1) / reach.sum(0)).T


def test_saliency_accumulated_over_chunks_equals_oracle():
    config, cache, page_table, q, k = _setup()
    rope = RotaryEmbedding(config, 512)
    store = KeySaliency(window=40)
    for a, b in [(0, 100), (100, 230), (230, 231), (231, 300)]:  # prefill chunks, then one-token steps
        store.update(0, q[a:b], a, page_table, cache, rope)
    slots = token_slots(page_table, torch.arange(300), cache.page_size)
    total, count = store._sum[0][slots], store._count[0][slots]
    torch.testing.assert_close(total / count[:, None], _oracle(q, k, rope, 40), rtol=1e-4, atol=1e-4)

    starts = torch.tensor([[0, 64, 128, 290], [32, 96, 0, 0]])
    lens = torch.tensor([[64, 64, 17, 10], [64, 5, 1, 0]])
    reps = store.representatives(0, starts, lens, page_table, cache.page_size, chunk_size=64)
    oracle = _oracle(q, k, rope, 40)
    for m in range(2):
        for n in range(4):
            if lens[m, n] == 0:
                continue
            span = oracle[starts[m, n] : starts[m, n] + lens[m, n]]  # [len, H]
            assert torch.equal(reps[m, n], starts[m, n] + span.argmax(0))


def test_representative_scores_are_max_over_heads_and_valid_queries():
    config, cache, page_table, q, k = _setup(seed=1)
    rope = RotaryEmbedding(config, 512)
    g = torch.Generator().manual_seed(2)
    M, b, N, H = 3, 5, 4, 4
    q_rot = torch.randn(M, b, H, 16, generator=g)
    q_valid = torch.rand(M, b, generator=g) < 0.7
    q_valid[:, 0] = True
    reps = torch.randint(0, 300, (M, N, H), generator=g)
    lens = torch.tensor([[8, 8, 0, 3]] * M)
    base = torch.randint(0, 50, (M, N), generator=g)
    got = representative_scores_reference(q_rot, q_valid, cache.flat_k(0), page_table, cache.page_size, reps, lens, base,
                                          None, 1, rope.cos, rope.sin)
    for m in range(M):
        for n in range(N):
            if lens[m, n] == 0:
                assert got[m, n] == float("-inf")
                continue
            best = max(
                float(q_rot[m, i, h] @ apply_rotary(k[reps[m, n, h], h // 2][None], rope.cos[base[m, n] + 1][None], rope.sin[base[m, n] + 1][None])[0])
                for h in range(H) for i in range(b) if q_valid[m, i]
            )
            assert abs(float(got[m, n]) - best) < 1e-4


def test_config_rejects_unknown_representative():
    import pytest

    with pytest.raises(ValueError, match="representative"):
        InfiniteHiPConfig(representative="median")
    with pytest.raises(ValueError, match="landmark_window"):
        InfiniteHiPConfig(representative="landmark", landmark_window=0)
    with pytest.raises(ValueError, match="stream_tokens"):  # saliency from queries past the window would leak
        InfiniteHiPConfig(representative="landmark", landmark_window=2048)

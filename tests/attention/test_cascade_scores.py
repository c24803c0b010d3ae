"""The cascade's attention with scores (attention/methods/cascade/scores.py) against a query-by-query oracle: outputs are
softmax attention over the visible keys, and each key's score is the decode-order EMA of the attention it receives,
reduced over its KV group's query heads (GQA: 6 query heads on 2 KV heads), by max or mean; two chunks give the
scores of their union."""

from __future__ import annotations

import pytest
import torch

from infinitehip.attention.methods.cascade.scores import attention_with_scores


def _oracle(q, k, v, q_pos, k_pos, scores, scale, decay, reduction):
    n, H, d = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    out = torch.empty(n, H, d, dtype=torch.float64)
    s = scores.double().clone()
    for i in range(n):
        seen = k_pos <= q_pos[i]
        for h in range(H):
            logits = (k[seen, h // G].double() @ q[i, h].double()) * scale
            p = logits.softmax(0)
            out[i, h] = p @ v[seen, h // G].double()
        for g in range(Hkv):
            probs = torch.stack([((k[seen, g].double() @ q[i, h].double()) * scale).softmax(0)
                                 for h in range(g * G, (g + 1) * G)])
            a = probs.amax(0) if reduction == "max" else probs.mean(0)
            s[g, seen] = decay * s[g, seen] + (1 - decay) * a
    return out, s


@pytest.mark.parametrize("reduction", ["max", "mean"])
def test_scores_are_the_query_order_ema_of_group_reduced_attention(reduction):
    g = torch.Generator().manual_seed(3)
    H, Hkv, d, cached, n = 6, 2, 8, 11, 7
    K = cached + n
    q = torch.randn(n, H, d, generator=g)
    k = torch.randn(K, Hkv, d, generator=g)
    v = torch.randn(K, Hkv, d, generator=g)
    k_pos = torch.cat([torch.randperm(cached, generator=g), torch.arange(cached, K)])  # cache slots out of order
    q_pos = torch.arange(cached, K)
    old = torch.cat([torch.rand(Hkv, cached, generator=g), torch.zeros(Hkv, n)], 1)
    want_out, want_scores = _oracle(q, k, v, q_pos, k_pos, old, 0.3, 0.9, reduction)
    whole = old.clone()
    out = attention_with_scores(q, k, v, q_pos, k_pos, whole, 0.3, 0.9, reduction)
    torch.testing.assert_close(out.double(), want_out, rtol=0, atol=1e-5)
    torch.testing.assert_close(whole.double(), want_scores, rtol=0, atol=1e-6)
    # The same queries in two chunks (the first one's keys only): the union's scores.
    split = old.clone()
    first = cached + 3
    attention_with_scores(q[:3], k[:first], v[:first], q_pos[:3], k_pos[:first], split[:, :first], 0.3, 0.9, reduction)
    attention_with_scores(q[3:], k, v, q_pos[3:], k_pos, split, 0.3, 0.9, reduction)
    torch.testing.assert_close(split, whole, rtol=0, atol=1e-6)
    # Not vacuous: the other reduction gives other scores.
    other = old.clone()
    attention_with_scores(q, k, v, q_pos, k_pos, other, 0.3, 0.9, "mean" if reduction == "max" else "max")
    assert (other - whole).abs().max() > 1e-3

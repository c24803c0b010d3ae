"""The decode steps' landmark saliency (attention/methods/infinitehip/decode_saliency/): the Triton kernel against the eager
oracle, the oracle against a per-pair loop, and KeySaliency.update_decode through both impls. Without a CUDA device
the kernel runs under the Triton interpreter (tests/conftest.py)."""

import pytest
import torch

pytest.importorskip("triton")

from infinitehip.attention.methods.infinitehip.decode_saliency.op import (  # noqa: E402
    add_decode_logits, add_decode_logits_batched,
)
from infinitehip.model.rope import apply_rotary  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_case(P, H, Hkv, d, window, newest, seed, dtype=torch.float32):
    """P queued queries (some slots empty, -1) among the last P positions up to `newest`, the union of their windows
    (positions before 0 included when the sequence is short), scattered slots, random sums to add to."""
    g = torch.Generator().manual_seed(seed)
    Wp = window + P - 1
    key_pos = newest - (Wp - 1) + torch.arange(Wp)
    positions = newest - torch.randperm(P, generator=g)
    positions[torch.rand(P, generator=g) < 0.3] = -1
    positions[0] = newest  # the newest query is always queued
    S = 4 * Wp
    slots = torch.randperm(S, generator=g)[:Wp]
    keys = torch.randn(Wp, Hkv, d, generator=g).to(dtype)
    q = torch.randn(P, H, d, generator=g).to(dtype)
    n = newest + 1
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
    angles = torch.arange(n).float()[:, None] * inv[None]
    total = torch.randn(S + 1, H, generator=g)
    count = torch.randint(0, 5, (S + 1,), generator=g).float()
    return [t.to(DEVICE) for t in (q, positions, key_pos, slots, keys, angles.cos(), angles.sin(), total, count)]


def per_pair(q, positions, key_pos, slots, keys, cos, sin, total, count, window):
    """Plain loops: reset each query's own slot, then add q_rot . k_rot per head for every reaching pair."""
    total, count = total.clone(), count.clone()
    H, Hkv = q.shape[1], keys.shape[1]
    for p, pos in enumerate(positions.tolist()):
        if pos >= 0:
            w = key_pos.tolist().index(pos)
            total[slots[w]] = 0
            count[slots[w]] = 0
    for w, kp in enumerate(key_pos.tolist()):
        for p, pos in enumerate(positions.tolist()):
            if pos >= 0 and kp >= 0 and 0 <= pos - kp < window:
                k = apply_rotary(keys[w].float(), cos[kp], sin[kp])
                qr = apply_rotary(q[p].float(), cos[pos], sin[pos])
                for h in range(H):
                    total[slots[w], h] += qr[h] @ k[h // (H // Hkv)]
                count[slots[w]] += 1
    return total, count


@pytest.mark.parametrize("P, H, Hkv, d, window, newest, seed", [
    (4, 4, 2, 16, 6, 40, 0),  # GQA
    (8, 9, 3, 64, 12, 100, 1),  # the embedded model's heads (not a power of two)
    (3, 2, 2, 8, 5, 3, 2),  # a short sequence: part of the union lies before position 0
])
def test_kernel_and_oracle_match_per_pair_loops(P, H, Hkv, d, window, newest, seed):
    case = make_case(P, H, Hkv, d, window, newest, seed)
    want_total, want_count = per_pair(*case, window)
    scratch = case[-2].shape[0] - 1
    for impl in ("reference", "triton"):
        got = make_case(P, H, Hkv, d, window, newest, seed)
        add_decode_logits(*got, window, impl=impl)
        torch.testing.assert_close(got[-2][:scratch], want_total[:scratch], rtol=1e-5, atol=1e-4, msg=impl)
        torch.testing.assert_close(got[-1][:scratch], want_count[:scratch], msg=impl)


def test_kernel_reads_bf16_keys_and_queries():
    case = make_case(4, 4, 2, 32, 8, 50, 3, dtype=torch.bfloat16)
    ref = [t.clone() for t in case]
    add_decode_logits(*ref, 8, impl="reference")
    add_decode_logits(*case, 8, impl="triton")
    torch.testing.assert_close(case[-2][:-1], ref[-2][:-1], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(case[-1][:-1], ref[-1][:-1])


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_a_batch_in_one_call_equals_one_call_per_sequence(impl):
    """Three sequences (one short: its union starts before position 0) whose queues are rows (4, 1, 2) of a pool of 5,
    their slots disjoint in shared sums: one batched call writes what one call per sequence writes, bit for bit."""
    P, H, Hkv, d, window, newest = 4, 4, 2, 16, 6, [40, 3, 25]
    G, Wp = len(newest), window + P - 1
    cases = [make_case(P, H, Hkv, d, window, n, seed=10 + g) for g, n in enumerate(newest)]
    S = cases[0][-1].shape[0] - 1  # each case's slots lie in [0, S)
    cos, sin = cases[0][5], cases[0][6]  # the longest sequence's tables cover every position
    g = torch.Generator().manual_seed(5)
    total = torch.randn(G * S + 1, H, generator=g).to(DEVICE)
    count = torch.randint(0, 5, (G * S + 1,), generator=g).float().to(DEVICE)
    rows = [4, 1, 2]
    q_pool = torch.randn(5, P, H, d, generator=g).to(DEVICE)
    pos_pool = torch.full((5, P), -1, dtype=torch.long, device=DEVICE)
    want_total, want_count = total.clone(), count.clone()
    for i, (q, positions, key_pos, slots, keys, *_rest) in enumerate(cases):
        q_pool[rows[i]], pos_pool[rows[i]] = q, positions
        add_decode_logits(q, positions, key_pos, slots + i * S, keys, cos, sin, want_total, want_count, window, impl=impl)
    stack = lambda k: torch.stack([c[k] for c in cases])
    add_decode_logits_batched(q_pool, pos_pool, torch.tensor(rows, device=DEVICE), stack(2),
                              stack(3) + torch.arange(G, device=DEVICE)[:, None] * S, stack(4), cos, sin, total, count,
                              window, impl=impl)
    assert torch.equal(total[:-1], want_total[:-1]) and torch.equal(count[:-1], want_count[:-1])

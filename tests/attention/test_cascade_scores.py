"""The cascade's attention with scores (attention/methods/cascade/scores/): the eager reference against a query-by-query
oracle (outputs are softmax attention over the visible keys, and each key's score is the decode-order EMA of the
attention it receives, reduced over its KV group's query heads (GQA: 6 query heads on 2 KV heads), by max or mean;
two chunks give the scores of their union), the CPU formulation and the Triton kernels (interpreted on CPU) against
the reference, and the method through the engine with each."""

from __future__ import annotations

import pytest
import torch

from infinitehip.attention.methods.cascade.config import CascadeConfig
from infinitehip.attention.methods.cascade.scores.op import attention_with_scores as attention_with_scores_fast
from infinitehip.attention.methods.cascade.scores.reference import attention_with_scores_reference as attention_with_scores
from tests.conftest import engine_for_dir, generate_greedy, random_ids, record_step_logits


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


# The fast paths take the method's slot order: the chunk's n queries are the last n of K slots (query i at slot
# K - n + i sees slots <= its own). Shapes: GQA groups of 3 (not a power of two) and 1, head dims not powers of two,
# a decode query, a chunk with no kept keys, keys of more than one tile; one query tile over keys in shares (the
# Triton decode path: 2 and 4 shares).
FAST_CASES = [(37, 100, 6, 2, 24, "max"), (37, 37, 6, 2, 16, "mean"), (1, 50, 4, 1, 32, "max"),
              (70, 200, 9, 3, 64, "mean"), (5, 300, 2, 2, 8, "max"), (1, 1100, 4, 1, 32, "max"),
              (3, 2100, 6, 3, 16, "mean")]


def _slot_order_inputs(n, K, H, Hkv, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*shape, generator=g).to(dtype) for shape in ((n, H, d), (K, Hkv, d), (K, Hkv, d)))
    scores = torch.cat([torch.rand(Hkv, K - n, generator=g), torch.zeros(Hkv, n)], 1)
    return q, k, v, scores


@pytest.mark.parametrize("impl", ["cpu", "triton"])
@pytest.mark.parametrize("n, K, H, Hkv, d, reduction", FAST_CASES)
def test_cpu_and_triton_paths_equal_the_reference(impl, n, K, H, Hkv, d, reduction):
    """The CPU formulation (flash log-sum-exps, one logits pass) and the Triton kernels (interpreted on CPU) give the
    reference's outputs and scores."""
    q, k, v, old = _slot_order_inputs(n, K, H, Hkv, d)
    pos = torch.arange(K)
    want = old.clone()
    want_out = attention_with_scores(q, k, v, pos[K - n :], pos, want, d ** -0.5, 0.9, reduction)
    got = old.clone()
    out = attention_with_scores_fast(q, k, v, got, d ** -0.5, 0.9, reduction, impl=impl)
    torch.testing.assert_close(out, want_out, rtol=0, atol=2e-6)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)


@pytest.mark.parametrize("reduction", ["max", "mean"])
def test_triton_path_in_bf16_equals_the_reference_of_the_same_values(reduction):
    """bf16 q/k/v (the GPU's dtype): the scores come from fp32 products of the same bf16 values, so they match the
    fp32 reference closely; the output is rounded to bf16 (and its probabilities before the product with V)."""
    n, K, H, Hkv, d = 40, 150, 8, 2, 64
    q, k, v, old = _slot_order_inputs(n, K, H, Hkv, d, torch.bfloat16, seed=1)
    pos = torch.arange(K)
    want = old.clone()
    want_out = attention_with_scores(q.float(), k.float(), v.float(), pos[K - n :], pos, want, d ** -0.5, 0.99,
                                     reduction)
    got = old.clone()
    out = attention_with_scores_fast(q, k, v, got, d ** -0.5, 0.99, reduction, impl="triton")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want_out, rtol=0, atol=3e-2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_the_method_gives_the_same_logits_with_every_impl(tiny_llama_dir):
    """Through the engine (tiny Llama, 4 sinks + 3 sub-caches of 16 + a 24-token stride, a 130-token prompt and 30
    decode steps: several pushes in prefill and decode): the reference, the CPU formulations (attention and batched
    update) and the Triton kernels give the same logits, step by step."""
    ids = random_ids(130, seed=4)
    runs = {}
    for impl in ("reference", "cpu", "triton"):
        config = CascadeConfig(sink_tokens=4, cache_tokens=52, num_subcaches=3, stride_tokens=24,
                               impl="auto" if impl == "cpu" else impl)
        engine = engine_for_dir(tiny_llama_dir, None, config, method="cascade", prefill_chunk_size=48)
        logits = record_step_logits(engine)
        seq = generate_greedy(engine, ids, 30)
        runs[impl] = (seq.output_ids, logits)
    ref_ids, ref_logits = runs["reference"]
    for impl in ("cpu", "triton"):
        ids_got, logits = runs[impl]
        assert ids_got == ref_ids, impl
        assert len(logits) == len(ref_logits)
        for got, want in zip(logits, ref_logits):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def _poisoning_run(tiny_llama_dir, config, ids, which):
    """Greedy run whose cache gets NaN k/v after every push in the kept slots `which(schedule)` names -> (step
    logits, how many slots were poisoned)."""
    engine = engine_for_dir(tiny_llama_dir, None, config, method="cascade", prefill_chunk_size=48)
    method, poisoned = engine.method, []
    push = method._push

    def poisoning_push(seq):
        kept = push(seq)
        slots = which(seq.state.schedule)
        if slots:
            rows = seq.context_slots[torch.tensor(slots)]
            for layer in range(seq.cache.num_layers):
                seq.cache.flat_k(layer)[rows] = float("nan")
                seq.cache.flat_v(layer)[rows] = float("nan")
            poisoned.append(len(slots))
        return kept

    method._push = poisoning_push
    logits = record_step_logits(engine)
    generate_greedy(engine, ids, 6)
    return logits, poisoned


def test_a_filling_subcaches_slots_past_its_count_are_never_attended(tiny_llama_dir):
    """4 sinks + 4 sub-caches of 16 + a 24-token stride: the first push (88 tokens) fills sub-caches 0-2 and 6
    slots of sub-cache 3, whose other 10 slots hold prompt tokens of no sub-cache until two more pushes fill it.
    NaN written into those slots' k/v after each push leaves every logit equal to a clean run's; NaN in a slot
    that holds a token (control) reaches the logits."""
    config = CascadeConfig(sink_tokens=4, cache_tokens=68, num_subcaches=4, stride_tokens=24)
    ids = random_ids(160, seed=5)
    clean, _ = _poisoning_run(tiny_llama_dir, config, ids, lambda schedule: [])

    def empty(schedule):
        held = schedule.held_slots()
        return [] if held is None else sorted(set(range(schedule.kept)) - set(held.tolist()))

    logits, poisoned = _poisoning_run(tiny_llama_dir, config, ids, empty)
    assert poisoned and poisoned[0] == 10, poisoned
    for got, want in zip(logits, clean, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    control, _ = _poisoning_run(tiny_llama_dir, config, ids, lambda schedule: [config.sink_tokens])
    assert torch.isnan(control[-1]).all()

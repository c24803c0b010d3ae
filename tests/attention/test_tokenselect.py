"""The `tokenselect` method: soft-vote kernel vs oracle, selection and key lists vs a recomputed oracle,
Selection Cache hits/misses, dense equivalence when the budget covers the context, real-model passkey.

Without CUDA the Triton kernels run under the interpreter (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from infinitehip import SamplingParams
from infinitehip.attention.base import ForwardBatch, SequenceSlice
from infinitehip.attention.methods.tokenselect import method as method_module
from infinitehip.attention.methods.tokenselect.soft_vote.op import soft_vote
from infinitehip.attention.methods.tokenselect.config import TokenSelectConfig
from infinitehip.attention.methods.tokenselect.method import TokenSelectAttention
from infinitehip.config.model import ModelConfig
from infinitehip.kv.paged_cache import token_slots
from infinitehip.model.rope import RotaryEmbedding, apply_rotary
from tests.conftest import engine_for_dir
from tests.paged_helpers import random_paged_cache

pytest.importorskip("triton")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=2e-2, atol=2e-3)}


# ---- kernel vs oracle -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, kv_heads, d", [(6, 2, 40), (4, 4, 64)])
def test_soft_vote_kernel_matches_reference(dtype, heads, kv_heads, d):
    gen = torch.Generator().manual_seed(heads * d)
    page_size, pages = 16, 48
    k_flat = (2 * torch.randn(pages * page_size, kv_heads, d, generator=gen)).to(DEVICE, dtype)
    q = torch.randn(3, heads, d, generator=gen).to(DEVICE)
    tables = torch.stack([torch.randperm(pages, generator=gen)[:40] for _ in range(3)]).to(DEVICE, torch.int32)
    starts = torch.tensor([0, 9, 130], device=DEVICE)
    counts = torch.tensor([200, 1, 470], device=DEVICE)  # tile-crossing, single-token and partial last tile
    args = (q, k_flat, tables, page_size, starts, counts, 480, d ** -0.5)
    ours, ref = soft_vote(*args, impl="triton"), soft_vote(*args, impl="reference")
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    torch.testing.assert_close(ours.nan_to_num(neginf=0), ref.nan_to_num(neginf=0), **TOL[dtype])
    # each head's softmax sums to one: the votes of a row sum to H
    torch.testing.assert_close(ref.nan_to_num(neginf=0).sum(1), torch.full((3,), float(heads), device=DEVICE))


# ---- selection, key lists, positions (method called directly on a random cache) ---------------------------
# Per-block and per-step selection alone (question_tokens=0): question-time selection has its own tests.
# Pool width 5, not the default: a wide pool over so few candidates makes runs of equal pooled votes, which
# torch.topk orders arbitrarily (the recomputed selection could then differ by a tie).
SMALL = TokenSelectConfig(select_tokens=24, sink_tokens=8, local_tokens=16, query_block_size=32, question_tokens=0,
                          vote_pool_size=5)


class Setup:
    """One layer, random keys/values in a shuffled paged cache, the method and a batch builder."""

    def __init__(self, T: int, config: TokenSelectConfig = SMALL, seed: int = 0):
        self.mc = ModelConfig(model_type="llama", vocab_size=16, hidden_size=64, intermediate_size=64, num_layers=1,
                              num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                              max_position_embeddings=64)
        gen = torch.Generator().manual_seed(seed)
        page_size, pages = 8, -(-T // 8) + 2
        self.cache, self.page_table = random_paged_cache(1, pages, page_size, 2, 16, gen)
        self.rope = RotaryEmbedding(self.mc, 64)
        self.method = TokenSelectAttention(self.mc, config)
        self.state = self.method.new_state()
        self.gen = gen

    def slice(self, start_pos: int, n: int, prefill: bool) -> tuple[SequenceSlice, ForwardBatch]:
        s = SequenceSlice(0, 0, n, start_pos, start_pos, self.page_table, self.cache, self.state, prefill)
        return s, ForwardBatch([s], self.cache, self.rope, n)

    def keys(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slots = token_slots(self.page_table, tokens, self.cache.page_size)
        return self.cache.flat_k(0)[slots], self.cache.flat_v(0)[slots]


def oracle_selection(setup: Setup, q: torch.Tensor, limit: int) -> set[int]:
    """Top-k head soft vote of candidates [sink, limit) for one pre-RoPE query q [H, d], recomputed here."""
    c = setup.method.config
    tokens = torch.arange(c.sink_tokens, limit)
    k, _ = setup.keys(tokens)
    rope = setup.rope
    q_rot = apply_rotary(q, rope.cos[c.local_tokens], rope.sin[c.local_tokens])  # keys at 0, query at local
    logits = torch.einsum("hd,nhd->hn", q_rot, k.repeat_interleave(2, dim=1)) / 4.0  # d = 16
    votes = torch.softmax(logits, dim=-1).sum(0)
    half = c.vote_pool_size // 2  # each candidate takes the best vote within `half` candidates of it
    votes = torch.stack([votes[max(0, i - half): i + half + 1].max() for i in range(votes.numel())])
    return set((tokens[votes.topk(c.select_tokens).indices]).tolist())


def attention_oracle(setup: Setup, q: torch.Tensor, key_tokens: torch.Tensor, q_pos: int) -> torch.Tensor:
    """One query q [H, d] over key_tokens (all visible), keys rotated at 0..K-1, query at q_pos -> [H, d]."""
    k, v = setup.keys(key_tokens)
    K = key_tokens.numel()
    k = apply_rotary(k, setup.rope.cos[:K, None], setup.rope.sin[:K, None]).repeat_interleave(2, dim=1)
    qr = apply_rotary(q, setup.rope.cos[q_pos], setup.rope.sin[q_pos])
    probs = torch.softmax(torch.einsum("hd,nhd->hn", qr, k) / 4.0, dim=-1)
    return torch.einsum("hn,nhd->hd", probs, v.repeat_interleave(2, dim=1))


def recorded(monkeypatch, name: str) -> list:
    calls = []
    original = getattr(method_module, name)

    def record(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(method_module, name, record)
    return calls


def test_decode_attends_sink_top_soft_vote_and_local_at_contiguous_positions(monkeypatch):
    T = 300
    setup = Setup(T)
    c = setup.method.config
    calls = recorded(monkeypatch, "sparse_attention_decode")
    q = torch.randn(1, 4, 16, generator=setup.gen)
    seq, batch = setup.slice(T - 1, 1, prefill=False)
    out = setup.method.decode(0, q, [seq], batch)

    key_tokens, key_counts = calls[0][5], calls[0][6]
    listed = key_tokens[0, : int(key_counts[0])].long()
    window_start = T - c.local_tokens  # the query at T - 1 and the 15 tokens before it
    expected = sorted(set(range(c.sink_tokens)) | oracle_selection(setup, q[0], window_start) | set(range(window_start, T)))
    assert listed.tolist() == expected
    assert len(expected) == c.attended_tokens
    torch.testing.assert_close(out[0], attention_oracle(setup, q[0], listed, len(expected) - 1), rtol=1e-5, atol=1e-5)


def test_vote_pool_selects_spans_around_the_peaks(monkeypatch):
    T = 300
    setup = Setup(T, dataclasses.replace(SMALL, vote_pool_size=5))
    c = setup.method.config
    calls = recorded(monkeypatch, "sparse_attention_decode")
    q = torch.randn(1, 4, 16, generator=setup.gen)
    seq, batch = setup.slice(T - 1, 1, prefill=False)
    setup.method.decode(0, q, [seq], batch)

    listed = calls[0][5][0, : int(calls[0][6][0])].long()
    window_start = T - c.local_tokens
    chosen = oracle_selection(setup, q[0], window_start)
    assert listed.tolist() == sorted(set(range(c.sink_tokens)) | chosen | set(range(window_start, T)))
    assert all(c.sink_tokens <= t < window_start for t in chosen)  # pooling never reaches past the candidates
    # spans: the selection differs from the unpooled one and most picks have a picked neighbour
    assert chosen != oracle_selection(Setup(T, dataclasses.replace(SMALL, vote_pool_size=1)), q[0], window_start)
    assert sum((t - 1 in chosen) or (t + 1 in chosen) for t in chosen) >= len(chosen) // 2


def test_prefill_blocks_select_with_their_mean_query(monkeypatch):
    start, n = 200, 70  # blocks of 32 queries: [200, 232), [232, 264), [264, 270)
    setup = Setup(start + n)
    c = setup.method.config
    calls = recorded(monkeypatch, "sparse_attention_prefill")
    q = torch.randn(n, 4, 16, generator=setup.gen)
    seq, batch = setup.slice(start, n, prefill=True)
    setup.method.prefill(0, q, seq, batch)

    key_tokens, key_counts, query_rope = calls[0][5], calls[0][6], calls[0][9]
    for b, first in enumerate(range(start, start + n, 32)):
        last = min(first + 32, start + n) - 1
        ws = first + 1 - c.local_tokens
        chosen = oracle_selection(setup, q[first - start : last - start + 1].mean(0), ws)
        expected = sorted(set(range(c.sink_tokens)) | chosen | set(range(ws, last + 1)))
        assert key_tokens[b, : int(key_counts[b])].tolist() == expected
        # queries are numbered right after the selected tokens, contiguously
        before = c.sink_tokens + c.select_tokens
        assert query_rope[first - start : last - start + 1].tolist() == list(range(before + first - ws, before + last + 1 - ws))


def test_selection_cache_hits_on_a_repeated_query_and_misses_on_a_new_one(monkeypatch):
    T = 300
    setup = Setup(T)
    calls = recorded(monkeypatch, "sparse_attention_decode")
    q1 = torch.randn(1, 4, 16, generator=setup.gen)
    q2 = torch.randn(1, 4, 16, generator=setup.gen)  # independent: cosine ~ 0 < 0.9
    steps = [q1, 1.5 * q1, q2, q2]  # a scaled query has cosine 1 (hit)
    for i, q in enumerate(steps):
        seq, batch = setup.slice(T - 4 + i, 1, prefill=False)
        setup.method.decode(0, q, [seq], batch)
    assert (setup.state.hits, setup.state.misses) == ([2], [2])
    assert setup.method.stats(setup.state) == {"hits": 2, "misses": 2, "hit_ratio": 0.5}
    # A hit keeps the selection and stretches the window back to the selection's window start.
    first, hit = [c[5][0, : int(c[6][0])].tolist() for c in calls[:2]]
    assert hit == first + [T - 3]
    # Off: every step selects.
    off = Setup(T, dataclasses.replace(SMALL, selection_cache=False))
    for i in range(3):
        seq, batch = off.slice(T - 3 + i, 1, prefill=False)
        off.method.decode(0, q1, [seq], batch)
    assert (off.state.hits, off.state.misses) == ([0], [3])


# ---- in the engine ----------------------------------------------------------------------------------------
def _generate(engine, ids, n=6):
    seq = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    while engine.has_work:
        engine.step()
    return seq


@pytest.mark.parametrize("impl", ["auto", pytest.param("triton", marks=pytest.mark.slow)])
def test_equals_dense_when_the_budget_covers_the_context(tiny_llama_dir, impl):
    ids = torch.randint(0, 512, (700,), generator=torch.Generator().manual_seed(0)).tolist()
    kw = dict(max_context_tokens=2048, prefill_chunk_size=256)
    dense = engine_for_dir(tiny_llama_dir, None, None, method="dense", **kw)
    wide = TokenSelectConfig(select_tokens=1024, sink_tokens=16, local_tokens=64, query_block_size=64, impl=impl)
    ours = engine_for_dir(tiny_llama_dir, None, wide, method="tokenselect", **kw)
    torch.testing.assert_close(ours.prompt_logits(ids), dense.prompt_logits(ids), rtol=1e-5, atol=1e-5)
    assert _generate(ours, ids).output_ids == _generate(dense, ids).output_ids

    small = TokenSelectConfig(select_tokens=64, sink_tokens=16, local_tokens=64, query_block_size=64, impl=impl)
    sparse = engine_for_dir(tiny_llama_dir, None, small, method="tokenselect", **kw)
    assert (sparse.prompt_logits(ids) - dense.prompt_logits(ids))[-100:].abs().max() > 1e-3  # really sparse
    seq = _generate(sparse, ids)
    stats = sparse.method.stats(seq.method_state)
    assert stats["hits"] + stats["misses"] == 2 * 5  # 2 layers x 5 decode steps (token 1 comes from prefill)


@pytest.mark.slow  # a real-model retrieval (10-16 s of CPU): CI's slow pass (make test-slow)
def test_embedded_model_finds_passkey_with_a_small_budget():
    from infinitehip import LLM, EngineConfig
    from infinitehip.engine.llm_engine import LLMEngine
    from infinitehip.eval.passkey import make_passkey_sample
    from infinitehip.model.gguf_convert import default_cache_root
    from infinitehip.model.loading import load_model

    loaded = load_model(None, default_cache_root(), torch.device("cpu"), torch.float32)
    config = TokenSelectConfig(select_tokens=256, sink_tokens=64, local_tokens=128, query_block_size=128,
                               question_select_tokens=128)
    engine = LLMEngine(EngineConfig(device="cpu", dtype="float32", show_progress=False, method="tokenselect",
                                    max_context_tokens=4096, method_config=config), loaded)
    sample = make_passkey_sample(loaded.tokenizer, 2500, 0.5, 3)
    (out,) = LLM.from_engine(engine).chat(sample.messages, SamplingParams(temperature=0.0, max_tokens=12))
    assert sample.is_correct(out.text), (sample.answer, out.text)
    assert len(out.prompt_token_ids) > 4 * config.attended_tokens  # the answer came through the selection


# ---- configuration ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, field", [
    (dict(select_tokens=0), "select_tokens"), (dict(sink_tokens=-1), "sink_tokens"), (dict(local_tokens=0), "local_tokens"),
    (dict(query_block_size=0), "query_block_size"), (dict(vote_pool_size=4), "vote_pool_size"), (dict(selection_cache_threshold=1.5), "selection_cache_threshold"),
    (dict(impl="cuda"), "impl"),
])
def test_config_errors_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        TokenSelectConfig(**overrides)


def test_cli_flags_build_the_config():
    import argparse

    from infinitehip.cli.method_options import add_method_flags, method_config_from_args
    from infinitehip.config.engine import EngineConfig

    parser = argparse.ArgumentParser()
    add_method_flags(parser)
    args = parser.parse_args(["--select-tokens", "256", "--sink-tokens", "64", "--selection-cache", "false",
                              "--selection-cache-threshold", "0.8"])
    config = method_config_from_args(EngineConfig(method="tokenselect"), args)
    assert config == TokenSelectConfig(select_tokens=256, sink_tokens=64, selection_cache=False, selection_cache_threshold=0.8)
    assert TokenSelectAttention(Setup(8).mc).own_kv_sizing().default_max_context_tokens >= 1 << 17

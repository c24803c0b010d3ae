"""HiP attention v1 (`attention/methods/hip/`): the hierarchical top-k estimation against brute force and its eager
reference, dense layers and short contexts equal to dense attention, the decode mask's refresh schedule."""

from __future__ import annotations

import pytest
import torch

from infinitehip.attention.base import ForwardBatch, SequenceSlice
from infinitehip.attention.methods.hip.config import HiPConfig
from infinitehip.attention.methods.hip.hierarchy import num_blocks, select_blocks, select_blocks_reference
from infinitehip.attention.methods.hip.method import HiPAttention
from infinitehip.config.model import ModelConfig
from infinitehip.kv.paged_cache import token_slots
from infinitehip.model.rope import RotaryEmbedding, apply_rotary
from tests.conftest import engine_for_dir, generate_greedy, random_ids
from tests.paged_helpers import random_paged_cache

H, HKV, D = 4, 2, 16


class Setup:
    """One or more layers of random keys/values in a shuffled paged cache, a RoPE table and the method."""

    def __init__(self, T: int, config: HiPConfig, layers: int = 1, seed: int = 0):
        self.mc = ModelConfig(model_type="llama", vocab_size=16, hidden_size=64, intermediate_size=64,
                              num_layers=layers, num_heads=H, num_kv_heads=HKV, head_dim=D, rms_norm_eps=1e-5,
                              rope_theta=10000.0, max_position_embeddings=4096)
        self.gen = torch.Generator().manual_seed(seed)
        page_size, pages = 8, -(-T // 8) + 2
        self.cache, self.page_table = random_paged_cache(layers, pages, page_size, HKV, D, self.gen)
        self.rope = RotaryEmbedding(self.mc, T + 8)
        self.method = HiPAttention(self.mc, config)
        self.state = self.method.new_state()

    def slice(self, start_pos: int, n: int, prefill: bool) -> tuple[SequenceSlice, ForwardBatch]:
        s = SequenceSlice(0, 0, n, start_pos, start_pos, self.page_table, self.cache, self.state, prefill)
        return s, ForwardBatch([s], self.cache, self.rope, n)

    def set_keys(self, tokens: torch.Tensor, k: torch.Tensor) -> None:
        self.cache.flat_k(0)[token_slots(self.page_table, tokens, self.cache.page_size)] = k

    def dense(self, layer: int, q: torch.Tensor, start: int) -> torch.Tensor:
        """Exact causal attention of q [n, H, d] at positions start.. over every key up to each -> [n, H, d]."""
        n = q.shape[0]
        tokens = torch.arange(start + n)
        slots = token_slots(self.page_table, tokens, self.cache.page_size)
        k, v = self.cache.flat_k(layer)[slots], self.cache.flat_v(layer)[slots]
        k = apply_rotary(k, self.rope.cos[tokens, None], self.rope.sin[tokens, None]).repeat_interleave(H // HKV, 1)
        qpos = torch.arange(start, start + n)
        qr = apply_rotary(q, self.rope.cos[qpos, None], self.rope.sin[qpos, None])
        scores = torch.einsum("nhd,thd->hnt", qr, k) * D ** -0.5
        scores = scores.masked_fill(tokens[None, None, :] > qpos[None, :, None], float("-inf"))
        return torch.einsum("hnt,thd->nhd", torch.softmax(scores, -1), v.repeat_interleave(H // HKV, 1))


def _rotated_queries(setup: Setup, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return apply_rotary(q, setup.rope.cos[positions, None], setup.rope.sin[positions, None])


# ---- the hierarchy -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("direction", ["rising", "falling"])
@pytest.mark.parametrize("T,K,bk,sink", [(300, 4, 2, 4), (517, 8, 2, 0), (260, 3, 4, 5)])
def test_hierarchy_finds_the_true_top_blocks_when_scores_are_monotone(direction, T, K, bk, sink):
    """Keys scaled so every query's score rises (falls) with the position: the center of the better half is always
    better, so the hierarchy is exact and must find the brute-force top K blocks (by their best key) -- the last
    (first) K blocks; the reference agrees."""
    setup = Setup(T, HiPConfig(top_k_tokens=K * bk, key_block_size=bk, sink_tokens=sink))
    end = T - 7
    tokens = torch.arange(T)
    # identical keys of growing norm along one direction; the rope table is flat (positions don't rotate it)
    setup.rope.cos.fill_(1.0)
    setup.rope.sin.fill_(0.0)
    scale = (tokens + 1.0) if direction == "rising" else (T - tokens + 0.0)
    setup.set_keys(tokens, scale[:, None, None] * torch.ones(T, HKV, D))
    q = torch.rand(2, 3, H, D, generator=setup.gen) + 0.1  # positive queries: score = norm * positive constant
    ends = torch.tensor([end, end - 11])
    args = (setup.cache.flat_k(0), setup.page_table, setup.cache.page_size, setup.rope.cos, setup.rope.sin, ends,
            sink, K, bk)
    starts, lens = select_blocks(q, *args)
    ref_starts, ref_lens = select_blocks_reference(q, *args)
    for m in range(2):
        n = int(num_blocks(ends[m : m + 1], sink, bk))
        block_starts = sink + torch.arange(n) * bk
        best = torch.stack([scale[s : min(s + bk, int(ends[m]))].max() for s in block_starts.tolist()])
        want = block_starts[best.topk(K).indices].sort().values
        assert starts[m].tolist() == ref_starts[m].tolist() == want.tolist()
        assert lens[m].tolist() == ref_lens[m].tolist() == [min(bk, int(ends[m]) - s) for s in want.tolist()]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hierarchy_op_equals_its_reference_on_random_keys(seed):
    """Random keys and queries (the hierarchy then approximates): the batched op picks what the eager reference picks,
    K distinct blocks inside the candidates, for rows of different lengths."""
    T, K, bk, sink = 700, 6, 2, 16
    setup = Setup(T, HiPConfig(top_k_tokens=K * bk, key_block_size=bk, sink_tokens=sink), seed=seed)
    ends = torch.tensor([T, 600, sink + 2 * K * bk, 455])
    positions = torch.arange(4 * 5).view(4, 5) + ends[:, None]
    q = torch.randn(4, 5, H, D, generator=setup.gen)
    q_rot = _rotated_queries(setup, q.flatten(0, 1), positions.flatten().clamp(max=T + 7)).view(4, 5, H, D)
    args = (setup.cache.flat_k(0), setup.page_table, setup.cache.page_size, setup.rope.cos, setup.rope.sin, ends,
            sink, K, bk)
    starts, lens = select_blocks(q_rot, *args)
    ref_starts, ref_lens = select_blocks_reference(q_rot, *args)
    assert torch.equal(starts, ref_starts) and torch.equal(lens, ref_lens)
    assert (starts >= sink).all() and (starts + lens <= ends[:, None]).all() and (lens > 0).all()
    assert all(len(set(row)) == K for row in starts.tolist())


# ---- the method ----------------------------------------------------------------------------------------------
SMALL = HiPConfig(top_k_tokens=8, key_block_size=2, query_block_size=4, sink_tokens=4, window_tokens=16,
                  refresh_interval=8, dense_layers=1)


@pytest.mark.parametrize("impl", ["auto", "reference"])
def test_first_layers_and_short_contexts_equal_dense_attention(impl):
    """Layer 0 (dense_layers=1) equals dense attention at any length; layer 1 equals it while every block's
    candidates span fewer than 2 * top_k_tokens keys (prefill chunk of positions < 4 + 16 + 16), and differs once
    the selection runs."""
    config = HiPConfig(**{**SMALL.__dict__, "impl": impl})
    T = 160
    setup = Setup(T, config, layers=2)
    q = torch.randn(T, H, D, generator=setup.gen)
    for layer in (0, 1):
        s, batch = setup.slice(0, 36, True)
        torch.testing.assert_close(setup.method.prefill(layer, q[:36], s, batch), setup.dense(layer, q[:36], 0),
                                   rtol=1e-4, atol=1e-5)
        s, batch = setup.slice(36, T - 36, True)
        got = setup.method.prefill(layer, q[36:], s, batch)
        want = setup.dense(layer, q[36:], 36)
        if layer == 0:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        else:
            assert (got - want).abs().max() > 1e-3


def test_prefill_attends_sinks_selected_blocks_and_window():
    """A selecting block's output equals exact attention over the sinks, the blocks the reference selects for the
    block and the window from its first query (causal)."""
    T = 200
    setup = Setup(T, SMALL, layers=2)
    q = torch.randn(8, H, D, generator=setup.gen)
    start = T - 8
    s, batch = setup.slice(start, 8, True)
    out = setup.method.prefill(1, q, s, batch)
    c = SMALL
    for m in range(2):
        first = start + 4 * m
        end = first - c.window_tokens + 1
        q_rot = _rotated_queries(setup, q[4 * m : 4 * m + 4], torch.arange(first, first + 4))
        st, ln = select_blocks_reference(q_rot[None], setup.cache.flat_k(1), setup.page_table, setup.cache.page_size,
                                         setup.rope.cos, setup.rope.sin, torch.tensor([end]), c.sink_tokens,
                                         c.top_k_blocks, c.key_block_size)
        selected = [t for a, n in zip(st[0].tolist(), ln[0].tolist()) for t in range(a, a + n)]
        for i in range(4):
            pos = first + i
            keys = torch.tensor(list(range(c.sink_tokens)) + selected + list(range(end, pos + 1)))
            slots = token_slots(setup.page_table, keys, setup.cache.page_size)
            k = apply_rotary(setup.cache.flat_k(1)[slots], setup.rope.cos[keys, None], setup.rope.sin[keys, None])
            v = setup.cache.flat_v(1)[slots]
            qr = _rotated_queries(setup, q[4 * m + i][None], torch.tensor([pos]))[0]
            probs = torch.softmax(torch.einsum("hd,thd->ht", qr, k.repeat_interleave(2, 1)) * D ** -0.5, -1)
            want = torch.einsum("ht,thd->hd", probs, v.repeat_interleave(2, 1))
            torch.testing.assert_close(out[4 * m + i], want, rtol=1e-4, atol=1e-5)


def test_decode_refreshes_its_mask_every_refresh_interval_steps():
    """Decode steps 0, 8, 16 recompute the layer's selection, the others reuse it; a reused step attends the kept
    blocks plus a window reaching back to the kept candidates' end (the new keys), a refreshed one its own."""
    T0, steps = 120, 20
    setup = Setup(T0 + steps + 1, SMALL, layers=2)
    q = torch.randn(steps, H, D, generator=setup.gen)
    kept, refreshed = [], []
    for i in range(steps):
        s, batch = setup.slice(T0 + i, 1, False)
        before = setup.state.refreshes[1]
        setup.method.decode(1, q[i : i + 1], [s], batch)
        if setup.state.refreshes[1] > before:
            refreshed.append(i)
        assert setup.state.end[1].item() == setup.state.ends[1]  # the device copy the graphs read
        kept.append((setup.state.starts[1].tolist(), setup.state.ends[1]))
    assert refreshed == [0, 8, 16]
    assert setup.state.decode_steps[1] == steps
    for i in range(steps):
        r = i - i % 8
        assert kept[i] == kept[r]  # reused between refreshes
        assert kept[i][1] == T0 + r - SMALL.window_tokens + 1  # the end of the refreshing step's candidates
    assert kept[8] != kept[0] or kept[16] != kept[8]


def test_engine_generation_is_deterministic_frees_pages_and_runs_sparse(tiny_llama_dir):
    """Through the engine on the tiny model (query blocks of 1, refresh every step): generation is deterministic and
    frees its pages, and the prompt's tail runs the sparse path (its logits differ from dense)."""
    config = HiPConfig(top_k_tokens=8, key_block_size=2, query_block_size=1, sink_tokens=4, window_tokens=16,
                       refresh_interval=1, dense_layers=1)
    ids = random_ids(200, seed=3)
    engine = engine_for_dir(tiny_llama_dir, None, config, method="hip", max_context_tokens=2048)
    first = generate_greedy(engine, ids, 6).output_ids
    assert generate_greedy(engine, ids, 6).output_ids == first
    assert engine.scheduler.allocator.num_free == engine.scheduler.allocator.num_pages
    dense = engine_for_dir(tiny_llama_dir, None, None, method="dense", max_context_tokens=2048).prompt_logits(ids)
    assert (engine.prompt_logits(ids) - dense).abs().max() > 1e-2

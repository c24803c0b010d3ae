"""The CPU formulations of infinitehip's prefill ops vs their eager oracles, on fresh random inputs: the SDPA
sparse attention (method-shaped key lists), streaming RoPE positions, the landmark saliency update (window
sums), representative chunk scores (batched GEMMs), and whole pruning stages (same chunks kept)."""

import pytest
import torch

from infinitehip.attention.ops.sparse import op as sparse
from infinitehip.attention.methods.infinitehip.positions import attention_positions
from infinitehip.attention.methods.infinitehip.pruning import StageSpec, keep_top_chunks, query_blocks, run_stage
from infinitehip.attention.methods.infinitehip.saliency import KeySaliency
from infinitehip.attention.methods.infinitehip.scoring.op import representative_scores
from infinitehip.attention.methods.infinitehip.scoring.representative.cpu import representative_scores_cpu
from infinitehip.config.model import ModelConfig
from infinitehip.kv.paged_cache import PagedKVCache, token_slots
from infinitehip.model.rope import RotaryEmbedding
from tests.rope_helpers import rope_tables
from tests.attention.test_landmark_kernels import make_scores_case


def method_lists(start, n, b, sink, stream, keep, chunk, gen):
    """Key lists as `assemble_keys` builds them: sink + `keep` tokens of random whole chunks below the window +
    window [max(sink, e + 1 - stream), e], sorted, padded with token 0 -> (tokens [M, K], counts [M], ws [M])."""
    lists, window_starts = [], []
    for m in range(-(-n // b)):
        e = start + min((m + 1) * b, n) - 1
        ws = max(sink, e + 1 - stream)
        chunks = torch.arange(sink, ws, chunk)
        if (ws - sink) > keep:
            chunks = chunks[torch.randperm(len(chunks), generator=gen)[: keep // chunk]].sort().values
        selected = (chunks[:, None] + torch.arange(chunk)).flatten()
        selected = selected[selected < ws]
        lists.append(torch.cat([torch.arange(min(sink, e + 1)), selected, torch.arange(ws, e + 1)]))
        window_starts.append(ws)
    K = max(len(t) for t in lists)
    tokens = torch.zeros(len(lists), K, dtype=torch.long)
    for m, t in enumerate(lists):
        tokens[m, : len(t)] = t
    return tokens, torch.tensor([len(t) for t in lists]), torch.tensor(window_starts)


@pytest.mark.parametrize("start,n", [(0, 200), (300, 157), (517, 64)])
def test_sdpa_prefill_equals_reference_on_method_lists(start, n):
    gen = torch.Generator().manual_seed(start + n)
    H, Hkv, d, b, page_size = 6, 2, 32, 16, 8
    L = start + n
    pages = -(-L // page_size) + 2
    k = torch.randn(pages * page_size, Hkv, d, generator=gen)
    v = torch.randn(pages * page_size, Hkv, d, generator=gen)
    page_table = torch.randperm(pages, generator=gen)[: -(-L // page_size)].int()
    q = torch.randn(n, H, d, generator=gen)
    tokens, counts, ws = method_lists(start, n, b, sink=16, stream=64, keep=96, chunk=4, gen=gen)
    query_pos = torch.arange(start, L)
    key_rope, query_rope = attention_positions("streaming", tokens, counts, ws, query_pos, torch.arange(n) // b, L, 4096)
    cos, sin = rope_tables(L + tokens.shape[1], d, device=torch.device("cpu"))
    args = (q, k, v, page_table, page_size, tokens.int(), counts.int(), key_rope, query_pos.int(), query_rope, b,
            cos, sin, d**-0.5)
    torch.testing.assert_close(sparse.sparse_attention_prefill(*args, impl="cpu"),
                               sparse.sparse_attention_prefill(*args, impl="reference"), rtol=1e-5, atol=1e-5)


def test_sdpa_prefill_empty_block_and_small_groups(monkeypatch):
    """A block with no listed key gets zeros; several SDPA groups (GROUP_KEYS small) give the same result."""
    from infinitehip.attention.ops.sparse import sdpa

    gen = torch.Generator().manual_seed(7)
    H, Hkv, d, b, page_size, start, n = 4, 1, 16, 8, 4, 40, 50
    L = start + n
    pages = -(-L // page_size) + 1
    k, v = torch.randn(pages * page_size, Hkv, d, generator=gen), torch.randn(pages * page_size, Hkv, d, generator=gen)
    page_table = torch.randperm(pages, generator=gen)[: -(-L // page_size)].int()
    q = torch.randn(n, H, d, generator=gen)
    tokens, counts, ws = method_lists(start, n, b, sink=4, stream=16, keep=12, chunk=4, gen=gen)
    counts[2] = 0
    query_pos = torch.arange(start, L)
    key_rope, query_rope = attention_positions("streaming", tokens, counts, ws, query_pos, torch.arange(n) // b, L, 4096)
    cos, sin = rope_tables(L + tokens.shape[1], d, device=torch.device("cpu"))
    args = (q, k, v, page_table, page_size, tokens.int(), counts.int(), key_rope, query_pos.int(), query_rope, b,
            cos, sin, d**-0.5)
    expect = sparse.sparse_attention_prefill(*args, impl="reference")
    assert (expect[2 * b : 3 * b] == 0).all()
    whole = sparse.sparse_attention_prefill(*args, impl="cpu")
    monkeypatch.setattr(sdpa, "GROUP_KEYS", 2 * tokens.shape[1])
    grouped = sparse.sparse_attention_prefill(*args, impl="cpu")
    assert (whole[2 * b : 3 * b] == 0).all() and (grouped[2 * b : 3 * b] == 0).all()
    torch.testing.assert_close(whole, expect, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grouped, expect, rtol=1e-5, atol=1e-5)


def test_streaming_query_positions_are_ranks_in_the_block_list():
    gen = torch.Generator().manual_seed(1)
    M, K, b = 7, 40, 5
    tokens = torch.stack([torch.randperm(300, generator=gen)[:K].sort().values for _ in range(M)])
    counts = torch.randint(0, K + 1, (M,), generator=gen)
    query_block = torch.arange(M * b) // b
    query_pos = torch.randint(0, 320, (M * b,), generator=gen)
    query_pos[::7] = tokens[query_block[::7], 3]  # some queries sit exactly on a listed token
    key_rope, query_rope = attention_positions("streaming", tokens, counts, torch.zeros(M, dtype=torch.long),
                                               query_pos, query_block, 320, 4096)
    for i in range(M * b):
        m = query_block[i]
        assert query_rope[i] == (tokens[m, : counts[m]] < query_pos[i]).sum()
    assert torch.equal(key_rope, torch.arange(K).expand(M, K).int())


def _model_config(H, Hkv, d):
    return ModelConfig.from_hf_dict({
        "model_type": "llama", "hidden_size": H * d, "num_attention_heads": H, "num_key_value_heads": Hkv,
        "num_hidden_layers": 1, "intermediate_size": 32, "vocab_size": 64, "max_position_embeddings": 256,
    })


def _cache(T, H, Hkv, d, page_size, gen):
    pages = -(-T // page_size)
    cache = PagedKVCache(1, pages + 3, page_size, Hkv, d, torch.float32, "cpu")
    page_table = torch.randperm(pages + 3, generator=gen)[:pages].int()
    k = torch.randn(T, Hkv, d, generator=gen)
    cache.write(0, token_slots(page_table, torch.arange(T), page_size), k, torch.zeros_like(k))
    return cache, page_table, torch.randn(T, H, d, generator=gen)


@pytest.mark.parametrize("chunks", [[(0, 300)], [(0, 37), (37, 200), (200, 201), (201, 330)]])
def test_saliency_window_sums_equal_pair_logits(chunks):
    gen = torch.Generator().manual_seed(len(chunks))
    H, Hkv, d, T = 6, 2, 32, chunks[-1][1]
    cache, page_table, q = _cache(T, H, Hkv, d, 16, gen)
    rope = RotaryEmbedding(_model_config(H, Hkv, d), 2 * T)
    stores = {impl: KeySaliency(window=48) for impl in ("reference", "cpu")}
    for impl, store in stores.items():
        for a, e in chunks:
            store.update(0, q[a:e], a, page_table, cache, rope, impl=impl)
    ref, cpu = stores["reference"], stores["cpu"]
    assert torch.equal(cpu._count[0], ref._count[0])
    torch.testing.assert_close(cpu._sum[0], ref._sum[0], rtol=1e-5, atol=1e-4)
    starts = torch.arange(0, T - 8, 8)[None]
    lens = torch.full_like(starts, 8)
    assert torch.equal(cpu.representatives(0, starts, lens, page_table, 16, 8),
                       ref.representatives(0, starts, lens, page_table, 16, 8))


@pytest.mark.parametrize("group,base_kind,rep_offset", [(None, "zero", 1), (None, "rank", 0), (None, "const", 1),
                                                        (3, "zero", 0), (1, "zero", 0)])
def test_representative_scores_cpu_equals_reference(group, base_kind, rep_offset):
    # block 2 has no valid query; chunks of up to 8 tokens, some padding
    args = make_scores_case(5, 12, 6, 2, 32, 40, 8, torch.float32, group, base_kind, rep_offset,
                            seed=rep_offset + (group or 0), chunk=8)
    ref = representative_scores(*args, impl="reference")
    for group_elements in (1 << 21, 1):  # one group; one block per group
        cpu = representative_scores_cpu(*args, group_elements=group_elements)
        assert torch.equal(torch.isneginf(cpu), args[6] == 0)
        assert (cpu[2][args[6][2] > 0] == torch.finfo(torch.float32).min).all()
        torch.testing.assert_close(cpu, ref, rtol=1e-5, atol=1e-5)
        starts = args[5][..., 0]
        for keep in (3, 10):
            assert all(torch.equal(x, y) for x, y in zip(keep_top_chunks(starts, args[6], cpu, keep),
                                                         keep_top_chunks(starts, args[6], ref, keep)))


@pytest.mark.parametrize("style", ["relative", "chunk_indexed"])
def test_pruning_stages_cpu_keep_the_reference_chunks(style):
    """Three landmark pruning stages over a prefill chunk: impl "cpu" (window-sum saliency, GEMM scores) keeps
    exactly the chunks of impl "reference"."""
    gen = torch.Generator().manual_seed(11)
    H, Hkv, d, T = 6, 2, 32, 900
    cache, page_table, q = _cache(T, H, Hkv, d, 16, gen)
    rope = RotaryEmbedding(_model_config(H, Hkv, d), 2 * T)
    specs = [StageSpec(32, 32, 256, style), StageSpec(16, 8, 96, style), StageSpec(8, 2, 32, style)]
    outs = {}
    for impl in ("reference", "cpu"):
        store = KeySaliency(window=32)
        for a in range(0, T, 300):
            store.update(0, q[a : a + 300], a, page_table, cache, rope, impl=impl)
        parent, start = None, T - 300
        for spec in specs:
            blocks = query_blocks(q[start:], start, spec.query_block_size)
            if parent is not None:
                parent = parent.for_blocks(torch.arange(blocks.q.shape[0]) * spec.query_block_size // parent.query_block_size)
            parent = run_stage(spec, blocks, parent, cache.flat_k(0), page_table, cache.page_size, 16, 64, rope, T, 128,
                               impl, (store, 0))
            outs.setdefault(impl, []).append((parent.chunk_starts, parent.chunk_lens))
    for (s_ref, l_ref), (s_cpu, l_cpu) in zip(outs["reference"], outs["cpu"]):
        assert torch.equal(s_ref, s_cpu) and torch.equal(l_ref, l_cpu)
    assert outs["cpu"][0][0].shape[1] < -(-(T - 64 - 16) // 32)  # stage 1 really pruned


def test_scratch_buffers_serve_inside_and_outside_inference_mode():
    from infinitehip.attention.ops.sparse.scratch import ScratchBuffers

    scratch = ScratchBuffers()
    with torch.inference_mode():
        scratch.take("x", (4, 3), torch.float32, torch.device("cpu")).fill_(1.0)
    x = scratch.take("x", (2, 6), torch.float32, torch.device("cpu")).fill_(2.0)  # same buffer, in place outside
    assert x.shape == (2, 6) and (x == 2).all()
    assert scratch.take("x", (100,), torch.float32, torch.device("cpu")).numel() == 100  # grows


@pytest.mark.parametrize("prefix,W", [(0, 9), (7, 0), (7, 9), (1, 30)])
def test_two_part_attention_equals_one_masked_softmax(prefix, W):
    """Prefix seen by all + masked tail (some rows see no tail key) == one softmax over the visible keys."""
    from infinitehip.attention.ops.sparse.two_part_attention import attend_two_parts, pack_gqa, unpack_gqa

    gen = torch.Generator().manual_seed(prefix * 100 + W)
    m, b, H, Hkv, d = 3, 5, 6, 2, 16
    K = prefix + W + 2  # entries past the tail are never read
    q = torch.randn(m, b, H, d, generator=gen)
    k, v = torch.randn(m, K, Hkv, d, generator=gen), torch.randn(m, K, Hkv, d, generator=gen)
    tail = torch.rand(m, b, W, generator=gen) < 0.5
    tail[0, 1] = False  # a row without a visible tail key
    out = unpack_gqa(attend_two_parts(pack_gqa(q, Hkv), k, v, prefix, tail, 0.3), b)
    visible = torch.cat([torch.ones(m, b, prefix, dtype=torch.bool), tail], -1)  # [m, b, prefix + W]
    kk = k[:, : prefix + W].repeat_interleave(H // Hkv, 2)
    vv = v[:, : prefix + W].repeat_interleave(H // Hkv, 2)
    s = torch.einsum("mbhd,mkhd->mbhk", q, kk).mul(0.3).masked_fill(~visible[:, :, None], float("-inf"))
    expect = torch.einsum("mbhk,mkhd->mbhd", s.softmax(-1), vv)
    seen = visible.any(-1)
    torch.testing.assert_close(out[seen], expect[seen], rtol=1e-5, atol=1e-5)

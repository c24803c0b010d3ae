"""Sparse attention over explicit key lists (paged cache, RoPE on the fly): Triton kernels vs the oracle.

Without a CUDA device the kernels run under the Triton interpreter (tests/conftest.py), so shapes are kept small.
"""

import importlib

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from infinitehip.attention.ops.sparse import op as sparse  # noqa: E402
from infinitehip.attention.ops.sparse.op import reference  # noqa: E402
from infinitehip.model.rope import apply_rotary  # noqa: E402
from tests.rope_helpers import rope_tables  # noqa: E402

tri = importlib.import_module("infinitehip.attention.ops.sparse.triton")
launch = importlib.import_module("infinitehip.attention.ops.sparse.launch")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# the "cpu" implementation runs on CPU tensors only (the dispatch takes it where the cache lives on the CPU)
IMPLS = ("triton", "cpu") if DEVICE.type == "cpu" else ("triton",)
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
PAD_TOKEN = 1 << 20  # fills key lists past key_counts: must never be read


def make_cache(num_pages: int, page_size: int, hkv: int, d: int, dtype, gen):
    shape = (num_pages * page_size, hkv, d)
    k = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    v = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    return k, v


def shuffled_page_table(num_tokens: int, page_size: int, num_pages: int, gen) -> torch.Tensor:
    need = -(-num_tokens // page_size)
    return torch.randperm(num_pages, generator=gen)[:need].to(DEVICE, torch.int32)


def slots_of(page_table, tokens, page_size):
    return reference.token_slots(page_table, torch.as_tensor(tokens, device=DEVICE), page_size)


class PrefillCase:
    """One sequence's prefill chunk at positions start..start+n-1 with sparse per-block key lists.

    Each block lists a random sorted subset of the tokens up to its last query plus all its own query
    tokens (as the caller does), with StreamingLLM-style RoPE: listed keys get 0, 1, 2, ... in order and
    each query gets the id of its own token in its block's list.
    """

    def __init__(self, H, Hkv, d, n, start, qbs, page_size, dtype, seed, density=0.5, dense=False):
        gen = torch.Generator().manual_seed(seed)
        L = start + n
        num_pages = -(-L // page_size) + 3
        self.k, self.v = make_cache(num_pages, page_size, Hkv, d, dtype, gen)
        self.page_table = shuffled_page_table(L, page_size, num_pages, gen)
        self.q = torch.randn(n, H, d, generator=gen).to(DEVICE, dtype)
        self.query_pos = torch.arange(start, L, dtype=torch.int32, device=DEVICE)
        n_blocks = -(-n // qbs)
        lists, qrope = [], torch.empty(n, dtype=torch.int32)
        for b in range(n_blocks):
            first, last = start + b * qbs, start + min((b + 1) * qbs, n) - 1
            if dense:
                toks = torch.arange(0, last + 1)
            else:
                keep = torch.rand(last + 1, generator=gen) < density
                keep[first : last + 1] = True
                toks = keep.nonzero().flatten()
            lists.append(toks)
            for p in range(first, last + 1):
                qrope[p - start] = p if dense else (toks == p).nonzero().item()
        K = max(len(t) for t in lists) + 5
        self.key_tokens = torch.full((n_blocks, K), PAD_TOKEN, dtype=torch.int32)
        self.key_rope_pos = torch.full((n_blocks, K), PAD_TOKEN, dtype=torch.int32)
        for b, toks in enumerate(lists):
            self.key_tokens[b, : len(toks)] = toks
            self.key_rope_pos[b, : len(toks)] = toks if dense else torch.arange(len(toks))
        self.key_tokens, self.key_rope_pos = self.key_tokens.to(DEVICE), self.key_rope_pos.to(DEVICE)
        self.key_counts = torch.tensor([len(t) for t in lists], dtype=torch.int32, device=DEVICE)
        self.query_rope_pos = qrope.to(DEVICE)
        self.lists, self.qbs, self.page_size, self.start = lists, qbs, page_size, start
        self.cos, self.sin = rope_tables(L + K, d)
        self.sm_scale = d**-0.5

    def run(self, impl, k=None, v=None):
        return sparse.sparse_attention_prefill(
            self.q, self.k if k is None else k, self.v if v is None else v, self.page_table, self.page_size,
            self.key_tokens, self.key_counts, self.key_rope_pos, self.query_pos, self.query_rope_pos, self.qbs,
            self.cos, self.sin, self.sm_scale, impl=impl,
        )


class DecodeCase:
    """B sequences of different lengths, one query each, sparse key lists with ragged counts (one empty)."""

    def __init__(self, H, Hkv, d, lengths, page_size, dtype, seed, density=0.6):
        gen = torch.Generator().manual_seed(seed)
        B, p_max = len(lengths), -(-max(lengths) // page_size)
        num_pages = sum(-(-L // page_size) for L in lengths) + 2
        self.k, self.v = make_cache(num_pages, page_size, Hkv, d, dtype, gen)
        perm = torch.randperm(num_pages, generator=gen)
        self.page_tables = torch.zeros(B, p_max, dtype=torch.int32)
        used = 0
        for b, L in enumerate(lengths):
            need = -(-L // page_size)
            self.page_tables[b, :need] = perm[used : used + need]
            used += need
        self.page_tables = self.page_tables.to(DEVICE)
        self.q = torch.randn(B, H, d, generator=gen).to(DEVICE, dtype)
        lists = []
        for L in lengths:
            keep = torch.rand(L, generator=gen) < density
            if L:
                keep[-1] = True
            lists.append(keep.nonzero().flatten())
        K = max(len(t) for t in lists) + 3
        self.key_tokens = torch.full((B, K), PAD_TOKEN, dtype=torch.int32)
        self.key_rope_pos = torch.full((B, K), PAD_TOKEN, dtype=torch.int32)
        for b, toks in enumerate(lists):
            self.key_tokens[b, : len(toks)] = toks
            self.key_rope_pos[b, : len(toks)] = torch.arange(len(toks))
        self.key_tokens, self.key_rope_pos = self.key_tokens.to(DEVICE), self.key_rope_pos.to(DEVICE)
        self.key_counts = torch.tensor([len(t) for t in lists], dtype=torch.int32, device=DEVICE)
        # The query is the token after the last listed one: StreamingLLM gives it the next id.
        self.query_rope_pos = self.key_counts.clone()
        self.lists, self.page_size = lists, page_size
        self.cos, self.sin = rope_tables(max(lengths) + K + 1, d)
        self.sm_scale = d**-0.5

    def run(self, impl, num_splits=None, k=None, v=None):
        return sparse.sparse_attention_decode(
            self.q, self.k if k is None else k, self.v if v is None else v, self.page_tables, self.page_size,
            self.key_tokens, self.key_counts, self.key_rope_pos, self.query_rope_pos, self.cos, self.sin,
            self.sm_scale, num_splits=num_splits, impl=impl,
        )


def rope(x, pos, cos, sin):
    return apply_rotary(x.float(), cos[pos.long()].unsqueeze(1), sin[pos.long()].unsqueeze(1))


# --- the oracle against dense attention ---------------------------------------------------------------


def test_reference_equals_dense_causal_sdpa():
    """All tokens 0..L-1 listed with original positions == causal attention with RoPE on q and k."""
    case = PrefillCase(H=4, Hkv=2, d=32, n=21, start=11, qbs=8, page_size=4, dtype=torch.float32, seed=0, dense=True)
    out = case.run("reference")
    L = case.start + case.q.shape[0]
    slots = slots_of(case.page_table, torch.arange(L), case.page_size)
    k = rope(case.k[slots], torch.arange(L), case.cos, case.sin)
    q = rope(case.q, case.query_pos, case.cos, case.sin)
    mask = torch.arange(L, device=DEVICE)[None, :] <= case.query_pos.long()[:, None]
    expect = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], case.v[slots].float().transpose(0, 1)[None],
        attn_mask=mask, enable_gqa=True,
    )[0].transpose(0, 1)
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)

    # decode: the last query alone over every token (original positions).
    dec = reference.sparse_attention_decode(
        case.q[-1:], case.k, case.v, case.page_table[None], case.page_size,
        torch.arange(L, dtype=torch.int32, device=DEVICE)[None], torch.tensor([L], dtype=torch.int32, device=DEVICE),
        torch.arange(L, dtype=torch.int32, device=DEVICE)[None], case.query_pos[-1:], case.cos, case.sin, case.sm_scale,
    )
    torch.testing.assert_close(dec, expect[-1:], rtol=1e-5, atol=1e-5)


# --- prefill kernel -----------------------------------------------------------------------------------

PREFILL_SHAPES = [  # H, Hkv, d, n, start, query_block_size, page_size
    (4, 2, 64, 45, 30, 16, 8),  # 3 blocks, last one partial
    (8, 1, 32, 70, 5, 64, 16),  # GQA 8: BLOCK_Q=16 < block -> 4 tiles per block
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", PREFILL_SHAPES, ids=lambda s: f"H{s[0]}kv{s[1]}d{s[2]}")
def test_prefill_matches_reference(shape, dtype, impl):
    H, Hkv, d, n, start, qbs, page_size = shape
    case = PrefillCase(H, Hkv, d, n, start, qbs, page_size, dtype, seed=1)
    out = case.run(impl)
    assert out.dtype == dtype and out.shape == case.q.shape
    torch.testing.assert_close(out.float(), case.run("reference").float(), **TOL[dtype])


def test_prefill_odd_group_and_head_dim():
    """GQA group 3 (padded to 4), head_dim 48 (d/2 = 24 padded to 32), block size 12 (not a tile size)."""
    case = PrefillCase(H=6, Hkv=2, d=48, n=20, start=40, qbs=12, page_size=8, dtype=torch.float32, seed=2, density=0.3)
    torch.testing.assert_close(case.run("triton"), case.run("reference"), **TOL[torch.float32])


def test_prefill_fp32_head_dim_256_splits_query_tiles():
    """Gemma 3 in float32 (d = 256, GQA 4): the config shrinks BLOCK_Q under the shared-memory budget, so a
    16-query block spans two tiles; the result still matches the oracle."""
    cfg = launch.prefill_config(128, 4, 16, elem_bytes=4)
    assert cfg["BLOCK_Q"] < 16
    case = PrefillCase(H=4, Hkv=1, d=256, n=20, start=12, qbs=16, page_size=8, dtype=torch.float32, seed=3)
    torch.testing.assert_close(case.run("triton"), case.run("reference"), **TOL[torch.float32])


@pytest.mark.parametrize("elem_bytes", [2, 4])
@pytest.mark.parametrize("half_pad", [16, 32, 64, 128])
@pytest.mark.parametrize("group_pad", [1, 2, 4, 8])
def test_prefill_config_fits_shared_memory(elem_bytes, half_pad, group_pad):
    """Every config's tiles fit the budget (fp32 at d = 256 once asked for 256 KiB and failed to launch), and the
    measured bf16 configs are what the budget leaves alone."""
    cfg = launch.prefill_config(half_pad, group_pad, 64, elem_bytes)
    assert launch.prefill_shared_bytes(cfg, half_pad, group_pad, elem_bytes) <= launch.SHARED_MEMORY_BUDGET
    if elem_bytes == 2 and half_pad == 64 and group_pad == 4:
        assert cfg == dict(BLOCK_Q=64, BLOCK_N=64, num_warps=8, num_stages=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_prefill_reads_no_unlisted_or_future_key(dtype):
    """NaN in every slot no block lists (incl. unused pages and tokens past the chunk); huge values in
    listed tokens after a cutoff. Queries at or before the cutoff must be bit-identical, nothing NaN."""
    case = PrefillCase(4, 2, 64, 45, 30, 16, 8, dtype, seed=3, density=0.4)
    clean = {impl: case.run(impl) for impl in (*IMPLS, "reference")}
    listed = torch.unique(torch.cat(case.lists))
    cutoff = case.start + 20  # inside block 1: rows 21.. of the chunk see poisoned listed keys
    k, v = torch.full_like(case.k, float("nan")), torch.full_like(case.v, float("nan"))
    keep = slots_of(case.page_table, listed, case.page_size)
    k[keep], v[keep] = case.k[keep], case.v[keep]
    future = slots_of(case.page_table, listed[listed > cutoff], case.page_size)
    k[future] = 30.0  # q.k ~ 1e3 * sm_scale: would dominate any softmax row that saw it
    v[future] = 1e4
    rows = case.query_pos <= cutoff
    for impl in (*IMPLS, "reference"):
        out = case.run(impl, k=k, v=v)
        assert torch.isfinite(out.float()).all(), impl
        torch.testing.assert_close(out[rows], clean[impl][rows], rtol=0, atol=0)
        assert not torch.allclose(out[~rows].float(), clean[impl][~rows].float())  # the poison is really listed


# --- decode kernels -----------------------------------------------------------------------------------

DECODE_SHAPES = [  # H, Hkv, d, context lengths (one sequence empty: no key -> zeros)
    (4, 2, 64, [300, 0, 77, 190]),
    (8, 1, 32, [129, 260, 0]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=lambda s: f"H{s[0]}kv{s[1]}d{s[2]}")
def test_decode_triton_matches_reference_split_and_unsplit(shape, dtype):
    H, Hkv, d, lengths = shape
    case = DecodeCase(H, Hkv, d, lengths, page_size=16, dtype=dtype, seed=4)
    expect = case.run("reference").float()
    empty = case.key_counts == 0
    assert (expect[empty] == 0).all()
    outs = {s: case.run("triton", num_splits=s) for s in (1, 3, None)}
    for s, out in outs.items():
        assert out.dtype == dtype and torch.isfinite(out.float()).all(), s
        assert (out[empty] == 0).all(), s
        torch.testing.assert_close(out.float(), expect, **TOL[dtype], msg=lambda m: f"num_splits={s}: {m}")
    torch.testing.assert_close(outs[3].float(), outs[1].float(), **TOL[dtype])
    if "cpu" in IMPLS:
        sdpa_out = case.run("cpu")
        assert (sdpa_out[empty] == 0).all()
        torch.testing.assert_close(sdpa_out.float(), expect, **TOL[dtype])


@pytest.mark.parametrize("launch_args", [(16, 2, 1, False), (32, 8, 3, True), (128, 4, 4, True)])
def test_decode_every_launch_and_fp16_tables_equal_the_reference(launch_args):
    """The launch parameters the op benchmark sweeps (bench/suites/paged_decode.py --op sparse) give the reference's
    output over fp32 tables, with fp32 tables and with the fp16 ones a 16-bit cache's decode reads; a fused merge
    (the last split merges) too, leaving its counters zeroed for the next launch."""
    from infinitehip.attention.ops.sparse.split_k import split_counters

    case = DecodeCase(4, 2, 64, [300, 0, 77, 190], page_size=16, dtype=torch.bfloat16, seed=6)
    expect = case.run("reference").float()
    block_n, warps, stages, fused = launch_args
    chosen = launch.DecodeLaunch(block_n=block_n, num_warps=warps, num_stages=stages, fused_merge=fused)
    for cos, sin in ((case.cos, case.sin), (case.cos.half(), case.sin.half())):
        for splits in (1, 3):
            out = tri.sparse_attention_decode(
                case.q, case.k, case.v, case.page_tables, case.page_size, case.key_tokens, case.key_counts,
                case.key_rope_pos, case.query_rope_pos, cos, sin, case.sm_scale, num_splits=splits, launch=chosen)
            torch.testing.assert_close(out.float(), expect, **TOL[torch.bfloat16],
                                       msg=lambda m: f"{cos.dtype} tables, {splits} splits: {m}")
            assert not split_counters(case.q.device, 1).any()
    with pytest.raises(ValueError, match="block_n"):
        launch.DecodeLaunch(block_n=48)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="replays a real CUDA graph")
def test_decode_fused_merge_replays_from_a_cuda_graph():
    """A fused-merge decode captured in a CUDA graph and replayed on new queries (the engine's decode graphs): every
    replay merges (each leaves the counters zeroed for the next), equal to the reference and to the merge kernel
    (whose reduction may round apart: its own warps)."""
    from infinitehip.attention.ops.sparse.split_k import split_counters

    case = DecodeCase(4, 2, 64, [300, 0, 77, 190], page_size=16, dtype=torch.bfloat16, seed=7)
    fused, plain = launch.DecodeLaunch(fused_merge=True), launch.DecodeLaunch(fused_merge=False)

    def run(chosen):
        return tri.sparse_attention_decode(
            case.q, case.k, case.v, case.page_tables, case.page_size, case.key_tokens, case.key_counts,
            case.key_rope_pos, case.query_rope_pos, case.cos, case.sin, case.sm_scale, num_splits=3, launch=chosen)

    run(fused)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(fused)
    gen = torch.Generator().manual_seed(8)
    for _ in range(3):
        case.q.copy_(torch.randn(case.q.shape, generator=gen).to(case.q))
        graph.replay()
        torch.testing.assert_close(out.float(), case.run("reference").float(), **TOL[torch.bfloat16])
        torch.testing.assert_close(out.float(), run(plain).float(), rtol=1e-2, atol=1e-2)  # bf16 rounding apart
        assert not split_counters(case.q.device, 1).any()


def test_decode_reads_no_unlisted_key():
    case = DecodeCase(4, 2, 64, [300, 77, 190], page_size=16, dtype=torch.float32, seed=5, density=0.3)
    clean = case.run("triton", num_splits=3)
    k, v = torch.full_like(case.k, float("nan")), torch.full_like(case.v, float("nan"))
    for b, toks in enumerate(case.lists):
        keep = slots_of(case.page_tables[b], toks, case.page_size)
        k[keep], v[keep] = case.k[keep], case.v[keep]
    for splits in (1, 3):
        torch.testing.assert_close(case.run("triton", num_splits=splits, k=k, v=v), clean, rtol=1e-6, atol=1e-6)
    if "cpu" in IMPLS:
        torch.testing.assert_close(case.run("cpu", k=k, v=v), case.run("cpu"), rtol=1e-6, atol=1e-6)


def test_default_num_splits_and_dispatch():
    cpu = torch.device("cpu")  # assumes 132 SMs
    assert launch.default_num_splits(1, 8, 4096, cpu) == 32  # capped at >= 128 keys per split
    assert launch.default_num_splits(32, 8, 2048, cpu) == 5  # ~8 programs per SM
    assert launch.default_num_splits(64, 8, 4096, cpu) == 8  # <= 512 keys per split
    assert launch.default_num_splits(1, 8, 100, cpu) == 1
    with pytest.raises(ValueError):
        sparse._impl("flash")
    assert sparse._impl("triton") is tri

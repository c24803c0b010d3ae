"""Landmark-mode kernels vs their eager oracles: representative chunk scores (scoring/representative/triton.py),
the most salient token per chunk (representatives/triton.py), and whole pruning stages through both impls.

Without a CUDA device the kernels run under the Triton interpreter (tests/conftest.py), so shapes are kept small.
"""

import math

import pytest
import torch

pytest.importorskip("triton")

from infinitehip.attention.methods.infinitehip.pruning import StageSpec, query_blocks, run_stage  # noqa: E402
from infinitehip.attention.methods.infinitehip.representatives.op import salient_tokens  # noqa: E402
from infinitehip.attention.methods.infinitehip.saliency import KeySaliency  # noqa: E402
from infinitehip.attention.methods.infinitehip.scoring.op import representative_scores  # noqa: E402
from infinitehip.kv.paged_cache import token_slots  # noqa: E402
from infinitehip.model.rope import RotaryEmbedding  # noqa: E402
from tests.attention.test_landmark_representatives import _setup as random_paged_keys  # noqa: E402
from tests.rope_helpers import rope_tables  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
FP32_MIN = torch.finfo(torch.float32).min


def make_scores_case(M, b, H, Hkv, d, N, page_size, dtype, group, base_kind, rep_offset, seed, chunk=16):
    """Random inputs of representative_scores: chunks of up to `chunk` tokens (padding, partial, full) at random
    places, one random representative token inside each chunk per head, a scattered page table. base_kind:
    "zero" (relative / infllm), "const" (one nonzero position), "rank" (chunk_indexed), "mixed" (constant
    but for the last two chunks: with N = 130 and 128-chunk tiles, both kernel paths in one launch)."""
    g = torch.Generator().manual_seed(seed)
    T = N * chunk + 64
    n_pages = math.ceil(T / page_size)
    page_table = torch.randperm(n_pages + 5, generator=g)[:n_pages].to(torch.int32)
    k_flat = torch.randn((n_pages + 5) * page_size, Hkv, d, generator=g)
    q_rot = torch.randn(M, b, H, d, generator=g)
    q_valid = torch.rand(M, b, generator=g) < 0.8
    q_valid[:, 0] = True
    if M > 2:
        q_valid[2] = False  # a block without a valid query: its real chunks score finfo.min
    lens = torch.randint(1, chunk + 1, (M, N), generator=g)
    lens = torch.where(torch.rand(M, N, generator=g) < 0.2, 0, lens)
    lens[:, 0] = chunk
    starts = torch.randint(0, T - chunk, (M, N), generator=g)
    reps = starts[..., None] + (torch.rand(M, N, H, generator=g) * lens[..., None].clamp(min=1)).long()
    if base_kind == "zero":
        base = torch.zeros(M, N, dtype=torch.long)
    elif base_kind == "const":
        base = torch.full((M, N), 5, dtype=torch.long)
    else:
        base = torch.cumsum((lens > 0).long(), 1) - 1
        if base_kind == "mixed":
            base[:, : N - 2] = 3
    max_pos = int(base.max()) + rep_offset + (T // group if group else 0) + 2
    cos, sin = rope_tables(max_pos, d)
    dev = lambda x: x.to(DEVICE)  # noqa: E731
    return (dev(q_rot.to(dtype)), dev(q_valid), dev(k_flat.to(dtype)), dev(page_table), page_size, dev(reps), dev(lens),
            dev(base), group, rep_offset, cos, sin)


def _check(args, dtype):
    ref = representative_scores(*args, impl="reference")
    tri = representative_scores(*args, impl="triton")
    lens = args[6]
    assert tri.shape == ref.shape and tri.dtype == torch.float32
    assert torch.equal(torch.isinf(tri), lens == 0) and torch.equal(torch.isinf(ref), lens == 0)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-2, atol=5e-2)
    torch.testing.assert_close(tri, ref, **tol)
    return tri


SCORE_CASES = [
    # M, b, H, Hkv, d, N, page_size, dtype, group, base_kind, rep_offset
    (3, 16, 4, 2, 32, 10, 8, torch.float32, None, "zero", 1),  # relative: raw keys, queries rotated back
    (3, 16, 4, 2, 32, 10, 8, torch.float32, None, "rank", 0),  # chunk_indexed: keys rotated per chunk
    (3, 5, 4, 2, 32, 10, 8, torch.float32, 3, "zero", 0),  # dynamic: token_pos_group
    (2, 16, 4, 4, 16, 40, 4, torch.float32, 1, "zero", 0),  # none: original positions, d/2 < 16 padded
    (2, 20, 6, 3, 48, 70, 8, torch.bfloat16, None, "const", 1),  # non-power-of-two d, BLOCK_N = 128 tiles
    (2, 64, 8, 2, 64, 130, 16, torch.bfloat16, None, "mixed", 1),  # both paths in one launch, 2 bf16 tiles
    (2, 70, 4, 1, 16, 9, 4, torch.bfloat16, 2, "rank", 1),  # b > 64: streamed query tiles
    (1, 1, 8, 2, 32, 40, 8, torch.float32, None, "zero", 1),  # decode: heads split over the grid
    (1, 1, 6, 3, 64, 300, 16, torch.bfloat16, None, "rank", 0),  # decode, several chunk tiles
]


@pytest.mark.parametrize("case", SCORE_CASES, ids=lambda c: f"M{c[0]}b{c[1]}H{c[2]}kv{c[3]}d{c[4]}N{c[6]}"
                         f"{str(c[7])[6:]}g{c[8]}{c[9]}o{c[10]}")
def test_representative_scores_triton_matches_reference(case):
    dtype = case[7]
    args = make_scores_case(*case, seed=SCORE_CASES.index(case))
    tri = _check(args, dtype)
    M = case[0]
    if M > 2:
        assert (tri[2][args[6][2] > 0] == FP32_MIN).all()  # no valid query: finfo.min, like the reference
    if DEVICE.type == "cuda":  # (the interpreter runs the programs one after another in grid order: a rerun there
        # repeats the same atomics in the same order into fresh outputs: nothing to find)
        assert torch.equal(tri, representative_scores(*args, impl="triton"))  # deterministic (atomic max is order-free)


def test_representative_scores_strided_reps_and_edges():
    args = make_scores_case(3, 8, 4, 2, 32, 12, 8, torch.float32, None, "zero", 1, seed=11)
    q, qv, k, pt, ps, reps, lens, base = args[:8]
    shared = reps[:1].expand_as(reps)  # stage 1: every block has the same representatives (stride 0)
    a = args[:5] + (shared,) + args[6:]
    torch.testing.assert_close(representative_scores(*a, impl="triton"), representative_scores(*a, impl="reference"),
                               rtol=1e-4, atol=1e-4)
    padding = args[:6] + (torch.zeros_like(lens),) + args[7:]  # only padding chunks: -inf, nothing read
    assert torch.isneginf(representative_scores(*padding, impl="triton")).all()
    empty = args[:5] + (reps[:, :0], lens[:, :0], base[:, :0]) + args[8:]
    assert representative_scores(*empty, impl="triton").shape == (3, 0)
    with pytest.raises(ValueError):
        representative_scores(*args, impl="nope")


@pytest.mark.parametrize("group,base_kind", [(3, "rank"), (None, "zero")])
def test_representative_scores_read_only_representative_keys(group, base_kind):
    args = make_scores_case(3, 16, 4, 2, 32, 10, 8, torch.float32, group, base_kind, 1, seed=5)
    clean = representative_scores(*args, impl="triton")
    k, pt, ps, reps, lens = args[2], args[3], args[4], args[5], args[6]
    used = torch.zeros(k.shape[0], k.shape[1], dtype=torch.bool, device=k.device)
    real = (lens > 0)[..., None].expand_as(reps)
    kv_head = (torch.arange(reps.shape[2], device=k.device) // (reps.shape[2] // k.shape[1])).expand_as(reps)
    used[token_slots(pt, reps[real], ps), kv_head[real]] = True
    poisoned = torch.where(used[..., None], k, torch.full_like(k, float("nan")))
    got = representative_scores(*(args[:2] + (poisoned,) + args[3:]), impl="triton")
    assert torch.equal(got, clean)


# ---- most salient token per chunk --------------------------------------------------------------------
@pytest.mark.parametrize("empty_run", [False, True])
@pytest.mark.parametrize("H,chunk_size,page_size,U", [(4, 8, 4, 37), (3, 64, 16, 9), (32, 256, 64, 5), (5, 5, 8, 11), (2, 1, 4, 6), (4, 8, 4, 200)])
def test_salient_tokens_triton_equals_reference(H, chunk_size, page_size, U, empty_run):
    g = torch.Generator().manual_seed(chunk_size)
    T = 40 * chunk_size
    n_pages = -(-T // page_size)
    page_table = torch.randperm(n_pages + 4, generator=g)[:n_pages].int()
    S = (n_pages + 4) * page_size
    total = torch.randn(S, H, generator=g)
    count = torch.randint(0, 5, (S,), generator=g).float()  # 0: never reached, divided by 1
    total[::3], count[::3] = total[1], count[1]  # exact ties inside chunks: the first token wins
    starts = torch.randint(0, T - chunk_size, (U,), generator=g)
    lens = torch.randint(0, chunk_size + 1, (U,), generator=g)  # 0: the start, like argmax of all -inf
    if empty_run:  # a run of empty chunks (a batched stage's rows that do not refresh), then short ones
        lens[: U // 2] = 0
        lens[U // 2 :] = lens[U // 2 :].clamp(max=max(1, chunk_size // 3))
    total, count, page_table, starts, lens = (x.to(DEVICE) for x in (total, count, page_table, starts, lens))
    ref = salient_tokens(total, count, page_table, page_size, starts, lens, chunk_size, impl="reference")
    tri = salient_tokens(total, count, page_table, page_size, starts, lens, chunk_size, impl="triton")
    assert tri.dtype == torch.int64 and torch.equal(tri, ref)
    none = salient_tokens(total, count, page_table, page_size, starts[:0], lens[:0], chunk_size, impl="triton")
    assert none.shape == (0, H)


# ---- whole stages ----------------------------------------------------------------------------------------
def _stage_setup(T=700, H=4, Hkv=2, d=32, page_size=16, seed=0):
    config, cache, page_table, q, _ = random_paged_keys(T, H, Hkv, d, page_size, seed, max_positions=256, device=DEVICE)
    rope = RotaryEmbedding(config, 2 * T, DEVICE)
    store = KeySaliency(window=32)
    for a in range(0, T - 160, 128):  # earlier prefill chunks leave saliency behind
        store.update(0, q[a : a + 128], a, page_table, cache, rope)
    return cache, page_table, q, rope, store


@pytest.mark.parametrize("style", ["relative", "chunk_indexed", "dynamic"])
def test_landmark_stages_select_the_same_chunks(style):
    """Three pruning stages (prefill of the last 96 queries, then one decode query) through impl triton and
    reference keep exactly the same chunks."""
    cache, page_table, q, rope, store = _stage_setup(seed=3)
    T = q.shape[0]
    specs = [StageSpec(32, 32, 256, style), StageSpec(16, 8, 96, style), StageSpec(8, 2, 32, style)]
    for start, n in [(T - 96, 96), (T - 1, 1)]:
        outs = {}
        for impl in ("reference", "triton"):
            parent = None
            for spec in specs:
                size = spec.query_block_size if n > 1 else 1
                blocks = query_blocks(q[start : start + n], start, size)
                if parent is not None:
                    rows = torch.arange(blocks.q.shape[0], device=DEVICE) * size
                    parent = parent.for_blocks(rows // parent.query_block_size)
                parent = run_stage(spec, blocks, parent, cache.flat_k(0), page_table, cache.page_size, 16, 64, rope,
                                   start + n, 128, impl, (store, 0))
                outs.setdefault(impl, []).append((parent.chunk_starts, parent.chunk_lens))
        for (s_ref, l_ref), (s_tri, l_tri) in zip(outs["reference"], outs["triton"]):
            assert torch.equal(s_ref, s_tri) and torch.equal(l_ref, l_tri)
        assert outs["triton"][0][0].shape[1] < -(-(start + n - 64 - 16) // 32)  # stage 1 really pruned

"""The paged dense decode op (attention/methods/dense/paged_decode/): the Triton kernel (under the interpreter without a CUDA
device) against the eager reference over batches of sequences of different lengths (1, page multiples and not),
GQA ratios, fp32 / bf16, one split or several, a sliding window and soft-capping; the reference against the dense
prefill path (gather, rotate every key, SDPA) on the same paged cache; DenseAttention.decode against one-token
prefills, softcapped too. Slots past each sequence's end hold NaN (never-written cache memory may)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from infinitehip.attention.base import AttentionMethod, ForwardBatch, SequenceSlice  # noqa: E402
from infinitehip.attention.methods.dense.method import DenseAttention, causal_sdpa, softcapped_causal  # noqa: E402
from infinitehip.attention.methods.dense.paged_decode.op import paged_decode  # noqa: E402
from infinitehip.config.model import ModelConfig  # noqa: E402
from infinitehip.kv.paged_cache import PagedKVCache  # noqa: E402
from infinitehip.model.rope import RotaryEmbedding  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PAGE = 16
LENGTHS = [1, 37, 64, 130, 16]  # one token, not a page multiple, page multiples


def _model(H: int, Hkv: int, d: int, cap: float | None = None) -> ModelConfig:
    return ModelConfig(model_type="llama", vocab_size=16, hidden_size=64, intermediate_size=64, num_layers=1,
                       num_heads=H, num_kv_heads=Hkv, head_dim=d, rms_norm_eps=1e-6, rope_theta=10000.0,
                       max_position_embeddings=8192, attn_logit_softcapping=cap)


def _filled_cache(H: int, Hkv: int, d: int, dtype: torch.dtype, lengths: list[int], seed: int):
    """A one-layer cache whose sequences own shuffled pages, filled with random keys/values; their page tables."""
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // PAGE) for n in lengths]
    cache = PagedKVCache(1, sum(pages) + 3, PAGE, Hkv, d, dtype, DEVICE)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g).to(dtype))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g).to(dtype))
    order = torch.randperm(cache.num_pages, generator=g)[: sum(pages)].to(torch.int32).to(DEVICE)
    tables = list(torch.split(order, pages))
    for n, table in zip(lengths, tables):  # slots past a sequence's end are never written: NaN must not leak
        tail = cache.slots(table, n, table.numel() * PAGE)
        cache.flat_k(0)[tail] = float("nan")
        cache.flat_v(0)[tail] = float("nan")
    q = (torch.randn(len(lengths), H, d, generator=g) * 2).to(dtype).to(DEVICE)
    return cache, tables, q


def _padded(tables: list[torch.Tensor]) -> torch.Tensor:
    P = max(t.numel() for t in tables)
    return torch.stack([torch.nn.functional.pad(t, (0, P - t.numel())) for t in tables])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,Hkv,d", [(4, 4, 16), (8, 2, 32), (6, 1, 16)])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window,cap", [(None, None), (40, None), (None, 5.0), (20, 5.0)])
def test_kernel_equals_the_reference(dtype, H, Hkv, d, num_splits, window, cap):
    from infinitehip.attention.methods.dense.paged_decode.triton import paged_decode_triton

    cache, tables, q = _filled_cache(H, Hkv, d, dtype, LENGTHS, seed=H * d + Hkv)
    rope = RotaryEmbedding(_model(H, Hkv, d), 256, DEVICE)
    lengths = torch.tensor(LENGTHS, device=DEVICE)
    args = (q, cache.k[0], cache.v[0], _padded(tables), lengths, rope.cos, rope.sin)
    want = paged_decode(*args, window=window, softcap=cap, impl="reference")
    got = paged_decode_triton(*args, window=window, softcap=cap, num_splits=num_splits)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape == q.shape
    tol = 1e-5 if dtype == torch.float32 else 3e-2  # bf16: rotated keys and probabilities rounded in other places
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_kernel_default_splits_and_an_explicit_scale():
    from infinitehip.attention.methods.dense.paged_decode.triton import paged_decode_triton

    cache, tables, q = _filled_cache(8, 2, 16, torch.float32, [300, 5], seed=7)
    rope = RotaryEmbedding(_model(8, 2, 16), 512, DEVICE)
    args = (q, cache.k[0], cache.v[0], _padded(tables), torch.tensor([300, 5], device=DEVICE), rope.cos, rope.sin)
    for scale in (None, 0.125):  # 0.125: a power of two times d ** -0.5, folded into q exactly by the reference
        want = paged_decode(*args, scale=scale, impl="reference")
        torch.testing.assert_close(paged_decode_triton(*args, scale=scale), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("launch", [(16, 2, 1, False), (32, 8, 3, True), (128, 4, 4, True)])
def test_every_launch_and_fp16_tables_equal_the_reference(launch):
    """The launch parameters the op benchmark sweeps (bench/suites/paged_decode.py) give the reference's output; fp16
    rope tables (half the bytes beside each key) stay within the bf16 tolerance."""
    from infinitehip.attention.methods.dense.paged_decode.triton import paged_decode_triton
    from infinitehip.attention.ops.sparse.launch import DecodeLaunch

    cache, tables, q = _filled_cache(8, 2, 32, torch.bfloat16, LENGTHS, seed=11)
    rope = RotaryEmbedding(_model(8, 2, 32), 256, DEVICE)
    args = (q, cache.k[0], cache.v[0], _padded(tables), torch.tensor(LENGTHS, device=DEVICE), rope.cos, rope.sin)
    want = paged_decode(*args, window=40, impl="reference").float()
    block_n, warps, stages, fused = launch
    for cos, sin in ((rope.cos, rope.sin), (rope.cos.half(), rope.sin.half())):
        got = paged_decode_triton(q, *args[1:5], cos, sin, window=40, num_splits=2,
                                  launch=DecodeLaunch(block_n=block_n, num_warps=warps, num_stages=stages,
                                                      fused_merge=fused))
        torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)
    with pytest.raises(ValueError, match="block_n"):
        DecodeLaunch(block_n=48)


@pytest.mark.parametrize("cap", [None, 5.0])
@pytest.mark.parametrize("H,Hkv", [(4, 2), (3, 3)])
def test_reference_equals_the_dense_prefill_path(cap, H, Hkv):
    """Gather every slot, rotate every key from position 0, bottom-right causal attention of the last query."""
    d = 16
    cache, tables, q_raw = _filled_cache(H, Hkv, d, torch.float32, LENGTHS, seed=3)
    rope = RotaryEmbedding(_model(H, Hkv, d), 256, DEVICE)
    positions = torch.tensor(LENGTHS, device=DEVICE) - 1
    q = torch.cat([rope.apply_range(q_raw[i : i + 1], n - 1) for i, n in enumerate(LENGTHS)])
    got = paged_decode(q, cache.k[0], cache.v[0], _padded(tables), positions + 1, rope.cos, rope.sin, softcap=cap,
                       impl="reference")
    for i, n in enumerate(LENGTHS):
        k, v = cache.read(0, cache.slots(tables[i], 0, n))
        k = rope.apply_range(k, 0)
        qi = q[i : i + 1]
        want = causal_sdpa(qi, k, v, n - 1) if cap is None else softcapped_causal(qi, k, v, n - 1, cap)
        torch.testing.assert_close(got[i : i + 1], want, atol=1e-5, rtol=1e-5)


def _decode_batch(cache: PagedKVCache, tables: list[torch.Tensor], rope: RotaryEmbedding) -> ForwardBatch:
    slices = [SequenceSlice(seq_id=i, query_start=i, num_queries=1, start_pos=n - 1, token_start=n - 1,
                            page_table=t, cache=cache, state=None, is_prefill=False)
              for i, (n, t) in enumerate(zip(LENGTHS, tables))]
    return ForwardBatch(slices, cache, rope, len(slices))


@pytest.mark.parametrize("impl_device", ["reference", "triton"])
@pytest.mark.parametrize("cap", [None, 5.0])
def test_dense_decode_equals_one_token_prefills(impl_device, cap, monkeypatch):
    """DenseAttention.decode (one paged call for the step) equals the base class's loop of one-token prefills."""
    import infinitehip.attention.methods.dense.method as dense_method
    from infinitehip.attention.methods.dense.paged_decode import op

    if impl_device == "triton":  # the CPU run takes the kernel (interpreted) too
        monkeypatch.setattr(dense_method, "paged_decode", lambda *a, **kw: op.paged_decode(*a, **kw, impl="triton"))
    mc = _model(4, 2, 16, cap)
    cache, tables, q = _filled_cache(4, 2, 16, torch.float32, LENGTHS, seed=11)
    rope = RotaryEmbedding(mc, 8, DEVICE)  # grown by the decode as it needs
    method = DenseAttention(mc)
    batch = _decode_batch(cache, tables, rope)
    got = method.decode(0, q, batch.decode, batch)
    want = AttentionMethod.decode(method, 0, q, batch.decode, batch)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _greedy_batch(engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from infinitehip import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    seqs = [engine.add_request(ids, params) for ids in prompts]
    while engine.has_work:
        engine.step()
    return [s.output_ids for s in seqs]


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_engine_greedy_tokens_equal_the_per_sequence_decode(family, tiny_llama_dir, tmp_path, monkeypatch):
    """Sequences of different lengths decoding together (Gemma 2: soft-capped global layers beside sliding ones)
    pick the tokens the per-sequence one-token prefills picked."""
    from tests.conftest import engine_for_dir

    path = tiny_llama_dir
    if family == "gemma2":
        import transformers

        from tests.model.test_model_coverage import CONFIGS

        torch.manual_seed(0)
        hf = transformers.AutoModelForCausalLM.from_config(CONFIGS["gemma2"](), attn_implementation="eager")
        with torch.no_grad():  # large scores, so soft-capping bites
            for name, p in hf.named_parameters():
                if name.endswith(("q_proj.weight", "k_proj.weight")):
                    p.mul_(6.0)
        hf.save_pretrained(tmp_path)
        path = tmp_path
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 500, (n,), generator=g).tolist() for n in (33, 80, 7)]

    def run() -> list[list[int]]:
        engine = engine_for_dir(path, method="dense", max_context_tokens=512, prefill_chunk_size=64, page_size=16)
        return _greedy_batch(engine, prompts, 12)

    ours = run()
    monkeypatch.setattr(DenseAttention, "decode", AttentionMethod.decode)
    assert ours == run()

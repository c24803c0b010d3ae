"""Validation mode: K/V read through host store + resolve + bank equal a resident PagedKVCache's rows.

Small banks force evictions over many steps; the Triton row copy (and decode kernel) run under the
interpreter without CUDA.
"""

import pytest
import torch

pytest.importorskip("triton")

from infinitehip.attention.ops.sparse import op as sparse  # noqa: E402
from infinitehip.config.offload import OffloadConfig  # noqa: E402
from infinitehip.kv.offload import OffloadedKV  # noqa: E402
from infinitehip.kv.offload.compose import decode_tables, list_slots  # noqa: E402
from infinitehip.kv.offload.validate import (  # noqa: E402
    OffloadMismatchError, mirror_paged_cache, validate_against_paged,
)
from infinitehip.kv.paged_cache import PagedKVCache  # noqa: E402
from tests.rope_helpers import rope_tables  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
LAYERS, PAGES, PAGE, HKV, D = 2, 12, 8, 2, 16
SEQ_PAGES = 4  # 3 sequences of 4 pages (32 tokens) each


def filled_cache(dtype=torch.float32, seed=0):
    """A paged cache with fresh random k/v in every slot and 3 sequences' shuffled page tables [3, 4]."""
    g = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(LAYERS, PAGES, PAGE, HKV, D, dtype, DEVICE)
    slots = torch.arange(PAGES * PAGE, device=DEVICE)
    for layer in range(LAYERS):
        cache.write(layer, slots, torch.randn(PAGES * PAGE, HKV, D, generator=g).to(DEVICE),
                    torch.randn(PAGES * PAGE, HKV, D, generator=g).to(DEVICE))
    page_tables = torch.randperm(PAGES, generator=g).view(3, SEQ_PAGES).to(torch.int32).to(DEVICE)
    return cache, page_tables


def offloaded(impl, mask_bank, attention_bank, kv_dtype="auto", model_dtype=torch.float32):
    cfg = OffloadConfig(offload_enabled=True, mask_bank_tokens=mask_bank, attention_bank_tokens=attention_bank,
                        kv_dtype=kv_dtype, offload_impl=impl)
    return OffloadedKV(cfg, LAYERS, PAGES * PAGE, HKV, D, model_dtype, DEVICE)


def key_lists(page_tables, steps, keys, seed):
    """Per step: (layer, slots [B * K]) of random sorted key lists (locality + random), padding past each count."""
    g = torch.Generator().manual_seed(seed)
    tokens_per_seq = SEQ_PAGES * PAGE
    for step in range(steps):
        B = page_tables.shape[0]
        centre = (step * 3) % tokens_per_seq
        near = (centre + torch.randint(0, 8, (B, keys), generator=g)) % tokens_per_seq
        far = torch.randint(0, tokens_per_seq, (B, keys), generator=g)
        tokens = torch.where(torch.rand(B, keys, generator=g) < 0.6, near, far).sort(1).values
        counts = torch.randint(keys // 2, keys + 1, (B,), generator=g)
        yield step % LAYERS, list_slots(page_tables, PAGE, tokens.to(DEVICE), counts.to(DEVICE)).view(-1)


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("cache_dtype,kv_dtype", [(torch.float32, "auto"), (torch.bfloat16, "auto"), (torch.float32, "fp8_e4m3")])
def test_offloaded_reads_equal_the_resident_paged_cache(impl, cache_dtype, kv_dtype):
    cache, page_tables = filled_cache(cache_dtype)
    kv = offloaded(impl, mask_bank=20, attention_bank=28, kv_dtype=kv_dtype, model_dtype=cache_dtype)
    mirror_paged_cache(cache, kv)
    # 12 steps (24 before): 166 rows checked, 131 / 128 misses and 17 / 20 hits in the mask / attention bank (float32,
    # reference impl): the assertions below hold with wide margins (misses over twice their bounds)
    report = validate_against_paged(cache, kv, key_lists(page_tables, steps=12, keys=6, seed=1))
    assert report.steps == 12 and report.rows_checked > 12 * 3 * 3
    for stats, bank in zip((report.mask, report.attention), kv.banks):
        # 96 slots through banks of 20 / 28 tokens: rows were evicted and fetched again, and some hit
        assert stats.total_misses > LAYERS * bank.bank_tokens and stats.total_hits > 0


def test_validation_detects_a_stale_bank_row():
    cache, page_tables = filled_cache()
    kv = offloaded("reference", mask_bank=20, attention_bank=28)
    mirror_paged_cache(cache, kv)
    slot = int(list_slots(page_tables[:1], PAGE, torch.tensor([[5]], device=DEVICE), torch.tensor([1], device=DEVICE)))
    kv.store.k[1][slot] = 0  # the store no longer matches the cache (written behind the banks' back)
    with pytest.raises(OffloadMismatchError, match=f"k of slot {slot} read through the mask bank \\(layer 1\\)"):
        validate_against_paged(cache, kv, [(1, torch.tensor([slot, -1], device=DEVICE))])


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_sparse_decode_through_the_bank_equals_the_paged_cache(impl):
    """The unchanged decode kernel reads the attention bank with page_size 1 (compose.decode_tables)."""
    cache, page_tables = filled_cache(seed=2)
    kv = offloaded(impl, mask_bank=8, attention_bank=48)
    mirror_paged_cache(cache, kv)
    cos, sin = rope_tables(64, D)
    g = torch.Generator().manual_seed(3)
    B, K, H = 3, 12, 4
    for step in range(6):
        layer = step % LAYERS
        tokens = torch.stack([torch.randperm(SEQ_PAGES * PAGE, generator=g)[:K].sort().values for _ in range(B)])
        counts = torch.randint(K // 2, K + 1, (B,), generator=g).to(torch.int32)
        key_rope = tokens.to(torch.int32)
        query_rope = torch.full((B,), SEQ_PAGES * PAGE, dtype=torch.int32)
        q = torch.randn(B, H, D, generator=g)
        args = [t.to(DEVICE) for t in (tokens.to(torch.int32), counts, key_rope, query_rope)]
        want = sparse.sparse_attention_decode(q.to(DEVICE), cache.flat_k(layer), cache.flat_v(layer), page_tables, PAGE,
                                              args[0], args[1], args[2], args[3], cos, sin, D ** -0.5, impl=impl)
        slots = list_slots(page_tables, PAGE, args[0], args[1])
        bank_tables, list_tokens, page_size = decode_tables(kv.resolve_attention(layer, slots))
        bank = kv.attention_bank
        got = sparse.sparse_attention_decode(q.to(DEVICE), bank.flat_k(layer), bank.flat_v(layer), bank_tables, page_size,
                                             list_tokens, args[1], args[2], args[3], cos, sin, D ** -0.5, impl=impl)
        assert torch.equal(got, want), f"step {step}"
    assert kv.attention_bank.stats().total_misses > 48  # the bank was refilled along the way

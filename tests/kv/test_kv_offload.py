"""KV offloading: host store + GPU banks, the sync-free LRU resolve, its eager and Triton row copies.

Without a CUDA device the Triton kernels run under the interpreter (tests/conftest.py), so stores and traces are
kept small.
"""

import importlib
import random
from collections import OrderedDict

import pytest
import torch

triton = pytest.importorskip("triton")

from infinitehip.config.offload import OffloadConfig  # noqa: E402
from infinitehip.kv.offload import KVStore, OffloadedKV  # noqa: E402
from infinitehip.kv.offload.copy_rows import copy_rows  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
IMPLS = ("reference", "triton")
LAYERS, HKV, D = 2, 2, 8


def make_kv(impl, slots=96, mask_bank=8, attention_bank=8, kv_dtype="float32", seed=0, store_device_layers=0):
    """An offloaded KV with fresh random rows in every slot of every layer; returns (kv, k rows, v rows)."""
    cfg = OffloadConfig(offload_enabled=True, mask_bank_tokens=mask_bank, attention_bank_tokens=attention_bank,
                        kv_dtype=kv_dtype, offload_impl=impl)
    kv = OffloadedKV(cfg, LAYERS, slots, HKV, D, torch.float32, DEVICE, store_device_layers=store_device_layers)
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(LAYERS, slots, HKV, D, generator=g)
    v = torch.randn(LAYERS, slots, HKV, D, generator=g)
    for layer in range(LAYERS):
        kv.write(layer, torch.arange(slots, device=DEVICE), k[layer].to(DEVICE), v[layer].to(DEVICE))
    return kv, k, v


class LRUModel:
    """The LRU the banks implement, as a plain OrderedDict: a call's distinct slots are appended in sorted order."""

    def __init__(self, capacity: int):
        self.capacity, self.entries = capacity, OrderedDict()

    def request(self, slots: list[int]) -> tuple[int, int]:
        distinct = sorted({s for s in slots if s >= 0})
        misses = [s for s in distinct if s not in self.entries]
        need = len(misses) - (self.capacity - len(self.entries))
        for s in [s for s in self.entries if s not in set(distinct)][: max(0, need)]:
            del self.entries[s]
        for s in distinct:
            self.entries[s] = True
            self.entries.move_to_end(s)
        return len(distinct) - len(misses), len(misses)


def random_trace(rng: random.Random, steps: int, slots: int, per_call: int, hot: int):
    """Calls of `per_call` slots: mostly from a drifting hot set, some cold, duplicates and -1 padding."""
    base = 0
    for _ in range(steps):
        base = (base + rng.randrange(3)) % slots
        call = []
        for _ in range(per_call):
            r = rng.random()
            if r < 0.1:
                call.append(-1)
            elif r < 0.75:
                call.append((base + rng.randrange(hot)) % slots)
            else:
                call.append(rng.randrange(slots))
        yield call


def as_tensor(call):
    return torch.tensor(call, dtype=torch.int64, device=DEVICE)


def raw(t: torch.Tensor) -> torch.Tensor:
    """Bit pattern of a tensor (compares NaN and FP8 rows exactly)."""
    return t.contiguous().view(torch.uint8).cpu()


@pytest.fixture
def eager_row_copy(monkeypatch):
    """Under the interpreter, resolve's and the store's row copies run eagerly; the LRU kernels stay Triton.

    For the tests of the LRU bookkeeping (entries, tables, order, counters), which check the rows that arrive but
    not how they were copied: an interpreted copy is one program per requested row (hits and padding included),
    ~90% of such a test's time. The Triton copy is checked where it is the subject, without this fixture: every
    store dtype and placement read through Triton resolve calls (test_rows_read_through_...), whole Triton
    offloaded KVs, stores included, equal to reference ones on random traces (test_triton_and_reference_...),
    writes over resident slots, every code of each narrower store dtype. With CUDA nothing changes."""
    if DEVICE.type == "cuda":
        return
    def eager(src, src_rows, dst, dst_rows, impl):  # (the Triton resolve's row lists are int32)
        copy_rows(src, src_rows.long(), dst, dst_rows.long(), "reference")

    for name in ("resolve", "store"):  # (import_module: the package's `resolve` attribute is the function)
        monkeypatch.setattr(importlib.import_module(f"infinitehip.kv.offload.{name}"), "copy_rows", eager)


# ---- config ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [
    ("mask_bank_tokens", 0), ("attention_bank_tokens", -4), ("attention_bank_tokens", 2.5),
    ("kv_dtype", "int8"), ("host_memory_fraction", 0.0), ("gpu_memory_fraction", 1.5), ("offload_impl", "cuda"),
    ("offload_enabled", "yes"),
])
def test_offload_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        OffloadConfig(**{field: value})


def test_offload_config_cli_flags_are_kebab_case_field_names():
    import argparse

    from infinitehip.cli.options import add_dataclass_flags, dataclass_from_args

    parser = argparse.ArgumentParser()
    add_dataclass_flags(parser, OffloadConfig)
    args = parser.parse_args(["--offload-enabled", "true", "--mask-bank-tokens", "1024", "--kv-dtype", "fp8_e5m2",
                              "--host-memory-fraction", "0.5"])
    cfg = dataclass_from_args(OffloadConfig, args)
    assert (cfg.offload_enabled, cfg.mask_bank_tokens, cfg.kv_dtype, cfg.host_memory_fraction) == (True, 1024, "fp8_e5m2", 0.5)
    assert cfg.attention_bank_tokens == OffloadConfig().attention_bank_tokens


def test_offload_config_dtype_resolution():
    assert OffloadConfig().torch_kv_dtype(torch.bfloat16) == torch.bfloat16
    assert OffloadConfig(kv_dtype="fp8_e4m3").torch_kv_dtype(torch.bfloat16) == torch.float8_e4m3fn
    assert OffloadConfig(kv_dtype="fp8_e5m2").torch_kv_dtype(torch.float32) == torch.float8_e5m2


# ---- LRU policy -----------------------------------------------------------------------------------------
@pytest.mark.usefixtures("eager_row_copy")
@pytest.mark.parametrize("impl", IMPLS)
def test_lru_evicts_the_least_recently_used(impl):
    kv, _, _ = make_kv(impl, attention_bank=4)
    bank = kv.attention_bank
    for call in ([0, 1], [2, 3], [0], [5]):  # 1 is the least recently used when 5 arrives
        kv.resolve_attention(0, as_tensor(call))
    assert bank.resident_slots(0).tolist() == [0, 2, 3, 5]
    kv.resolve_attention(0, as_tensor([7]))  # then 2 (same call as 3, smaller slot first)
    assert bank.resident_slots(0).tolist() == [0, 3, 5, 7]
    assert bank.resident_slots(1).tolist() == []  # layers are independent


@pytest.mark.usefixtures("eager_row_copy")
@pytest.mark.parametrize("impl", IMPLS)
def test_never_evicts_a_slot_requested_in_the_call(impl):
    kv, k, _ = make_kv(impl, attention_bank=4)
    kv.resolve_attention(0, as_tensor([10, 11]))
    kv.resolve_attention(0, as_tensor([12, 13]))
    # 10 and 11 are the LRU entries but requested again: 12 and 13 must make room for 20 and 21.
    idx = kv.resolve_attention(0, as_tensor([20, 10, 21, 11]))
    assert kv.attention_bank.resident_slots(0).tolist() == [10, 11, 20, 21]
    assert len(set(idx.tolist())) == 4
    assert torch.equal(kv.attention_bank.flat_k(0)[idx.long()].cpu(), k[0][[20, 10, 21, 11]])


@pytest.mark.usefixtures("eager_row_copy")
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bank_tokens,per_call,hot", [(8, 6, 10), (16, 12, 24), (32, 20, 30)])
def test_matches_an_ordered_dict_lru_on_random_traces(impl, bank_tokens, per_call, hot):
    slots = 96
    kv, _, _ = make_kv(impl, slots=slots, mask_bank=bank_tokens, attention_bank=bank_tokens)
    models = {(name, layer): LRUModel(bank_tokens) for name in ("mask", "attention") for layer in range(LAYERS)}
    expected = {key: [0, 0] for key in models}
    rng = random.Random(bank_tokens * 1000 + per_call)
    for i, call in enumerate(random_trace(rng, 40, slots, per_call, hot)):
        layer, name = i % LAYERS, ("mask", "attention")[(i // LAYERS) % 2]
        bank = kv.mask_bank if name == "mask" else kv.attention_bank
        (kv.resolve_mask if name == "mask" else kv.resolve_attention)(layer, as_tensor(call))
        h, m = models[name, layer].request(call)
        expected[name, layer][0] += h
        expected[name, layer][1] += m
        assert bank.resident_slots(layer).tolist() == sorted(models[name, layer].entries), f"call {i}"
        stats = bank.stats()
        assert [stats.hits[layer], stats.misses[layer]] == expected[name, layer], f"call {i}"
    for bank in kv.banks:
        stats = bank.stats()
        assert stats.overflows == [0] * LAYERS
        assert 0 < stats.hit_ratio < 1


@pytest.mark.usefixtures("eager_row_copy")
@pytest.mark.parametrize("impl", IMPLS)
def test_duplicates_share_one_entry_and_padding_maps_to_minus_one(impl):
    kv, k, _ = make_kv(impl, attention_bank=4)
    idx = kv.resolve_attention(1, as_tensor([[5, -1, 5], [9, 5, -1]])).cpu()
    assert idx.shape == (2, 3) and idx.dtype == torch.int32
    assert idx[0, 1] == -1 and idx[1, 2] == -1
    assert idx[0, 0] == idx[0, 2] == idx[1, 1] != idx[1, 0]
    stats = kv.attention_bank.stats()
    assert (stats.hits[1], stats.misses[1]) == (0, 2)
    assert torch.equal(kv.attention_bank.flat_k(1)[idx[1, 0].long()].cpu(), k[1, 9])


@pytest.mark.usefixtures("eager_row_copy")
@pytest.mark.parametrize("impl", IMPLS)
def test_overflowing_call_is_counted(impl):
    kv, _, _ = make_kv(impl, attention_bank=4)
    kv.resolve_attention(0, as_tensor([1, 2, 3, 4]))
    assert kv.attention_bank.stats().overflows == [0, 0]
    kv.resolve_attention(0, as_tensor([1, 2, 3, 4, 5]))
    assert kv.attention_bank.stats().overflows == [1, 0]


# ---- data ---------------------------------------------------------------------------------------------
# Every store dtype with both store placements, in pairs: the conversion of every code of each narrower dtype is
# test_row_copy_converts_every_code_of_a_narrower_store_exactly's (each of the 8 combinations took ~5 s interpreted).
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kv_dtype,store_device_layers", [("float32", 0), ("bfloat16", 1), ("fp8_e4m3", 0),
                                                          ("fp8_e5m2", 1), ("fp8_e4m3", 1)])
def test_rows_read_through_returned_indices_equal_the_store(impl, kv_dtype, store_device_layers):
    """store_device_layers 1: the last layer's store was spilled to the device (misses: device-to-device copies)."""
    kv, _, _ = make_kv(impl, slots=64, mask_bank=12, attention_bank=10, kv_dtype=kv_dtype, seed=3,
                       store_device_layers=store_device_layers)
    assert [t.device.type for t in kv.store.k] == ["cpu"] * (LAYERS - store_device_layers) + [DEVICE.type] * store_device_layers
    for bank in kv.banks:  # poison: a row the resolve forgot to write shows
        for t in (bank.k, bank.v):
            if t is not None:
                t.view(torch.uint8).fill_(0x7F)
    rng = random.Random(7)
    # 12 calls (24 before): 6 per layer, each bank's layer sees 24-27 misses (over twice its size: rows evicted and
    # fetched again) and 11-16 hits, padding in most calls (counted with the reference impl)
    for i, call in enumerate(random_trace(rng, 12, 64, 9, 14)):
        layer = i % LAYERS
        slots = as_tensor(call)
        keep = slots >= 0
        want = slots[keep].cpu()
        mask_idx = kv.resolve_mask(layer, slots)
        att_idx = kv.resolve_attention(layer, slots)
        assert (mask_idx[~keep] == -1).all() and (att_idx[~keep] == -1).all()
        # the banks hold the model's dtype: the store's rows (FP8 / BF16 here) converted exactly
        want_k, want_v = kv.store.read(layer, want, dtype=kv.dtype)
        assert kv.mask_bank.k.dtype == kv.attention_bank.k.dtype == torch.float32
        assert torch.equal(raw(kv.mask_bank.flat_k(layer)[mask_idx[keep].long()]), raw(want_k))
        assert torch.equal(raw(kv.attention_bank.flat_k(layer)[att_idx[keep].long()]), raw(want_k))
        assert torch.equal(raw(kv.attention_bank.flat_v(layer)[att_idx[keep].long()]), raw(want_v))
    with pytest.raises(ValueError, match="keys only"):
        kv.mask_bank.flat_v(0)


def test_store_layout_with_spilled_layers():
    store = KVStore(3, 10, HKV, D, torch.bfloat16, pin_memory=False, device_layers=2, device=DEVICE)
    assert [t.device.type for t in store.k + store.v] == ["cpu", DEVICE.type, DEVICE.type] * 2
    assert all(t.shape == (10, HKV, D) and t.dtype == torch.bfloat16 for t in store.k + store.v)
    assert store.bytes_per_token == 2 * 3 * HKV * D * 2 and store.device_bytes == 2 * 10 * 2 * HKV * D * 2
    rows = torch.randn(2, HKV, D, device=DEVICE)
    for layer in range(3):
        store.write(layer, torch.tensor([7, 2], device=DEVICE), rows, -rows)
        k, v = store.read(layer, torch.tensor([2, 7]), dtype=torch.float32)
        assert torch.equal(k, rows.flip(0).bfloat16().float().cpu()) and torch.equal(v, -k)
    with pytest.raises(ValueError, match="device_layers"):
        KVStore(3, 10, HKV, D, torch.bfloat16, pin_memory=False, device_layers=4)


@pytest.mark.parametrize("kv_dtype,rtol", [("fp8_e4m3", 2.0 ** -4), ("fp8_e5m2", 2.0 ** -3)])
def test_fp8_round_trip_within_format_precision(kv_dtype, rtol):
    kv, k, v = make_kv("reference", slots=64, attention_bank=16, kv_dtype=kv_dtype, seed=5)
    assert kv.storage_dtype == OffloadConfig(kv_dtype=kv_dtype).torch_kv_dtype(torch.float32)
    assert kv.dtype == torch.float32  # the banks: what the kernels read
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(1))[:16]
    idx = kv.resolve_attention(1, slots.to(DEVICE)).long()
    got_k = kv.attention_bank.flat_k(1)[idx].float().cpu()
    got_v = kv.attention_bank.flat_v(1)[idx].float().cpu()
    # Rounding to nearest with m mantissa bits: relative error <= 2^-(m+1); subnormals need an absolute bound.
    atol = torch.finfo(kv.storage_dtype).smallest_normal
    torch.testing.assert_close(got_k, k[1][slots], rtol=rtol, atol=atol)
    torch.testing.assert_close(got_v, v[1][slots], rtol=rtol, atol=atol)
    assert not torch.equal(got_k, k[1][slots])  # it really was stored in FP8
    big = torch.full((1, HKV, D), 1e9)  # saturates to the largest finite value instead of NaN / inf
    kv.write(0, torch.tensor([3], device=DEVICE), big.to(DEVICE), -big.to(DEVICE))
    stored_k, stored_v = kv.store.read(0, torch.tensor([3]), dtype=torch.float32)
    assert (stored_k == torch.finfo(kv.storage_dtype).max).all() and (stored_v == -torch.finfo(kv.storage_dtype).max).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_writing_a_resident_slot_drops_its_bank_copy(impl):
    kv, _, _ = make_kv(impl, attention_bank=4)
    kv.resolve_attention(0, as_tensor([3, 4]))
    new_k, new_v = torch.full((1, HKV, D), 7.0, device=DEVICE), torch.full((1, HKV, D), -7.0, device=DEVICE)
    kv.write(0, as_tensor([3]), new_k, new_v)  # slot 3 reused by another sequence
    assert kv.attention_bank.resident_slots(0).tolist() == [4]
    idx = kv.resolve_attention(0, as_tensor([3, 4])).long()
    assert torch.equal(kv.attention_bank.flat_k(0)[idx[0]], new_k[0])
    assert torch.equal(kv.attention_bank.flat_v(0)[idx[0]], new_v[0])
    stats = kv.attention_bank.stats()
    assert (stats.hits[0], stats.misses[0]) == (1, 3)


@pytest.mark.parametrize("seed", [0, 1])
def test_triton_and_reference_give_identical_banks_tables_and_stats(seed):
    systems = {impl: make_kv(impl, slots=80, mask_bank=10, attention_bank=14, seed=seed)[0] for impl in IMPLS}
    rng = random.Random(seed)
    for i, call in enumerate(random_trace(rng, 30, 80, 11, 20)):
        layer = rng.randrange(LAYERS)
        out = {impl: (kv.resolve_mask(layer, as_tensor(call)), kv.resolve_attention(layer, as_tensor(call)))
               for impl, kv in systems.items()}
        assert all(torch.equal(a, b) for a, b in zip(out["reference"], out["triton"])), f"call {i}"
    ref, tri = systems["reference"], systems["triton"]
    for b_ref, b_tri in zip(ref.banks, tri.banks):
        S, B = b_ref.num_slots, b_ref.bank_tokens
        assert torch.equal(b_ref.table[:, :S], b_tri.table[:, :S])
        for name in ("owner", "last_used"):
            assert torch.equal(getattr(b_ref, name)[:, :B], getattr(b_tri, name)[:, :B])
        for name in ("k", "v", "clock", "hits", "misses", "overflows"):
            a, b = getattr(b_ref, name), getattr(b_tri, name)
            assert (a is None and b is None) or torch.equal(a, b), name
        assert b_ref.stats() == b_tri.stats()
    assert all(torch.equal(a, b) for a, b in zip(ref.store.k + ref.store.v, tri.store.k + tri.store.v))


@pytest.fixture
def small_lru_blocks(monkeypatch):
    """The LRU kernels' block sizes scaled down 8-16x, so traces of about a thousand requests take every multi-block
    path the production sizes take at several thousand (several lookup steps, tens of finish programs, several
    partition programs that publish and wait, prefix loops over several steps) at a fraction of the interpreter's
    time. The production sizes run in the slow cases (`make test-all`)."""
    from infinitehip.kv.offload.lru import triton as lru_triton

    monkeypatch.setattr(lru_triton, "LOOKUP_BLOCK", 256)
    monkeypatch.setattr(lru_triton, "SUB", 32)
    monkeypatch.setattr(lru_triton, "PREFIX_BLOCK", 8)
    monkeypatch.setattr(lru_triton, "_partition_block", lambda B: max(128, triton.next_power_of_2(-(-B // 16))))
    return 8  # the scale-down of the traces


@pytest.mark.usefixtures("eager_row_copy")
@pytest.mark.parametrize("scale", [pytest.param(1, marks=pytest.mark.slow), "small"])
def test_triton_equals_reference_on_calls_of_thousands_of_requests(scale, request):
    """Calls of 4,500 requests (duplicates, padding) span 18 finish programs; with a 3,000-entry bank the calls
    overflow. Outputs, tables, reverse maps, stamps, LRU order and counters must equal the reference. "small":
    the same trace shape scaled down 8x with the kernels' blocks scaled down to match (`small_lru_blocks`)."""
    div = request.getfixturevalue("small_lru_blocks") if scale == "small" else 1
    slots, bank_tokens = 9000 // div, 3000 // div
    systems = {impl: make_kv(impl, slots=slots, mask_bank=16, attention_bank=bank_tokens, seed=6)[0] for impl in IMPLS}
    rng = random.Random(bank_tokens)
    for i, call in enumerate(random_trace(rng, 3, slots, 4500 // div, 7000 // div)):
        out = {impl: kv.resolve_attention(1, as_tensor(call)) for impl, kv in systems.items()}
        assert torch.equal(out["reference"], out["triton"]), f"call {i}"
    ref, tri = systems["reference"].attention_bank, systems["triton"].attention_bank
    S, B = ref.num_slots, ref.bank_tokens  # (the last entry of each is the reference's masked-write sink)
    assert torch.equal(ref.table[:, :S], tri.table[:, :S])
    for name in ("owner", "last_used"):
        assert torch.equal(getattr(ref, name)[:, :B], getattr(tri, name)[:, :B]), name
    for name in ("clock", "hits", "misses", "overflows"):
        assert torch.equal(getattr(ref, name), getattr(tri, name)), name
    assert torch.equal(ref.lru_order(1), tri.lru_order(1))
    assert torch.equal(ref.k, tri.k) and torch.equal(ref.v, tri.v)
    assert sum(ref.stats().overflows) > 0


def test_triton_row_copy_matches_reference_for_every_storage_dtype():
    from infinitehip.kv.offload.reference import copy_rows_reference
    from infinitehip.kv.offload.triton import copy_rows_triton

    g = torch.Generator().manual_seed(0)
    for dtype, row in ((torch.float32, (3, 5)), (torch.bfloat16, (2, 3)), (torch.float8_e4m3fn, (1, 3)),
                       (torch.float8_e5m2, (2, 4))):
        src = torch.randn(20, *row, generator=g).to(dtype).to(DEVICE)
        src_rows = torch.tensor([4, -1, 0, 19, 7, 3], device=DEVICE)
        dst_rows = torch.tensor([0, 5, 6, -1, 2, 9], device=DEVICE)
        outs = []
        for fn in (copy_rows_reference, copy_rows_triton):
            dst = torch.full((10, *row), -3.0).to(dtype).to(DEVICE)
            fn(src, src_rows, dst, dst_rows)
            outs.append(dst)
        assert torch.equal(raw(outs[0]), raw(outs[1])), dtype
        assert torch.equal(raw(outs[1][[0, 6, 2]]), raw(src[[4, 0, 7]])), dtype
        assert torch.equal(raw(outs[1][5]), raw(torch.full(row, -3.0).to(dtype))), dtype


def test_resolve_rejects_slots_on_another_device():
    kv, _, _ = make_kv("reference", attention_bank=4)
    with pytest.raises(ValueError, match="attention bank"):
        kv.resolve_attention(0, torch.tensor([1], device="meta"))


# ---- the explicit LRU order against the former top-k resolve --------------------------------------------
class TopkOracle:
    """The former resolve (LRU key = last_used * (S + 1) + owner, free entries by index first, top-k victims)
    on plain CPU tensors of one layer: the semantics the explicit LRU order must reproduce exactly."""

    def __init__(self, S: int, B: int):
        self.S, self.B = S, B
        self.table = torch.full((S + 1,), -1, dtype=torch.int64)
        self.owner = torch.full((B + 1,), -1, dtype=torch.int64)
        self.last_used = torch.zeros(B + 1, dtype=torch.int64)
        self.clock, self.hits, self.misses = 0, 0, 0

    def keys(self) -> torch.Tensor:
        entries = torch.arange(self.B + 1)
        key = torch.where(self.owner >= 0, self.last_used * (self.S + 1) + self.owner, entries - (self.B + 1))
        key[self.B] = torch.iinfo(torch.int64).max
        return key

    def lru_order(self) -> torch.Tensor:
        return torch.sort(self.keys()[: self.B], stable=True).indices

    def resolve(self, call: list[int]) -> list[int]:
        S, B = self.S, self.B
        slots = torch.tensor(call, dtype=torch.int64)
        n = slots.numel()
        s_sorted, order = torch.sort(torch.where(slots >= 0, slots, S))
        valid = s_sorted < S
        first = valid.clone()
        first[1:] &= s_sorted[1:] != s_sorted[:-1]
        current = self.table[s_sorted]
        hit, miss = first & (current >= 0), first & (current < 0)
        self.clock += 1
        key = self.keys()
        key[current[hit]] = torch.iinfo(torch.int64).max
        victims = torch.topk(key, min(n, B), largest=False, sorted=True).indices
        victim = victims[(torch.cumsum(miss, 0) - 1).clamp(0, min(n, B) - 1)]
        resolved = torch.where(miss, victim, current)
        evicted = self.owner[victim[miss]]
        self.table[evicted[evicted >= 0]] = -1
        self.table[s_sorted[miss]] = victim[miss]
        self.owner[victim[miss]] = s_sorted[miss]
        self.last_used[resolved[first]] = self.clock
        self.hits += int(hit.sum())
        self.misses += int(miss.sum())
        run_first = torch.where(first, torch.arange(n), 0).cummax(0).values
        out = torch.empty(n, dtype=torch.int64)
        out[order] = torch.where(valid, resolved[run_first], -1)
        return out.tolist()

    def invalidate(self, slots: list[int]) -> None:
        for s in slots:
            if 0 <= s < self.S and self.table[s] >= 0:
                e = int(self.table[s])
                self.owner[e], self.last_used[e], self.table[s] = -1, 0, -1


def assert_same_state(bank, layer, oracle, msg):
    S, B = bank.num_slots, bank.bank_tokens
    assert torch.equal(bank.table[layer, :S].long().cpu(), oracle.table[:S]), msg
    assert torch.equal(bank.owner[layer, :B].long().cpu(), oracle.owner[:B]), msg
    assert torch.equal(bank.last_used[layer, :B].cpu(), oracle.last_used[:B]), msg
    assert torch.equal(bank.lru_order(layer).long().cpu(), oracle.lru_order()), msg
    assert int(bank.clock[layer]) == oracle.clock, msg
    stats = bank.stats()
    assert (stats.hits[layer], stats.misses[layer], stats.overflows[layer]) == (oracle.hits, oracle.misses, 0), msg


@pytest.mark.usefixtures("eager_row_copy")
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("slots,bank_tokens,per_call,hot,steps", [
    (96, 8, 6, 10, 40),     # small bank, full after a few calls
    (96, 16, 16, 12, 30),   # calls as large as the bank: every distinct slot list fits exactly or nearly
    (512, 64, 48, 80, 20),  # larger trace
    (300, 128, 40, 60, 30), # bank never full: free entries are taken by index
    # calls of > 4096 requests: two lookup steps and 17 finish programs (production block sizes: slow)
    pytest.param(9000, 4500, 4200, 7000, 2, marks=pytest.mark.slow),
    (1125, 562, 525, 875, "small"),  # the same scaled down 8x, with the blocks scaled down (small_lru_blocks)
])
def test_explicit_lru_order_matches_the_topk_oracle_exactly(impl, slots, bank_tokens, per_call, hot, steps, request):
    from infinitehip.kv.offload.resolve import invalidate

    if steps == "small":
        request.getfixturevalue("small_lru_blocks")
        steps = 2

    kv, k, _ = make_kv(impl, slots=slots, mask_bank=bank_tokens, attention_bank=bank_tokens, seed=4)
    bank = kv.attention_bank
    oracles = [TopkOracle(slots, bank_tokens) for _ in range(LAYERS)]
    rng = random.Random(slots + bank_tokens + per_call)
    for i, call in enumerate(random_trace(rng, steps, slots, per_call, hot)):
        layer = rng.randrange(LAYERS)
        if len({s for s in call if s >= 0}) > bank_tokens:
            continue  # an overflowing call: checked separately
        if rng.random() < 0.3:  # drop a few slots, resident or not (store rows rewritten)
            dropped = [rng.randrange(-1, slots) for _ in range(rng.randrange(1, 6))]
            if rng.random() < 0.5:
                resident = bank.resident_slots(layer).tolist()
                dropped += rng.sample(resident, min(len(resident), 3))
            invalidate(bank, layer, as_tensor(dropped), impl=impl)
            oracles[layer].invalidate(dropped)
            assert_same_state(bank, layer, oracles[layer], f"invalidate before call {i}")
        out = resolve_call(kv, layer, call)
        assert out == oracles[layer].resolve(call), f"call {i}"
        assert_same_state(bank, layer, oracles[layer], f"call {i}")
        keep = [j for j, s in enumerate(call) if s >= 0]
        rows = bank.flat_k(layer)[torch.tensor([out[j] for j in keep], dtype=torch.long, device=DEVICE)].cpu()
        assert torch.equal(rows, k[layer][[call[j] for j in keep]]), f"call {i}"


def resolve_call(kv, layer, call):
    return kv.resolve_attention(layer, as_tensor(call)).tolist()


@pytest.mark.usefixtures("eager_row_copy")
@pytest.mark.parametrize("impl", IMPLS)
def test_invalidate_then_resolve_reuses_freed_entries_by_index(impl):
    kv, k, _ = make_kv(impl, attention_bank=6)
    bank = kv.attention_bank
    kv.resolve_attention(0, as_tensor([10, 11, 12, 13, 14, 15]))  # full: entries 0..5 hold 10..15
    kv.write(0, as_tensor([14, 11]), k[0][[14, 11]].to(DEVICE), k[0][[14, 11]].to(DEVICE))
    assert bank.lru_order(0).tolist() == [1, 4, 0, 2, 3, 5]  # freed entries first, by index
    idx = kv.resolve_attention(0, as_tensor([30, 12, 31])).tolist()
    assert idx == [1, 2, 4]  # 30 -> entry 1, 31 -> entry 4 (the free ones, by index), 12 hit
    assert bank.lru_order(0).tolist() == [0, 3, 5, 2, 1, 4]
    idx = kv.resolve_attention(0, as_tensor([40])).tolist()
    assert idx == [0]  # then the least recently used: slot 10 in entry 0


@pytest.mark.usefixtures("eager_row_copy")
@pytest.mark.parametrize("impl", IMPLS)
def test_an_overflowing_call_leaves_a_consistent_bank(impl):
    kv, k, _ = make_kv(impl, attention_bank=4)
    bank = kv.attention_bank
    kv.resolve_attention(0, as_tensor([1, 2]))
    idx = kv.resolve_attention(0, as_tensor([9, 2, 7, 8, 5])).tolist()  # 5 distinct slots, 4 entries
    assert bank.stats().overflows == [1, 0]
    # the hit (2) and the first misses in slot order that fit (5, 7, 8) are resident; 9 did not fit
    assert bank.resident_slots(0).tolist() == [2, 5, 7, 8] and idx[0] == -1
    owner, table = bank.owner[0, :4].long().cpu(), bank.table[0, :96].long().cpu()
    assert sorted(bank.lru_order(0).tolist()) == [0, 1, 2, 3]
    assert all(table[owner[e]] == e for e in range(4)) and int((table >= 0).sum()) == 4
    idx = kv.resolve_attention(0, as_tensor([9, 2])).long()
    assert torch.equal(bank.flat_k(0)[idx].cpu(), k[0][[9, 2]])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("store_dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16])
@pytest.mark.parametrize("bank_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_row_copy_converts_every_code_of_a_narrower_store_exactly(impl, store_dtype, bank_dtype):
    """A miss copies store rows (FP8 / BF16) into a bank of the model's dtype: every FP8 code (and random BF16
    values) must arrive as torch's own conversion, bit for bit (signed zeros, subnormals, extremes)."""
    if store_dtype == bank_dtype:
        pytest.skip("same dtype: the raw copy")
    # 64 rows of 4 codes (each 4 times; 256 rows of 1 code before): the same codes and values, a quarter of the
    # interpreted programs (one per row)
    if store_dtype == torch.bfloat16:
        src = torch.randn(64, 16, generator=torch.Generator().manual_seed(2)).to(store_dtype)
    else:
        src = torch.arange(256, dtype=torch.uint8).view(store_dtype).view(64, 4).repeat_interleave(4, 1).contiguous()
    src_rows = torch.randperm(64, generator=torch.Generator().manual_seed(3))
    src_rows[::7] = -1  # skipped rows leave the bank untouched
    want = torch.full((80, 16), 5.0, dtype=bank_dtype)
    dst, dst_rows = want.clone().to(DEVICE), torch.arange(64) + 10
    copy_rows(src.to(DEVICE), src_rows.to(DEVICE), dst, dst_rows.to(DEVICE), impl)
    got = dst.cpu()
    live = src_rows >= 0
    want[dst_rows[live]] = src[src_rows[live]].to(bank_dtype)
    nan = got.isnan() & want.isnan()
    assert torch.equal(raw(torch.where(nan, 0, got)), raw(torch.where(nan, 0, want)))


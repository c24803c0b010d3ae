"""Offload capacity planner and bank sizing, with fixed memory numbers (nothing is allocated)."""

import dataclasses

import pytest
import torch

from infinitehip.attention.methods.infinitehip.bank_sizing import check_bank_requests, decode_bank_requests
from infinitehip.attention.methods.infinitehip.config import PRESETS, infinitehip_preset
from infinitehip.config.offload import OffloadConfig
from infinitehip.kv.offload.bank import KVBank
from infinitehip.kv.offload.planner import CapacityError, gpu_free_bytes, host_available_bytes, plan_capacity

GIB = 1 << 30
SMALL = OffloadConfig(mask_bank_tokens=3, attention_bank_tokens=3, host_memory_fraction=1.0, gpu_memory_fraction=1.0,
                      stage_prefill=False)  # by-hand numbers without the staging buffer (its own test below)


def test_small_plan_by_hand_limited_by_gpu_tables():
    # 2 layers, 1 kv head, d = 4, fp32: host 2*2*1*4*4 = 64 B/token; tables 2 banks * 2 layers * 4 B = 16 B/token.
    # Banks per layer: mask rows 4*16 + maps 4*16 + 4 + 32 counters = 164, attention 2*4*16 + 68 + 32 = 228 -> 784 B.
    plan = plan_capacity(2, 1, 4, torch.float32, SMALL, gpu_free=10_000, host_available=64_000, page_size=64,
                         bank_dtype=torch.float32)
    assert plan.gpu_bank_bytes == 784
    assert (plan.host_bytes_per_token, plan.gpu_bytes_per_token) == (64, 16)
    assert plan.max_tokens == (10_000 - 784) // 16 // 64 * 64 == 576
    assert plan.limited_by == "gpu"
    assert plan.gpu_bytes <= 10_000 and plan.host_bytes == 576 * 64


def test_staged_prefill_reserves_one_layer_of_kv_per_token():
    # stage_prefill: + one layer's K and V in the banks' dtype per token (2 * 1 head * 4 * 4 B = 32) on the GPU
    staged = plan_capacity(2, 1, 4, torch.float32, dataclasses.replace(SMALL, stage_prefill=True), gpu_free=10_000,
                           host_available=64_000, page_size=64, bank_dtype=torch.float32)
    assert staged.gpu_bytes_per_token == 16 + 32
    assert staged.max_tokens == (10_000 - 784) // 48 // 64 * 64


def test_small_plan_by_hand_limited_by_host():
    plan = plan_capacity(2, 1, 4, torch.float32, SMALL, gpu_free=10**9, host_available=64_000, page_size=64,
                         bank_dtype=torch.float32, spill=False)
    assert plan.max_tokens == 960 and plan.limited_by == "host"
    assert plan.store_device_layers(960) == 0 and plan.store_device_layers(1024) == 3  # 3: beyond num_layers


def test_spilled_layers_by_hand():
    # Per layer 2*1*4*4 = 32 B/token. Host 64,000 B holds both layers up to 1,000 tokens, one layer up to 2,000.
    # GPU 100,000 B: banks 784 + 16 B/token of tables + 32 B/token per spilled layer.
    plan = plan_capacity(2, 1, 4, torch.float32, SMALL, gpu_free=100_000, host_available=64_000, page_size=64,
                         bank_dtype=torch.float32, spill=True)
    assert [plan.store_device_layers(t) for t in (960, 1000, 1001, 2000, 2001)] == [0, 0, 1, 1, 2]
    # one layer spilled: 784 + 48 * 1,984 = 96,016 <= 100,000; 2,048 tokens would need both layers on the GPU
    # (784 + 80 * 2,048 > 100,000)
    assert plan.max_tokens == 1984 and plan.limited_by == "host + gpu"
    assert plan.gpu_bytes == 784 + 1984 * 48 and plan.host_bytes == 1984 * 32
    # a GPU with room for its tables only: 960 as without spill (1,024 would need a spilled layer: no room)
    small_gpu = plan_capacity(2, 1, 4, torch.float32, SMALL, gpu_free=784 + 16 * 1100, host_available=64_000,
                              page_size=64, bank_dtype=torch.float32, spill=True)
    assert small_gpu.max_tokens == 960 and small_gpu.limited_by == "host + gpu"


def test_llama8b_fp8_2m_tokens_spill_four_layers_on_a_128_gib_host():
    # An H100 after 16 GB of weights (~64 GiB free) and a host with 125 GiB available: the 2M FP8 store is
    # 128 GiB, the host budget 112.5 GiB (28 layers of 4 GiB), so 4 layers (16 GiB) live in GPU memory.
    cfg = OffloadConfig(kv_dtype="fp8_e4m3")
    args = dict(num_layers=32, num_kv_heads=8, head_dim=128, kv_dtype=torch.float8_e4m3fn, config=cfg,
                gpu_free=64 * GIB, host_available=125 * GIB, page_size=64, bank_dtype=torch.bfloat16)
    host_only = plan_capacity(**args, spill=False)
    assert host_only.max_tokens == 1_843_200 and host_only.limited_by == "host"
    plan = plan_capacity(**args, gpu_store_fraction=0.0)  # spill_store_to_gpu defaults to on
    assert plan.store_device_layers(2 * 1024 * 1024) == 4 and plan.fits(2 * 1024 * 1024)
    assert plan.max_tokens > 2 * 1024 * 1024 and plan.limited_by == "host + gpu"
    assert ", GPU store " in plan.summary and plan.summary.endswith("FP8 e4m3")
    assert plan.layout(2 * 1024 * 1024) == ("KV store: 2,097,152 tokens: 28 layers in host memory (112.0 GiB), "
                                            "4 in GPU memory (16.0 GiB)")
    with pytest.raises(CapacityError, match=r"limited by host \+ gpu memory: host 112.5 GiB \+ layers spilled"):
        plan.check(plan.max_tokens + 64)


def test_gpu_first_layers_take_a_share_of_the_budget_a_kv_leaves_free():
    # SMALL: 32 B/token per layer; GPU 100,000 B: banks 784 + 16 B/token of tables (+ 32 B/token per spilled layer).
    plan = plan_capacity(2, 1, 4, torch.float32, dataclasses.replace(SMALL, gpu_store_fraction=0.5), gpu_free=100_000,
                         host_available=64_000, page_size=64, bank_dtype=torch.float32, spill=True)
    # 500 tokens: 91,216 B left, half of it holds 2 layers of 16,000 B; 960: 83,856 left, half holds one of 30,720
    assert [plan.device_store_layers(t) for t in (500, 960)] == [2, 1]
    # 1,984 tokens: one layer spilled (the host holds one), 3,984 B left: no GPU-first layer
    assert plan.store_device_layers(1984) == plan.device_store_layers(1984) == 1
    assert plan.max_tokens == 1984  # the capacity is the same as without GPU-first layers
    assert plan.layout(960) == ("KV store: 960 tokens: 1 layers in host memory (0.0 GiB), 1 in GPU memory "
                                "(0.0 GiB, 1 of them GPU-first)")
    # an 8B-shaped 1M FP8 KV on an H100 (64 GiB free after the weights): all of it fits the host; the budget (57.6 GiB)
    # less the banks (12 GiB), tables (0.25 GiB) and staging buffer (4 GiB) leaves ~41 GiB: half holds 10 layers of 2 GiB
    big = plan_capacity(32, 8, 128, torch.float8_e4m3fn, OffloadConfig(kv_dtype="fp8_e4m3"), gpu_free=64 * GIB,
                        host_available=125 * GIB, page_size=64, bank_dtype=torch.bfloat16)
    assert big.store_device_layers(1 << 20) == 0 and big.device_store_layers(1 << 20) == 10
    off = plan_capacity(32, 8, 128, torch.float8_e4m3fn, OffloadConfig(kv_dtype="fp8_e4m3", gpu_store_fraction=0.0),
                        gpu_free=64 * GIB, host_available=125 * GIB, page_size=64, bank_dtype=torch.bfloat16)
    assert off.device_store_layers(1 << 20) == 0 and off.max_tokens == big.max_tokens


def test_bank_bytes_match_a_real_allocation():
    bank = KVBank("attention", 2, 50, 7, 3, 8, torch.bfloat16, "cpu", with_values=True)
    allocated = sum(t.numel() * t.element_size() for t in (bank.k, bank.v, bank.table, bank.owner, bank.last_used, bank.order,
                                                           bank.clock, bank.hits, bank.misses, bank.overflows))
    assert KVBank.device_bytes(2, 50, 7, 3, 8, 2, with_values=True) == allocated


def test_llama8b_fp8_summary_and_refusal():
    cfg = OffloadConfig(kv_dtype="fp8_e4m3")
    plan = plan_capacity(32, 8, 128, cfg.torch_kv_dtype(torch.bfloat16), cfg, gpu_free=40 * GIB,
                         host_available=100 * GIB, page_size=64, bank_dtype=torch.bfloat16, spill=False)
    # the banks hold the model's dtype (misses are upcast): 2 bytes per element, not 1
    bf16 = plan_capacity(32, 8, 128, torch.bfloat16, cfg, gpu_free=40 * GIB, host_available=100 * GIB, page_size=64,
                         bank_dtype=torch.bfloat16, spill=False)
    assert plan.gpu_bank_bytes == bf16.gpu_bank_bytes and plan.host_bytes_per_token * 2 == bf16.host_bytes_per_token
    # host: 0.9 * 100 GiB / (2 * 32 * 8 * 128 B) = 1,474,560 tokens; the GPU tables would allow far more
    assert plan.max_tokens == 1_474_560 and plan.limited_by == "host"
    assert plan.summary == "KV capacity: 1,474,560 tokens: GPU bank 65,536 tokens, host 90.0 GiB, FP8 e4m3"
    plan.check(1_474_560)
    with pytest.raises(CapacityError, match=r"2,000,000 KV tokens.*1,474,560 tokens"):
        plan.check(2_000_000)


def test_bf16_summary_label():
    plan = plan_capacity(32, 8, 128, torch.bfloat16, OffloadConfig(spill_store_to_gpu=False), gpu_free=40 * GIB,
                         host_available=100 * GIB, bank_dtype=torch.bfloat16)
    assert plan.summary.endswith(", BF16") and plan.max_tokens == 737_280


def test_banks_that_do_not_fit_the_gpu_are_refused_naming_the_fields():
    cfg = OffloadConfig(mask_bank_tokens=1 << 20, attention_bank_tokens=1 << 20)
    with pytest.raises(CapacityError, match=r"mask_bank_tokens=1,048,576 and attention_bank_tokens=1,048,576 need"):
        plan_capacity(32, 8, 128, torch.bfloat16, cfg, gpu_free=8 * GIB, host_available=100 * GIB,
                      bank_dtype=torch.bfloat16)


@pytest.mark.parametrize("field,value", [("num_layers", 0), ("page_size", 0), ("gpu_free", -1), ("host_available", -5)])
def test_plan_rejects_bad_arguments(field, value):
    args = dict(num_layers=2, num_kv_heads=1, head_dim=4, kv_dtype=torch.float32, config=SMALL, gpu_free=1 << 20,
                host_available=1 << 20, page_size=1, bank_dtype=torch.float32)
    args[field] = value
    with pytest.raises(ValueError, match=field):
        plan_capacity(**args)


def test_machine_memory_readers():
    assert host_available_bytes() > 0
    if not torch.cuda.is_available():
        assert gpu_free_bytes() == 0


def test_worst_case_requests_3k_at_1m_landmark():
    req = decode_bank_requests(PRESETS["3k"], 1 << 20, num_heads=32)
    # The mask bank holds one group of chunks at a time: at least one chunk's representatives, one per query head
    # (stages 0 and 1: min(32 heads, chunks of 256 / 32 tokens) = 32; stage 2: chunks of 8 tokens, 8).
    assert (req.mask_tokens, req.mask_stage) == (32, 0)
    # One group per stage would need stage 0's 4,091 chunks of 256 over [256, 1M - 1024) x 32 heads.
    assert req.mask_stage_tokens == 4091 * 32
    # sink 256 + early-layer keep 4096 + stream 1024 + the window's reach back (max refresh interval 16)
    assert req.attention_tokens == 256 + 4096 + 1024 + 16
    check_bank_requests(OffloadConfig(), req)  # the default mask bank (65,536): stage 0 in two groups
    with pytest.raises(CapacityError, match=r"mask_bank_tokens=31 .*one chunk's representatives.*at least 32"):
        check_bank_requests(OffloadConfig(mask_bank_tokens=31, attention_bank_tokens=8192), req)
    check_bank_requests(OffloadConfig(mask_bank_tokens=32, attention_bank_tokens=8192), req)
    with pytest.raises(CapacityError, match="attention_bank_tokens=4,096"):
        check_bank_requests(OffloadConfig(mask_bank_tokens=131072, attention_bank_tokens=4096), req)


def test_worst_case_requests_bisection_short_context_and_batches():
    method = infinitehip_preset("3k", representative="bisection")
    req = decode_bank_requests(method, 1 << 20, num_heads=32)
    assert req.mask_tokens == 256  # bisection may touch every key of a chunk of 256 (32 heads x 9 probes)
    assert req.mask_stage_tokens == (1 << 20) - 256 - 1024  # ... so every candidate of stage 0
    short = decode_bank_requests(PRESETS["3k"], 2000, num_heads=32)
    # 720 candidates: stage 0 reads 3 chunks * 32 heads = 96 keys, stage 1 all 720 (23 chunks * 32 > 720)
    assert (short.mask_tokens, short.mask_stage, short.mask_stage_tokens) == (32, 0, 720)
    assert short.attention_tokens == 2000  # never more than the context
    batched = decode_bank_requests(PRESETS["3k"], 2000, num_heads=32, num_seqs=4)
    # Mask-bank calls are per sequence; the attention call batches the decoding sequences.
    assert (batched.mask_tokens, batched.attention_tokens) == (32, 4 * 2000)
    with pytest.raises(ValueError, match="num_seqs"):
        decode_bank_requests(PRESETS["3k"], 2000, num_heads=32, num_seqs=0)

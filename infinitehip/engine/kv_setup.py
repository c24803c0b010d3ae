"""The engine's KV storage: the resident `PagedKVCache`, or with offloading on, the host store + GPU banks.

Offloading (paper Sec. 3.3, `kv/offload/`): after the model is loaded, the method checks it can run offloaded
and that one resolve call fits each bank (`attention/capabilities.KVOffload`; one declaring none is refused), the capacity planner sizes the KV
from the free GPU memory and the available host memory, its summary is reported, and a KV larger than the
plan is refused before anything is allocated. The page allocator and page tables are the same in both modes
(store slot = cache slot).
"""

from __future__ import annotations

import logging
import sys

import torch

from infinitehip.attention.base import AttentionMethod
from infinitehip.attention.capabilities import accept_offload
from infinitehip.config.model import ModelConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.kv.offload import planner
from infinitehip.kv.offload.paged import OffloadedPagedCache
from infinitehip.kv.offload.planner import CapacityPlan
from infinitehip.kv.paged_cache import PagedKVCache

logger = logging.getLogger(__name__)


def plan_offload(offload: OffloadConfig, method: AttentionMethod, mc: ModelConfig, dtype: torch.dtype,
                 device: torch.device, page_size: int, kv_tokens: int, max_context_tokens: int,
                 max_num_seqs: int, parallel=None) -> CapacityPlan:
    """Checks and the capacity plan of an offloaded KV of kv_tokens tokens (raises before any allocation).
    parallel: a tensor-parallel rank: its store gets its share of the host memory (`ParallelState.host_share`)."""
    accept_offload(method, offload, max_context_tokens, max_num_seqs)  # from here on the method is a KVOffload
    kv_dtype = offload.torch_kv_dtype(dtype)
    host = planner.host_available_bytes()
    if parallel is not None:
        host = parallel.host_share(host)
    # On CPU the banks live in host memory too (and spilling store layers to it would count that memory twice).
    cuda = device.type == "cuda"
    gpu = planner.gpu_free_bytes(device) if cuda else host
    plan = planner.plan_capacity(mc.num_layers, mc.num_kv_heads, mc.head_dim, kv_dtype, offload, gpu, host, page_size,
                                 bank_dtype=dtype, spill=offload.spill_store_to_gpu and cuda,
                                 gpu_store_fraction=offload.gpu_store_fraction if cuda else 0.0,
                                 method_bytes_per_token=method.device_bytes_per_slot())
    plan.check(kv_tokens, f"the KV cache (kv-cache-tokens / max-context-tokens: {kv_tokens:,} tokens)")
    return plan


def build_kv(offload: OffloadConfig | None, method: AttentionMethod, mc: ModelConfig, dtype: torch.dtype,
             device: torch.device, page_size: int, num_pages: int, max_context_tokens: int, max_num_seqs: int,
             show: bool = True, parallel=None) -> tuple[PagedKVCache | OffloadedPagedCache, CapacityPlan | None]:
    """(cache, plan): a resident paged cache (plan None) or, with offload_enabled, the offloaded KV and its plan."""
    if offload is None or not offload.offload_enabled:
        if offload is not None and offload.torch_kv_dtype(dtype) != dtype:
            raise ValueError(f"kv_dtype={offload.kv_dtype!r} needs offload_enabled: the resident cache is read by the "
                             f"attention kernels in the model's dtype ({dtype}); an FP8 KV lives in the host store")
        return PagedKVCache(mc.num_layers, num_pages, page_size, mc.num_kv_heads, mc.head_dim, dtype, device), None
    plan = plan_offload(offload, method, mc, dtype, device, page_size, num_pages * page_size, max_context_tokens,
                        max_num_seqs, parallel)
    kv_tokens = num_pages * page_size
    for line in (plan.summary, plan.layout(kv_tokens)):
        logger.info(line)
        if show:
            print(line, file=sys.stderr)
    cache = OffloadedPagedCache(offload, mc.num_layers, num_pages, page_size, mc.num_kv_heads, mc.head_dim, dtype,
                                device, store_device_layers=plan.device_store_layers(kv_tokens),
                                attention_spare_rows=method.offload_spare_rows())
    return cache, plan

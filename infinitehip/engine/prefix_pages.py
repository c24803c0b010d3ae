"""The tensor side of prefix caching: whether it is on, and the page copies and snapshots of a reused prefix.

The scheduler decides from hashes and reference counts which pages a sequence reuses (kv/prefix_cache.py);
this module runs what that needs on the KV: copying the pages a method keeps private (their k/v and the
method's per-slot state, `PrefixReuse.private_tail_tokens`), taking that state's snapshot when a chunk
reaches a prefix boundary, and the sliding-window layers' rings at a boundary (kept with it, restored into a
hit's ring row).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from infinitehip.attention.base import AttentionMethod
from infinitehip.attention.capabilities import kv_token_limit, prefix_reuse_of
from infinitehip.host_values import device_tensor
from infinitehip.attention.common.sliding_window import SlidingWindowAttention
from infinitehip.engine.sequence import Sequence
from infinitehip.kv.prefix_reuse import PrefixHit, PrefixPolicy

logger = logging.getLogger(__name__)


def prefix_policy(enabled: bool, method: AttentionMethod, has_sliding_layers: bool, page_size: int,
                  prefill_chunk_size: int) -> PrefixPolicy | None:
    """The method's reuse policy, or None (with a log line saying why) when prefix caching is off."""
    if not enabled:
        return None
    reuse = prefix_reuse_of(method)
    why = None
    if reuse is None:
        why = f"method {method.name!r}: {method.prefix_reuse_note}"
    elif kv_token_limit(method) is not None:
        why = f"method {method.name!r} compacts its cache"
    if why is not None:
        logger.info("prefix caching off: %s", why)
        return None
    # Sliding-window layers hold the last window per sequence outside the paged cache: boundaries carry their rings.
    return PrefixPolicy(reuse, page_size, prefill_chunk_size, rings=has_sliding_layers,
                        prompt_end_tokens=method.prompt_end_tokens)


@dataclass
class BoundaryState:
    """What a cached prefix boundary keeps beside its pages (host memory): the method's snapshot of its private
    tail (None: it keeps none) and the sliding-window layers' rings (k, v) [layers, window, kv_heads, head_dim]."""

    method: Any = None
    rings: tuple[torch.Tensor, torch.Tensor] | None = None


def page_slots(pages: list[int], page_size: int, device: torch.device) -> torch.Tensor:
    """Flat slots [len(pages) * page_size] (int64) of whole pages."""
    p = device_tensor(pages, torch.long, device)
    return (p[:, None] * page_size + torch.arange(page_size, device=device)).flatten()


def copy_pages(cache, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Every layer's k/v of slots src [N] into slots dst [N] (resident or offloaded KV)."""
    if getattr(cache, "is_offloaded", False):  # the store is the page pool; writes drop stale bank rows
        for layer in range(cache.num_layers):
            k, v = cache.kv.store.read(layer, src)
            cache.kv.write(layer, dst, k.to(cache.device), v.to(cache.device))
    else:
        cache.copy_slots(src, dst)


@torch.inference_mode()
def apply_hit(cache, method: AttentionMethod, sliding: SlidingWindowAttention | None, seq: Sequence, hit: PrefixHit,
              state: BoundaryState | None, page_size: int) -> None:
    """Run a reused prefix's page copies and restore its boundary state `state` (the payload of
    hit.snapshot_page), before the sequence's first forward."""
    if hit.copies:
        src = page_slots([s for s, _ in hit.copies], page_size, cache.device)
        dst = page_slots([d for _, d in hit.copies], page_size, cache.device)
        copy_pages(cache, src, dst)
        method.restore_prefix(cache, dst, state.method, seq.method_state)
    if sliding is not None:
        sliding.restore(seq.seq_id, state.rings)


@torch.inference_mode()
def boundary_state(cache, method: AttentionMethod, sliding: SlidingWindowAttention | None, policy: PrefixPolicy,
                   seq: Sequence, boundary: int) -> BoundaryState | None:
    """A chunk ended at a cached prefix boundary: the method's state of the boundary's private tail and the
    sliding layers' rings, kept with the boundary's last page. The rings are those at the chunk's end, or the copy
    the chunk kept at a boundary inside it (`SequenceSlice.ring_boundary`); None without them (a boundary without
    its state is not reused: the scheduler steps back to one with it)."""
    rings = None if sliding is None else sliding.snapshot(seq.seq_id, boundary, seq.num_computed)
    if sliding is not None and rings is None:
        return None
    state = BoundaryState(rings=rings)
    tail = policy.tail_pages(boundary)
    if len(tail):
        slots = page_slots([seq.page_table[i] for i in tail], policy.page_size, cache.device)
        state.method = method.prefix_snapshot(cache, slots, seq.method_state)
    return state

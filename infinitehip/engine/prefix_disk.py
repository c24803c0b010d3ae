"""Cached prefixes on disk: save the prefix cache's pages as safetensors, load them into a fresh engine.

A file holds, per cached page, its hash [32] uint8, owner (the sequence that computed it: methods with
private per-slot state reuse one owner's chain only) and k/v [layers, page_size, kv_heads, head_dim] in the
KV's dtype, the method's per-slot state of those keys (InfiniteHiP's landmark saliency, which selection reads
at every later chunk: without it a loaded prefix would select other keys than the engine that computed it),
plus the state kept at prefix boundaries (the methods' snapshots, the sliding-window layers' rings). Its
metadata carries a fingerprint of everything the k/v depend on (model config, a sample of the weights,
attention method and its settings, page size and prefill chunk grid, KV dtype); loading a file made under
another fingerprint is refused with the fields that differ, since its pages would silently give other tokens.
Each tensor's checksum is written with it, and a file is read back through engine/prefix_file_check.py: a damaged,
truncated or foreign file is refused with a message naming it before any page is written.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, is_dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from infinitehip.engine.prefix_file_check import CHECKSUMS_KEY, PrefixCacheFileError, read_checked, tensor_checksums
from infinitehip.engine.prefix_pages import BoundaryState, page_slots

logger = logging.getLogger(__name__)

FORMAT = "infinitehip-prefix-cache-v3"  # v2: boundary state per page; v3: a checksum per tensor


def fingerprint(engine) -> dict[str, str]:
    """What a page's k/v depend on, as strings (safetensors metadata)."""
    method_config = getattr(engine.method, "config", None)
    weights = hashlib.sha256()
    for name, p in sorted(engine.loaded.model.state_dict().items())[:4]:  # a sample: equal configs, other weights
        weights.update(name.encode() + p.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    grid = engine.prefix.grid if engine.prefix is not None else engine.config.page_size
    return {
        "format": FORMAT,
        "model_config": json.dumps(asdict(engine.model_config), sort_keys=True, default=str),
        "weights_sample_sha256": weights.hexdigest(),
        "method": engine.method.name,
        "method_config": json.dumps(asdict(method_config) if is_dataclass(method_config) else None, sort_keys=True,
                                    default=str),
        "page_size": str(engine.config.page_size),
        "reuse_grid": str(grid),
        "kv_dtype": str(_kv_dtype(engine.cache)),
    }


def _kv_dtype(cache) -> torch.dtype:
    return cache.kv.store.dtype if getattr(cache, "is_offloaded", False) else cache.k.dtype


def _read_pages(cache, pages: list[int], page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k/v [P, layers, page_size, kv_heads, head_dim] of whole pages, on the host."""
    if not getattr(cache, "is_offloaded", False):
        index = torch.tensor(pages, dtype=torch.long, device=cache.device)
        return (cache.k.index_select(1, index).transpose(0, 1).cpu().contiguous(),
                cache.v.index_select(1, index).transpose(0, 1).cpu().contiguous())
    slots = (torch.tensor(pages)[:, None] * page_size + torch.arange(page_size)).flatten()
    ks, vs = zip(*(cache.kv.store.read(layer, slots) for layer in range(cache.num_layers)))
    shape = (len(pages), page_size, *ks[0].shape[1:])
    return (torch.stack([k.view(shape) for k in ks], 1).contiguous(), torch.stack([v.view(shape) for v in vs], 1).contiguous())


def _write_pages(cache, pages: list[int], page_size: int, k: torch.Tensor, v: torch.Tensor) -> None:
    slots = page_slots(pages, page_size, cache.device)
    for layer in range(cache.num_layers):
        kl = k[:, layer].reshape(-1, *k.shape[-2:]).to(cache.device)
        vl = v[:, layer].reshape(-1, *v.shape[-2:]).to(cache.device)
        cache.write(layer, slots, kl, vl)


@torch.inference_mode()
def save_prefix_cache(engine, path: str | Path) -> int:
    """Write every cached page (in use or evictable) to `path`; returns the pages written."""
    if engine.prefix is None:
        raise ValueError("prefix caching is off for this engine: nothing to save")
    allocator = engine.scheduler.allocator
    entries = allocator.cached_pages()
    pages = [p for _, p in entries]
    tensors: dict[str, torch.Tensor] = {}
    if pages:
        tensors["k"], tensors["v"] = _read_pages(engine.cache, pages, allocator.page_size)
    tensors["hashes"] = torch.tensor([list(h) for h, _ in entries], dtype=torch.uint8).reshape(len(entries), 32)
    tensors["owners"] = torch.tensor([allocator.owner(p) for p in pages], dtype=torch.int64)
    if pages:  # the method's per-slot state of every cached key (named tensors of N rows: InfiniteHiP's saliency)
        slots = page_slots(pages, allocator.page_size, engine.cache.device)
        per_slot = engine.method.prefix_snapshot(engine.cache, slots)
        tensors.update({f"slots.{name}": t for name, t in (per_slot or {}).items()})
    for i, page in enumerate(pages):  # boundary state: the method's named snapshot tensors, the sliding rings
        state: BoundaryState | None = allocator.payload(page)
        if state is None:
            continue
        tensors[f"boundary.{i}"] = torch.ones(1, dtype=torch.uint8)  # a boundary with state, even an empty one
        tensors.update({f"snapshot.{i}.{name}": t.contiguous() for name, t in (state.method or {}).items()})
        if state.rings is not None:
            tensors[f"rings.{i}.k"], tensors[f"rings.{i}.v"] = (t.contiguous() for t in state.rings)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={**fingerprint(engine), CHECKSUMS_KEY: tensor_checksums(tensors)})
    logger.info("prefix cache: saved %d pages (%d tokens) to %s", len(pages), len(pages) * allocator.page_size, path)
    return len(pages)


@torch.inference_mode()
def load_prefix_cache(engine, path: str | Path) -> int:
    """Load a saved prefix cache into the engine's free pages (before requests run); returns the pages loaded.
    PrefixCacheFileError (a ValueError naming the file) when the file is unreadable, damaged, or was made for
    another model, method or KV layout; the engine is then left as it was."""
    if engine.prefix is None:
        raise ValueError("prefix caching is off for this engine: cannot load a prefix cache")
    tensors = read_checked(path, fingerprint(engine))
    _check_shapes(engine, path, tensors)
    allocator = engine.scheduler.allocator
    hashes, owners = tensors["hashes"], tensors["owners"]
    n = min(hashes.shape[0], allocator.num_unused)  # never-used pages only: loading must not evict
    if n < hashes.shape[0]:
        logger.warning("prefix cache: %d of %d saved pages fit the free KV pages", n, hashes.shape[0])
    if n == 0:
        return 0
    pages = allocator.allocate(n)
    _write_pages(engine.cache, pages, allocator.page_size, tensors["k"][:n], tensors["v"][:n])
    rows = n * allocator.page_size
    per_slot = {key[len("slots."):]: t[:rows] for key, t in tensors.items() if key.startswith("slots.")}
    if per_slot:
        engine.method.restore_prefix(engine.cache, page_slots(pages, allocator.page_size, engine.cache.device), per_slot)
    for i, page in enumerate(pages):
        # Owners of another process: negative, never a live sequence's id.
        owner = int(owners[i])
        allocator.register(page, bytes(hashes[i].tolist()), -1 - owner if owner >= 0 else owner)
        if f"boundary.{i}" in tensors:
            named = f"snapshot.{i}."
            snap = {key[len(named):]: t for key, t in tensors.items() if key.startswith(named)}
            rings = (tensors[f"rings.{i}.k"], tensors[f"rings.{i}.v"]) if f"rings.{i}.k" in tensors else None
            allocator.attach(page, BoundaryState(snap or None, rings))
    allocator.release(pages)  # cached, unreferenced: evictable like any finished prompt's pages
    logger.info("prefix cache: loaded %d pages (%d tokens) from %s", n, n * allocator.page_size, path)
    return n


def _check_shapes(engine, path, tensors: dict[str, torch.Tensor]) -> None:
    """The page tensors agree with each other and with this engine's KV pages (checksums prove the bytes only)."""
    hashes, owners = tensors.get("hashes"), tensors.get("owners")
    n = hashes.shape[0] if hashes is not None and hashes.dim() == 2 else -1
    mc = engine.model_config
    page = (engine.cache.num_layers, engine.config.page_size, mc.num_kv_heads, mc.head_dim)
    ok = (n >= 0 and hashes.dtype == torch.uint8 and hashes.shape[1] == 32 and owners is not None
          and tuple(owners.shape) == (n,)
          and all(name in tensors and tuple(tensors[name].shape) == (n, *page) for name in ("k", "v") if n > 0))
    if not ok:
        raise PrefixCacheFileError(f"prefix cache file {path}: its page tensors (hashes, owners, k, v) do not have "
                                   f"the shapes of this engine's KV pages {list(page)}")

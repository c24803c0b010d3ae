"""Automatic prefix caching: the page allocator keeps the pages of finished prompts, keyed by content.

A full page of prompt tokens is named by a chained hash: sha256(previous page's hash + the page's token
ids), so equal hashes mean equal tokens at equal positions from the first token on (vLLM's block-hash
scheme). The digest is stable across processes, which the disk round trip relies on.

Every page has a reference count (sequences holding it in their page table). A hashed page whose count
drops to zero is not freed: it goes to an LRU list of evictable pages, and a later request with the same
prefix takes it back. Allocation prefers never-used pages and evicts the least recently released cached
page only when none is left, so `num_free` counts both. A sequence releases its pages last-first, so under
pressure the tail of a prefix goes before its head (a tail without its head is never reused).

Plain Python, no tensors: the scheduler uses it. Methods may attach an opaque payload to a page (a state
snapshot at a prefix boundary, `PrefixCaching.prefix_snapshot`, attention/capabilities.py); it is dropped with the page's hash.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable

from infinitehip.kv.page_allocator import OutOfPagesError, PageAllocator

ROOT_HASH = b"infinitehip-prefix-v1"


def page_hashes(token_ids: list[int], page_size: int, parent: bytes = ROOT_HASH, start: int = 0) -> list[bytes]:
    """Chained digests of the full pages of token_ids from page `start` on (parent: the hash of page start - 1)."""
    out = []
    for p in range(start, len(token_ids) // page_size):
        parent = hashlib.sha256(parent + array("q", token_ids[p * page_size : (p + 1) * page_size]).tobytes()).digest()
        out.append(parent)
    return out


@dataclass
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up (at admission)
    hits: int = 0  # of those, tokens served from cached pages
    evictions: int = 0  # cached pages evicted for room

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class PrefixCachingAllocator(PageAllocator):
    """PageAllocator with reference counts, content hashes and LRU eviction of unreferenced hashed pages."""

    def __init__(self, num_pages: int, page_size: int):
        super().__init__(num_pages, page_size)
        self._refs = [0] * num_pages
        self._hash_of: dict[int, bytes] = {}
        self._page_of: dict[bytes, int] = {}
        self._payload: dict[int, Any] = {}
        self._owner: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced hashed pages, oldest first
        self.stats = PrefixCacheStats()

    # ---- counts -----------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    def can_allocate(self, num_pages: int) -> bool:
        return num_pages <= self.num_free

    @property
    def num_in_use(self) -> int:
        return self.num_pages - self.num_free

    @property
    def num_unused(self) -> int:
        """Pages holding nothing (taking them evicts no cached prefix)."""
        return len(self._free)

    @property
    def num_cached_pages(self) -> int:
        """Pages holding a hashed prefix (in use or evictable)."""
        return len(self._hash_of)

    # ---- allocation -------------------------------------------------------------------------------------
    def allocate(self, num_pages: int) -> list[int]:
        if num_pages > self.num_free:
            raise OutOfPagesError(f"asked for {num_pages} KV pages, {self.num_free} free of {self.num_pages}")
        pages = []
        for _ in range(num_pages):
            if self._free:
                page = self._free.pop()
            else:
                page, _ = self._evictable.popitem(last=False)
                self._forget(page)
                self.stats.evictions += 1
            self._refs[page] = 1
            pages.append(page)
        self.peak_in_use = max(self.peak_in_use, self.num_in_use)
        return pages

    def free(self, page_table: list[int]) -> None:
        self.release(reversed(page_table))
        page_table.clear()

    def release(self, pages: Iterable[int]) -> None:
        """Drop one reference of each page; unreferenced hashed pages stay cached (evictable), others are freed."""
        for page in pages:
            self._refs[page] -= 1
            if self._refs[page] > 0:
                continue
            if page in self._hash_of:
                self._evictable[page] = None
            else:
                self._free.append(page)

    def _forget(self, page: int) -> None:
        self._page_of.pop(self._hash_of.pop(page), None)
        self._payload.pop(page, None)
        self._owner.pop(page, None)

    # ---- prefix lookup ----------------------------------------------------------------------------------
    def match(self, hashes: list[bytes]) -> list[int]:
        """Pages of the longest cached run of hashes from the first (not referenced by this call)."""
        pages = []
        for h in hashes:
            page = self._page_of.get(h)
            if page is None:
                break
            pages.append(page)
        return pages

    def take(self, pages: list[int]) -> None:
        """Reference cached pages (a hit): an evictable one leaves the LRU list."""
        for page in pages:
            if self._refs[page] == 0:
                del self._evictable[page]
            self._refs[page] += 1
        self.peak_in_use = max(self.peak_in_use, self.num_in_use)

    def register(self, page: int, digest: bytes, owner: int = -1) -> bool:
        """Name a filled page by its content hash; owner: the sequence that computed it. False when another page
        already holds this content (two requests computed the same prefix at once): the page stays unnamed."""
        if self._hash_of.get(page) == digest:
            return True
        if page in self._hash_of or digest in self._page_of:
            return False
        self._hash_of[page] = digest
        self._page_of[digest] = page
        self._owner[page] = owner
        return True

    def owner(self, page: int) -> int | None:
        return self._owner.get(page)

    def hash_of(self, page: int) -> bytes | None:
        return self._hash_of.get(page)

    def attach(self, page: int, payload: Any) -> None:
        """Keep an opaque payload with a hashed page (dropped when the page is evicted)."""
        if page in self._hash_of:
            self._payload[page] = payload

    def payload(self, page: int) -> Any:
        return self._payload.get(page)

    def cached_pages(self) -> list[tuple[bytes, int]]:
        """(hash, page) of every cached page (for saving to disk)."""
        return [(h, p) for p, h in self._hash_of.items()]

    def refs(self, page: int) -> int:
        return self._refs[page]

    def reset_prefix_cache(self) -> int:
        """Evict every unreferenced cached page; return how many."""
        n = len(self._evictable)
        while self._evictable:
            page, _ = self._evictable.popitem(last=False)
            self._forget(page)
            self._free.append(page)
        return n

"""Where a cached prefix may be reused: each method's conditions, turned into a boundary (plain Python).

A reused prefix must give exactly what recomputing it would. What that takes depends on the method
(`PrefixCaching.prefix_reuse`, attention/capabilities.py):
- dense attention is causal token by token: any page boundary works;
- methods whose prefill selection depends on the chunk (InfiniteHiP's context length and saliency of
  later queries of the same chunk, TokenSelect's query blocks and mean queries) give a token's K/V only
  for a given chunking, so a prefix is reused only up to a multiple of prefill_chunk_size, computed by
  chunks on that grid (`chunk_aligned`);
- the last prompt tokens may carry state the method needs at the end of the prompt (the question's
  queries): `min_recompute_tokens` of them are always recomputed (at least one: the first output's logits), and
  so are the method's `prompt_end_tokens` (the scheduler computes them in one last chunk, so a reuse stops on the
  grid before them);
- per-slot state that later queries still change (InfiniteHiP's landmark saliency of the last window of
  keys) cannot be shared: the pages holding the last `private_tail_tokens` keys before the boundary are
  copied into pages of the new sequence, with the method's snapshot of that state taken at the boundary;
- a model's sliding-window layers keep the last window of keys per sequence outside the paged cache
  (attention/common/sliding_window.py): a boundary is reusable only where a copy of those rings was taken: a prefill
  chunk's end, or the last full page inside it (`rings`). Their keys depend on the prefix's tokens alone, so any
  owner's copy serves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixReuse:
    chunk_aligned: bool = False
    min_recompute_tokens: int = 1
    private_tail_tokens: int = 0

    @property
    def needs_snapshot(self) -> bool:
        return self.private_tail_tokens > 0


@dataclass(frozen=True)
class PrefixHit:
    """A reused prefix of `tokens` tokens: `shared` pages referenced as they are, then `copies` (src, dst) pages
    whose K/V are copied before the next forward, and the boundary state kept with page `snapshot_page` (the
    method's snapshot, the sliding rings) restored then."""

    tokens: int
    shared: list[int]
    copies: list[tuple[int, int]]
    snapshot_page: int | None = None


def last_token_only(prefill_tokens: int) -> int:
    """`AttentionMethod.prompt_end_tokens` of a method that decides nothing at a prompt's end: only the last token
    (whose logits give the first output) must be computed by the prefill itself."""
    return 1


class PrefixPolicy:
    """A method's PrefixReuse resolved against the engine's page size and prefill chunk size."""

    def __init__(self, reuse: PrefixReuse, page_size: int, prefill_chunk_size: int, rings: bool = False,
                 prompt_end_tokens: Callable[[int], int] = last_token_only):
        self.reuse, self.page_size, self.rings = reuse, page_size, rings
        # The scheduler keeps a prompt's last prompt_end_tokens(prompt) in its last chunk, moving the chunk boundary
        # before them off the grid: a reuse ends on the grid before them, so the rest is chunked as without caching.
        self.prompt_end_tokens = prompt_end_tokens
        self.grid = math.lcm(page_size, prefill_chunk_size) if reuse.chunk_aligned else page_size

    @property
    def needs_boundary_state(self) -> bool:
        """A boundary is reusable only with state kept at it (the method's snapshot, the sliding layers' rings)."""
        return self.reuse.needs_snapshot or self.rings

    def boundary(self, prompt_tokens: int, matched_pages: int) -> int:
        """Longest reusable prefix (tokens, a multiple of the grid) of a prompt whose first matched_pages are cached."""
        recompute = max(1, self.reuse.min_recompute_tokens, self.prompt_end_tokens(prompt_tokens))
        most = min(matched_pages * self.page_size, prompt_tokens - recompute)
        return max(0, most) // self.grid * self.grid

    def tail_pages(self, boundary: int) -> range:
        """Page indices copied rather than shared for a prefix ending at `boundary` (empty without private tail)."""
        first = max(0, boundary - self.reuse.private_tail_tokens) // self.page_size
        return range(first if self.reuse.private_tail_tokens else boundary // self.page_size, boundary // self.page_size)

    def registrable(self, start: int, end: int, prompt_tokens: int) -> int | None:
        """After a prefill chunk [start, end): up to which token the sequence's prompt pages are cached (None: none
        new). Chunk-aligned methods cache only chunks on the grid, ending on it."""
        if self.reuse.chunk_aligned:
            if start % self.grid or end % self.grid or end > prompt_tokens:
                return None
            return end
        return min(end, prompt_tokens) // self.page_size * self.page_size

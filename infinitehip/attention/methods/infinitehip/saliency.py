"""Key saliency for `representative = "landmark"`: a chunk's representative is its most salient key.

SelectRep's bisection (Alg. 3) compares the first token of each half, so a needle of a few tokens inside a
256-token chunk of look-alike text is found only when it happens to sit at a branch start. The
alternative, from the authors' later code: give every key a query-independent saliency = the mean
pre-softmax logit it receives from the next `window` queries (local, in-distribution relative positions),
and take the argmax per head as the chunk's representative. The chunk is then scored as in SelectRep
(max over heads and the block's queries of q . k_rep) with the stage's RoPE style.

Saliency is accumulated as the sequence grows (prefill chunks and decode steps): per layer, a sum
[slots, H] and a count [slots] indexed by flat cache slot, so keys near a chunk's end also receive the
next chunk's queries.
"""

from __future__ import annotations

import torch

from infinitehip.host_values import host_to_device
from infinitehip.attention.methods.infinitehip.decode_saliency.op import add_decode_logits, add_decode_logits_batched
from infinitehip.attention.methods.infinitehip.representatives.op import salient_tokens
from infinitehip.attention.methods.infinitehip.window_saliency.op import window_counts, window_logit_sums
from infinitehip.kv.paged_cache import PagedKVCache, token_slots
from infinitehip.model.rope import RotaryEmbedding, apply_rotary, apply_rotary_fused
from infinitehip.profiling import phase


class KeySaliency:
    """Per-layer saliency buffers over the whole paged cache (slots are unique per sequence). Keys are read with
    `cache.read_k` (an offloaded cache: through its attention bank) unless the caller passes a reader."""

    def __init__(self, window: int):
        self.window = window
        # Row `slots` (one past the cache) is scratch: masked-out updates land there instead of changing shape.
        self._sum: dict[int, torch.Tensor] = {}  # layer -> [slots + 1, H] fp32
        self._count: dict[int, torch.Tensor] = {}  # layer -> [slots + 1] fp32

    def _buffers(self, layer: int, cache: PagedKVCache, num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = cache.num_slots + 1
        if layer not in self._sum or self._sum[layer].shape[0] != rows:
            self._sum[layer] = torch.zeros(rows, num_heads, dtype=torch.float32, device=cache.device)
            self._count[layer] = torch.zeros(rows, dtype=torch.float32, device=cache.device)
        return self._sum[layer], self._count[layer]

    @phase("landmark saliency")
    def update(self, layer: int, q: torch.Tensor, start_pos: int, page_table: torch.Tensor, cache: PagedKVCache,
               rope: RotaryEmbedding, impl: str = "reference", keys=None) -> None:
        """Add the logits of queries q [n, H, d] (pre-RoPE, positions start_pos..) to the keys in their window.

        A key at t receives query s when 0 <= s - t < window. Keys of the new tokens are reset first, so a
        slot reused by another sequence starts from zero. The sums: window_saliency/ (impl "reference": every
        (query, key) pair, the oracle; "cpu" and "triton": each key's window of queries summed first, linear in
        n: the pairwise form's [n, window] logits cost more than the layer's sparse attention on a GPU).
        keys(lo, end) -> the keys of positions [lo, end) when the caller holds them (an offloaded prefill's staged
        layer); default: read from the cache."""
        n, H, _ = q.shape
        total, count = self._buffers(layer, cache, H)
        new_slots = token_slots(page_table, torch.arange(start_pos, start_pos + n, device=q.device), cache.page_size)
        total.index_fill_(0, new_slots, 0.0)  # not `total[new_slots] = 0`: its scalar is a host-to-device copy
        count.index_fill_(0, new_slots, 0.0)
        lo = max(0, start_pos - self.window + 1)
        key_pos = torch.arange(lo, start_pos + n, device=q.device)
        key_slots = token_slots(page_table, key_pos, cache.page_size)
        rope.ensure(start_pos + n)
        rotate = apply_rotary_fused if impl == "cpu" else apply_rotary
        raw = cache.read_k(layer, key_slots) if keys is None else keys(lo, start_pos + n)
        k = rotate(raw.float(), rope.cos[lo : start_pos + n, None], rope.sin[lo : start_pos + n, None])
        q_rot = rotate(q.float(), rope.cos[start_pos : start_pos + n, None], rope.sin[start_pos : start_pos + n, None])
        first_key = lo - start_pos  # key i sits at chunk position first_key + i
        total.index_add_(0, key_slots, window_logit_sums(q_rot, k, first_key, self.window, impl=impl))
        count.index_add_(0, key_slots, window_counts(n, key_slots.numel(), first_key, self.window, q.device))

    def update_decode(self, layer: int, q: torch.Tensor, positions: torch.Tensor, page_table: torch.Tensor,
                      cache: PagedKVCache, rope: RotaryEmbedding, read_keys=None, impl: str = "reference") -> None:
        """Decode queries of one sequence, q [P, H, d] pre-RoPE at distinct positions [P] within the last P tokens
        (< 0: no query), add their logits to the `window` keys up to and including their own (whose sums are reset
        first). Sync-free and static: the P windows overlap, so the union of W + P - 1 keys is gathered once and
        each query's logits over it are masked to its own window (decode_saliency/: impl "triton" fuses the
        rotations, logits and writes into one kernel). Rope must cover the positions.
        read_keys(slots [Wp], key_pos [Wp]) -> keys [Wp, Hkv, d] (an offloaded cache's reader that keeps the bank
        untouched, `decode_rows.py`); default `cache.read_k`."""
        P, H, d = q.shape
        total, count = self._buffers(layer, cache, H)
        W = self.window
        key_pos = positions.max() - (W + P - 2) + torch.arange(W + P - 1, device=q.device)  # [Wp] the windows' union
        at = key_pos.clamp(min=0)
        slots = token_slots(page_table, at, cache.page_size)  # [Wp]
        raw = cache.read_k(layer, slots) if read_keys is None else read_keys(slots, at)
        add_decode_logits(q, positions, key_pos, slots, raw, rope.cos, rope.sin, total, count, W, impl=impl)

    def update_decode_batched(self, layer: int, q: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None,
                              page_tables: torch.Tensor, cache: PagedKVCache, rope: RotaryEmbedding,
                              impl: str = "reference") -> None:
        """`update_decode` of G sequences in one call (a resident cache): sequence g's queue is row rows[g] (None: g)
        of q [R, P, H, d] / positions [R, P] (decode_pool.py), its page table page_tables[g] [Pmax]."""
        P, H = q.shape[1], q.shape[2]
        total, count = self._buffers(layer, cache, H)
        W = self.window
        mine = positions if rows is None else positions.index_select(0, rows)  # [G, P]
        key_pos = mine.amax(1, keepdim=True) - (W + P - 2) + torch.arange(W + P - 1, device=q.device)  # [G, Wp]
        at = key_pos.clamp(min=0)
        slots = page_tables.long().gather(1, at // cache.page_size) * cache.page_size + at % cache.page_size
        add_decode_logits_batched(q, positions, rows, key_pos, slots, cache.read_k(layer, slots), rope.cos, rope.sin,
                                  total, count, W, impl=impl)

    def snapshot(self, slots: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's sums [N, H] and counts [N] of slots [N], on the host (prefix caching: the keys just before a
        prefix boundary, whose sums the next window of queries still changes)."""
        return {layer: (self._sum[layer][slots].cpu(), self._count[layer][slots].cpu()) for layer in self._sum}

    def restore(self, cache: PagedKVCache, slots: torch.Tensor, snapshot: dict) -> None:
        """Write a snapshot into slots [N] (a sequence's private copies of those keys)."""
        for layer, (total, count) in snapshot.items():
            t, c = self._buffers(layer, cache, total.shape[1])
            t[slots] = host_to_device(total, t.device)  # not .to(device): a pageable copy blocks the host
            c[slots] = host_to_device(count, c.device)

    def representatives(self, layer: int, starts: torch.Tensor, lens: torch.Tensor, page_table: torch.Tensor,
                        page_size: int, chunk_size: int, impl: str = "reference", distinct: bool = False) -> torch.Tensor:
        """Most salient token per head of each chunk [start, start + len): starts/lens [M, N] -> [M, N, H] int64.

        Query blocks share most of their chunks (stage 1: all of them), so each distinct (start, len) is done
        once (`representatives.salient_tokens`, impl "triton" or "reference") and mapped back to the blocks.
        distinct (decode: one block per sequence, each its own tokens) or a single block: every chunk as it is, no
        sort, no host sync (CUDA-graph capturable with impl "triton")."""
        total, count = self._sum[layer], self._count[layer]
        H = total.shape[1]
        if starts.shape[0] == 1 or distinct:
            reps = salient_tokens(total, count, page_table, page_size, starts.flatten(), lens.flatten(), chunk_size,
                                  impl=impl)
            return reps.view(*starts.shape, H)
        key = starts * (chunk_size + 1) + lens
        uniq, inverse = torch.unique(key.flatten(), return_inverse=True)
        u_starts, u_lens = uniq // (chunk_size + 1), uniq % (chunk_size + 1)
        reps = salient_tokens(total, count, page_table, page_size, u_starts, u_lens, chunk_size, impl=impl)
        return reps[inverse].view(*starts.shape, H)

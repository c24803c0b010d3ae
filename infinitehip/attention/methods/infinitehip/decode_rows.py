"""Attention-bank rows of a decode key list kept between steps (offloaded KV, one sequence per decode step).

A decode step that refreshes no stage attends the previous step's key list plus its own new token: the stage
caches and limits are unchanged, so sink, selected chunks (below the window start) and the window start are the
same, and the window [window_start, e] grows by e, the largest listed token, appended at index count - 1. So the
bank rows the previous step resolved are still the rows of list entries 0 .. count - 2, if nothing evicted them:
- every `resolve_attention` call (of any layer, any reader) resets the attention bank's holder, and only a full
  resolve of this sequence sets it back to the sequence's token; invalidate never moves rows (`OffloadedKV`);
- the new token's row is copied from the store into a spare row of the bank (outside the LRU, so no resolve moves
  it and it evicts nothing), spare row e % P. Steps that refresh a stage resolve the whole list again; one
  happens at least every P = min(refresh_intervals) steps, so the <= P - 1 tokens appended in between have
  distinct spare rows.
The keys, their order and RoPE positions are the list's as before and the rows hold the same values (a spare row
is converted from the store exactly as a resolve's miss), so the attention output is unchanged. A step reuses the
rows (`reusable`) only when the sequence decodes alone, no stage refreshes, and it holds the bank; the decision is
made once per step from host state (graph key and every layer agree), see `InfiniteHiPAttention.graph_key`.

A step that refreshes a stage first applies the landmark saliency of its pending queries, which reads the keys of
positions [e - (W + P - 2), e] (W = landmark_window). While the bank is held those are read from the kept rows
(`window_keys`), not resolved (a resolve would cost a call per layer and drop the holder): the last list ends
with its window [window_start, e - 1], window_start <= max(sink, e - stream) (the stage limits), so with
stream >= W + P - 2 every such key t >= sink is list entry count - 1 - (e - 1 - t) and every t < sink is entry t
(the sink); e itself is copied into spare row e % P (free: the kept rows use those of e - P + 1 .. e - 1).
Otherwise the keys come straight from the store (`store_key_reader`), which does not touch the bank either.
"""

from __future__ import annotations

import itertools

import torch

from infinitehip.attention.methods.infinitehip.offload_access import decode_attention_rows
from infinitehip.kv.paged_cache import is_offloaded

_TOKENS = itertools.count(1)


class DecodeRows:
    """Per sequence: each layer's bank rows of its last key list (rows [1, K] int32, updated in place: graphs hold
    them) and the list positions 0..K-1 the kernel reads through them (tokens [1, K] int32, constant)."""

    def __init__(self, num_layers: int, spare: int):
        self.token = next(_TOKENS)  # what the attention bank's holder is set to (an int: states are never compared)
        self.spare = spare  # P: spare rows of the bank this sequence appends to, ring by position % P
        self.rows: list[torch.Tensor | None] = [None] * num_layers
        self.tokens: list[torch.Tensor | None] = [None] * num_layers
        self.counts: list[torch.Tensor | None] = [None] * num_layers  # [1] int32 the last list's length, in place
        self.kv = None  # the OffloadedKV the rows are in (set by the first full resolve)
        self.step: tuple[int, bool] = (-1, False)  # (decode step, held at its start): one decision per step

    def kept(self, layer: int, step: int) -> bool:
        """Whether `layer`'s rows of the last list are still valid at decode step `step`."""
        return self.rows[layer] is not None and self.held(step)

    def held(self, step: int) -> bool:
        """Whether this sequence held the attention bank when decode step `step` began (decided at its first call)."""
        if self.step[0] != step:
            self.step = (step, self.kv is not None and self.kv.holds_attention(self.token))
        return self.step[1]

    def reusable(self, layer: int, step: int, refresh: bool) -> bool:
        """Whether `layer`'s decode step `step` (of this sequence alone) reuses the kept rows."""
        return not refresh and self.kept(layer, step)

    def kept_step(self, steps: list[int]) -> bool:
        """Whether every layer's next step (steps: per layer) has its kept rows (a graph key's part: with the refresh
        pattern it says whether the step appends to them or reads the saliency window from them)."""
        if steps.count(steps[0]) == len(steps):  # one step for every layer (graph steps): one decision
            return all(rows is not None for rows in self.rows) and self.held(steps[0])
        return all(self.kept(layer, steps[layer]) for layer in range(len(self.rows)))

    def resolve(self, cache, layer: int, page_tables: torch.Tensor, key_tokens: torch.Tensor, key_counts: torch.Tensor):
        """The full resolve (`decode_attention_rows`), its rows kept and the bank held -> the same 5-tuple."""
        k_flat, v_flat, tables, page_size, tokens = decode_attention_rows(cache, layer, page_tables, key_tokens,
                                                                          key_counts)
        if self.rows[layer] is None or self.rows[layer].shape != tables.shape:
            self.rows[layer], self.tokens[layer] = tables.clone(), tokens.clone()
            self.counts[layer] = key_counts.to(torch.int32).clone()
        else:
            self.rows[layer].copy_(tables)
            self.counts[layer].copy_(key_counts)
        self.kv = cache.kv
        cache.kv.hold_attention(self.token)
        return k_flat, v_flat, self.rows[layer], page_size, self.tokens[layer]

    def append(self, cache, layer: int, new_slots: torch.Tensor, positions: torch.Tensor, key_counts: torch.Tensor):
        """The new token (store slot new_slots [1] at position positions [1]) into spare row position % P and list
        entry key_counts - 1 of the kept rows -> (k_flat, v_flat, rows, 1, tokens) as `resolve`. Sync-free."""
        bank = cache.kv.attention_bank
        flat = cache.kv.copy_to_spare(layer, new_slots, positions % self.spare)
        rows = self.rows[layer]
        rows.scatter_(1, (key_counts.long() - 1)[:, None], flat.to(torch.int32)[:, None])
        self.counts[layer].copy_(key_counts)
        return bank.flat_k(layer), bank.flat_v(layer), rows, 1, self.tokens[layer]

    def window_keys(self, cache, layer: int, limits: torch.Tensor):
        """-> read(slots [Wp], key_pos [Wp]) -> keys [Wp, Hkv, d] of the saliency window (key_pos ascending, ending
        with this step's token e; clamped positions < 0 read any row) from the kept rows of the last list, whose
        window began at the minimum of the stage limits [S] (read before this step refreshes any). Sync-free."""
        bank, P = cache.kv.attention_bank, self.spare

        def read(slots: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
            e = key_pos[-1:]
            own = cache.kv.copy_to_spare(layer, slots[-1:], e % P)  # [1] flat row of e
            rows, count, window_start = self.rows[layer][0].long(), self.counts[layer].long(), limits.amin()
            entry = torch.where(key_pos >= window_start, count - 1 - (e - 1 - key_pos), key_pos)
            flat = rows[entry.clamp(0, rows.shape[0] - 1)]
            flat = torch.where(key_pos == e, own.long(), flat)
            return bank.flat_k(layer)[flat]

        return read

    def after_replay(self, pattern: tuple[bool, ...]) -> None:
        """A replayed step (refreshing `pattern`) ran without Python: its full resolve or its kept rows left the bank
        held by this sequence."""
        if self.kv is not None:
            self.kv.hold_attention(self.token)

    def release(self) -> None:
        if self.kv is not None and self.kv.holds_attention(self.token):
            self.kv.hold_attention(None)


def store_key_reader(cache, layer: int):
    """read(slots, key_pos) -> keys for the saliency window: an offloaded cache's straight from the store (no bank
    call: the kept rows stay valid), None for a resident cache (its own `read_k`)."""
    if not is_offloaded(cache):
        return None
    return lambda slots, key_pos: cache.read_k_store(layer, slots)


def window_reader(kept: DecodeRows | None, cache, layer: int, caches, config):
    """How a step's saliency update reads its window keys without an attention-bank resolve: from the kept rows
    (kept: held this step; caches: the layer's stage caches, before this step refreshes any) when the last list's
    window covers them (stream >= landmark_window + P - 2, see the module docstring), else from the store
    (offloaded), else None (a resident cache's read_k)."""
    P = min(config.refresh_intervals)
    if kept is not None and config.stream_tokens >= config.landmark_window + P - 2:
        return kept.window_keys(cache, layer, caches[-1].limits)
    return store_key_reader(cache, layer)


def decode_rows_for(cache, num_layers: int, refresh_intervals: tuple[int, ...]) -> DecodeRows | None:
    """A DecodeRows when the cache is offloaded with enough spare attention-bank rows, else None (full resolves)."""
    if not is_offloaded(cache):
        return None
    P = min(refresh_intervals)
    if cache.kv.attention_bank.spare_rows < P:
        return None
    return DecodeRows(num_layers, P)


def attention_access(kept: DecodeRows | None, reuse: bool, cache, layer: int, batch, key_tokens: torch.Tensor,
                     key_counts: torch.Tensor):
    """(k_flat, v_flat, tables, page_size, key_tokens) for `sparse_attention_decode`: the kept rows plus the new
    token's (reuse), a full resolve kept for the next steps (kept: one sequence decoding alone), else a plain
    full resolve (`decode_attention_rows`; a resident cache's own rows)."""
    if reuse:
        return kept.append(cache, layer, batch.new_slots[batch.decode_rows], batch.decode_positions, key_counts)
    if kept is not None:
        return kept.resolve(cache, layer, batch.decode_page_tables, key_tokens, key_counts)
    return decode_attention_rows(cache, layer, batch.decode_page_tables, key_tokens, key_counts)

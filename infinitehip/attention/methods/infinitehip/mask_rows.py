"""Mask-bank rows of the last stage's representatives kept between its refreshes (offloaded KV, one sequence).

A decode step that refreshes the last pruning stage and no other scores the same candidates, with the same
representatives, as the last stage's previous refresh; only the query is new:
- the candidates are the parent's kept chunks cut into chunk_size pieces and clipped to the new limit; the parent
  did not refresh since (a refresh of another stage resolves the layer's mask bank, which drops the holder), and
  its chunks end below its own limit <= the new one, so starts and lens are unchanged;
- a candidate key t < parent limit <= e_p + 1 - stream had every query of its landmark window [t, t + W) applied
  by the parent's refresh at e_p (pending queries are applied at every refresh; W <= stream), and a later saliency
  update reaches only keys > e_p + 1 - W: its sum and count, so the representatives [1, N, H], are unchanged.
The mask-bank resolve would request the same slots as the last one, whose indices stay valid until the next
resolve of that layer's mask bank (`OffloadedKV.resolve_mask` resets the layer's holder). Such a step skips the
resolve and reads the kept indices [1, N, H] (the token table is written again: other layers overwrote it), so
the scores read the same key rows and the chunks, key list and output are unchanged. Only for a stage scored in
one group (its N chunks' representatives fit the bank together: a later group's resolve may evict an earlier
group's rows). Decided once per step from host state, for every layer at once (a graph key holds it).
"""

from __future__ import annotations

import itertools

import torch

from infinitehip.attention.methods.infinitehip.offload_access import RepresentativeKeys
from infinitehip.kv.paged_cache import is_offloaded

_TOKENS = itertools.count(1)


class MaskRows:
    """Per sequence: each layer's mask-bank indices [1, N, H] int32 of its last stage's representatives at the last
    resolve (updated in place: graphs hold them)."""

    def __init__(self, num_layers: int):
        self.token = next(_TOKENS)  # what the layers' mask holders are set to
        self.rows: list[torch.Tensor | None] = [None] * num_layers
        self.kv = None  # the OffloadedKV the rows are in (set by the first kept resolve)
        self.step: tuple[int, bool] = (-1, False)  # (decode step, every layer held at its start)

    def held(self, step: int) -> bool:
        """Whether every layer's rows were kept and held when decode step `step` began (decided at its first call)."""
        if self.step[0] != step:
            kv = self.kv
            self.step = (step, kv is not None and all(
                rows is not None and kv.holds_mask(layer, self.token) for layer, rows in enumerate(self.rows)))
        return self.step[1]

    def reusable(self, pattern: tuple[bool, ...], step: int) -> bool:
        """Whether decode step `step` (this sequence alone, refreshing `pattern`) reuses the kept rows: the last stage
        refreshes and no other does, and every layer holds its rows."""
        return len(pattern) > 1 and pattern[-1] and not any(pattern[:-1]) and self.held(step)

    def reader(self, cache, layer: int, page_table: torch.Tensor, pattern: tuple[bool, ...], step: int):
        """The last stage's representative-key reader of this step: reusing the kept rows, or resolving and keeping."""
        return KeptRepresentativeKeys(cache, layer, page_table, self, self.reusable(pattern, step))

    def keep(self, layer: int, kv, index: torch.Tensor) -> None:
        if self.rows[layer] is None or self.rows[layer].shape != index.shape:
            self.rows[layer] = index.clone()
        else:
            self.rows[layer].copy_(index)
        self.kv = kv
        kv.hold_mask(layer, self.token)

    def after_replay(self, pattern: tuple[bool, ...]) -> None:
        """A replayed step ran without Python: a last-stage refresh left every layer with kept rows held, a refresh of
        other stages only dropped them (its resolves), no refresh changed nothing."""
        if self.kv is None or not any(pattern):
            return
        for layer, rows in enumerate(self.rows):
            self.kv.hold_mask(layer, self.token if pattern[-1] and rows is not None else None)

    def release(self) -> None:
        if self.kv is not None:
            for layer in range(len(self.rows)):
                if self.kv.holds_mask(layer, self.token):
                    self.kv.hold_mask(layer, None)


class KeptRepresentativeKeys(RepresentativeKeys):
    """`RepresentativeKeys` of the last stage scored in one group: its indices reused (reuse) or resolved and kept."""

    def __init__(self, cache, layer: int, page_table: torch.Tensor, kept: MaskRows, reuse: bool):
        super().__init__(cache, layer, page_table)
        self.kept, self.reuse = kept, reuse

    def score_in_fixed_groups(self, reps: torch.Tensor, lens: torch.Tensor, chunk_size: int, score) -> torch.Tensor:
        N, H = reps.shape[1:]
        if N > self.chunks_per_group(chunk_size, H):  # several groups: nothing kept (their resolves drop the holder)
            return RepresentativeKeys(self.cache, self.layer, self.page_table).score_in_fixed_groups(
                reps, lens, chunk_size, score)
        return score(self(reps, lens), slice(None), slice(None))

    def rows(self, reps: torch.Tensor, listed: torch.Tensor) -> torch.Tensor:
        """reps [1, N, H] of every candidate -> the kept indices (reuse) or resolved ones, then kept. Sync-free."""
        if self.reuse:
            return self.kept.rows[self.layer]
        index = super().rows(reps, listed)
        self.kept.keep(self.layer, self.cache.kv, index)
        return index


def mask_rows_for(cache, num_layers: int, num_stages: int) -> MaskRows | None:
    """A MaskRows when the cache is offloaded and the method has a last stage with a parent, else None."""
    return MaskRows(num_layers) if is_offloaded(cache) and num_stages > 1 else None


def stage_keys(kept: MaskRows | None, rep_keys, cache, layer: int, page_table: torch.Tensor, pattern: tuple[bool, ...],
               step: int) -> list:
    """Each stage's representative-key reader at decode step `step`: rep_keys (`scoring_access`), the last stage's
    one keeping its mask-bank rows when kept (a MaskRows: the sequence decodes alone, offloaded)."""
    if not kept or rep_keys is None:
        return [rep_keys] * len(pattern)
    return [rep_keys] * (len(pattern) - 1) + [kept.reader(cache, layer, page_table, pattern, step)]

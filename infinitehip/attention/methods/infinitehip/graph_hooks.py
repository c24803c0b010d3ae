"""InfiniteHiP's CUDA-graph decode hooks (attention/capabilities.GraphDecode): which graph a decode step replays,
and the host counters a replay advances by hand. A mixin of `InfiniteHiPAttention`: the hooks read its config, the
refresh pattern (which stages a step recomputes) and the sequence's state (state.py). A batch's graph is keyed by
the union of its sequences' patterns; each one's own pattern is a row of the graph's static flags."""

from __future__ import annotations

from typing import NamedTuple

from infinitehip.attention.base import SequenceSlice
from infinitehip.attention.capabilities import GraphBatching, GraphDecode
from infinitehip.attention.methods.infinitehip.decode import stage1_candidates
from infinitehip.attention.methods.infinitehip.decode_batch import batchable
from infinitehip.attention.methods.infinitehip.decode_rows import DecodeRows
from infinitehip.attention.methods.infinitehip.mask_rows import MaskRows
from infinitehip.attention.methods.infinitehip.state import InfiniteHiPState
from infinitehip.kv.paged_cache import is_offloaded

EXACT_STEP = ("exact",)  # graph key of a decode step attended exactly (dense_within_trained)


class PrunedStepKey(NamedTuple):
    """Graph key of a pruned decode step (a tuple: keys compare and hash as before)."""

    pattern: tuple[bool, ...]  # the stages this step refreshes
    group: int  # the context group (`group`): shapes of the candidates
    kept: bool  # alone and offloaded: the step appends to its kept attention-bank rows (decode_rows.py)
    masks: bool  # alone and offloaded: the last stage reuses its kept mask-bank rows (mask_rows.py)
    offloaded: bool  # the cache is offloaded: a batch refreshes each sequence by its own pattern


class InfiniteHiPGraphHooks(GraphDecode):
    """The GraphDecode hooks of InfiniteHiPAttention (which provides config, model_config, within_trained, _specs
    and group), and the refresh pattern the keys and the method's decode read."""

    def refresh_pattern(self, state: InfiniteHiPState, layer: int) -> tuple[bool, ...]:
        """Which stages this layer's next decode step recomputes (decided on the host from the step counter)."""
        step = state.decode_steps[layer]
        return tuple(state.stage_cache[layer] is None or step % r == 0 for r in self.config.refresh_intervals)

    def graph_capturable(self) -> bool:
        """The decode step launches the same kernels for any position (landmark + Triton: no host sync)."""
        return self.config.representative == "landmark" and self.config.impl in ("auto", "triton")

    def graph_key(self, seq: SequenceSlice) -> tuple | None:
        state: InfiniteHiPState = seq.state
        if self.within_trained(seq.context_len):  # dense's paged op: no host state, shapes by the capacity bucket
            return None if is_offloaded(seq.cache) else EXACT_STEP
        if not self.graph_capturable() or any(c is None for c in state.stage_cache):
            return None  # the first decode step allocates the stage caches: it runs eagerly
        steps = state.decode_steps  # the layers' step counters agree (one pattern for the step) unless a step stopped
        if steps.count(steps[0]) != len(steps):  # midway: a graph runs every layer's step at once
            return None
        pattern = self.refresh_pattern(state, 0)  # + whether the step has the kept attention-bank rows (decode_rows.py)
        kept = isinstance(state.decode_rows, DecodeRows) and state.decode_rows.kept_step(state.decode_steps)
        masks = isinstance(state.mask_rows, MaskRows) and state.mask_rows.reusable(pattern, state.decode_steps[0])
        return PrunedStepKey(pattern, self.group(seq.context_len), kept, masks, is_offloaded(seq.cache))

    def graph_batch_class(self, method_key: tuple) -> tuple:
        """Exact steps together; pruned steps of one context group together whatever stages each refreshes: a
        batch's graph runs every sequence's own refreshes (one replay reads the weights once)."""
        return method_key if method_key == EXACT_STEP else ("pruned", method_key.group)

    def graph_batch_key(self, method_keys: list) -> tuple:
        """Pruned steps whose refreshes batch (decode_batch.py): the union of their patterns (a stage any of them
        refreshes runs for all, each keeping its old cache unless its own flag says; nested intervals give few
        unions); else the tuple of their keys (each one's refreshes as its pattern says). Offloaded, a batch's
        refreshes run per sequence and it keeps no bank rows: their patterns and groups."""
        if method_keys[0] == EXACT_STEP:
            return tuple(method_keys)
        if method_keys[0].offloaded:
            return "offloaded", tuple((k.pattern, k.group) for k in method_keys)
        if not self.refreshes_batch():
            return tuple(method_keys)
        union = tuple(any(k.pattern[s] for k in method_keys) for s in range(self.config.num_stages))
        return "union", union, method_keys[0].group

    def graph_row_flags(self, method_key: tuple) -> tuple[bool, ...]:
        """A pruned step's refresh pattern (what `decode_batch.refresh_mask` reads), [S]."""
        return () if method_key == EXACT_STEP else tuple(method_key.pattern)

    def refreshes_batch(self) -> bool:
        """Whether a resident batch's refreshes run together at every layer (`decode_batch.batchable`), so its graph
        may be keyed by the union of its patterns."""
        if not hasattr(self, "_refreshes_batch"):
            self._refreshes_batch = all(batchable(self._specs(layer, decode=True))
                                        for layer in range(self.model_config.num_layers))
        return self._refreshes_batch

    def graph_batching(self, seqs: list[SequenceSlice], method_key: tuple) -> GraphBatching:
        """A resident cache: one graph. Offloaded, a step alone keeps attention- and mask-bank rows
        (decode_rows.py / mask_rows.py) that a batch does not read: each sequence's graph in turn, unless the
        offload config's `batch_decode_graph` trades them for reading the weights once (one graph, every list
        resolved)."""
        cache = seqs[0].cache
        if is_offloaded(cache) and not cache.kv.config.batch_decode_graph:
            return GraphBatching.EACH_GRAPH
        return GraphBatching.ONE_GRAPH

    def after_batch_replay(self, seqs: list[SequenceSlice], method_keys: list) -> None:
        """An offloaded batch's replay resolved every sequence's key list (attention bank) and, where any of them
        refreshed a stage, its representatives (mask bank) with no row kept: no one holds those banks any more
        (each sequence's `advance_host_counters` set its own holder, as a step alone would)."""
        if method_keys[0] != EXACT_STEP and method_keys[0].offloaded:
            seqs[0].cache.kv.release_holders(masks=any(any(k.pattern) for k in method_keys))

    def host_counters(self, state: InfiniteHiPState) -> tuple:
        return list(state.decode_steps), list(state.refreshes)

    def set_host_counters(self, state: InfiniteHiPState, counters: tuple) -> None:
        state.decode_steps[:], state.refreshes[:] = counters[0], counters[1]

    def advance_host_counters(self, state: InfiniteHiPState, key: tuple) -> None:
        if key == EXACT_STEP:  # an exact step advances no pruning counter (decode runs the paged op alone)
            return
        pattern = key.pattern
        for kept in filter(None, (state.decode_rows, state.mask_rows)):  # a replay ran no Python: their host state
            kept.after_replay(pattern)
        for layer in range(self.model_config.num_layers):
            state.decode_steps[layer] += 1
        for s, refreshed in enumerate(pattern):
            state.refreshes[s] += self.model_config.num_layers * int(refreshed)

    def decode_rope_positions(self, capacity: int) -> int:
        # positions every RoPE style may ask for: the capacity, its stage-1 candidates' ranks, the stream
        c = self.config
        return capacity + stage1_candidates(capacity, c.sink_tokens, c.chunk_sizes[0]) + c.stream_tokens + 2

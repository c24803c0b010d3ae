"""What an attention method may do beyond the core interface (`base.AttentionMethod`), one class per capability.

A method declares a capability by subclassing its class next to AttentionMethod
(`class InfiniteHiPAttention(AttentionMethod, GraphDecode, KVOffload, ...)`); the engine asks `supports(method,
GraphDecode)`. A hook marked abstract is one the method must write (it cannot be built otherwise); the others
have defaults that fit most methods of the capability. A method that declares none runs with what the engine
does without each of them, the functions at the end of this module:

  GraphDecode          decode steps replayed from CUDA graphs (engine/graph_decode.py). Without: every step eager.
  KVOffload            the KV in host memory behind GPU banks (kv/offload/). Without: refused (`accept_offload`).
  PrefixCaching        a cached prompt prefix reused exactly (kv/prefix_reuse.py). Without: caching off, with the
                       method's `prefix_reuse_note` logged (`prefix_reuse_of`).
  CacheCompaction      at most kv_token_limit cache slots per sequence, compacted after each step. Without: one slot
                       per token, nothing run after a step (`kv_token_limit`, `kv_scratch_tokens`).
  TokenizerBinding     the method encodes text of its own with the model's tokenizer. Without: never given it.
  TensorParallelHeads  scores combined over heads, so a tensor-parallel rank combines them over every rank's heads
                       too. Without: the method is never told of other ranks (its heads are independent).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum
from typing import Any, Hashable

import torch

from infinitehip.attention.base import AttentionMethod, ChunkHooks, SequenceSlice
from infinitehip.kv.paged_cache import PagedKVCache
from infinitehip.kv.prefix_reuse import PrefixReuse


def supports(method: AttentionMethod | type[AttentionMethod], capability: type) -> bool:
    """Whether a method (or method class) declares the capability."""
    return issubclass(method if isinstance(method, type) else type(method), capability)


class GraphBatching(Enum):
    """How several sequences' decode step with one graph key runs (`GraphDecode.graph_batching`)."""

    ONE_GRAPH = "one graph"  # one graph of them all (engine/graph_decode.py)
    EACH_GRAPH = "each graph"  # each sequence's own graph in turn (its step uses state of one sequence alone)


class GraphDecode(ABC):
    """Decode steps replayed from CUDA graphs: the method's decode reads positions and page tables from
    batch.decode_positions / decode_page_tables and its shapes depend only on batch.decode_capacity, so a graph
    captured once replays at any later position (engine/graph_decode.py)."""

    @abstractmethod
    def graph_key(self, seq: SequenceSlice) -> Hashable | None:
        """Host-side key of everything the next decode step of `seq` launches besides device tensors; None: this
        step cannot be replayed from a graph (it runs eagerly)."""

    def graph_batch_class(self, method_key: Hashable) -> Hashable:
        """Sequences whose method keys share a class decode in one graph keyed by `graph_batch_key` of their keys (its
        capture runs each one's own step); the default: only equal keys share one."""
        return method_key

    def graph_batch_key(self, method_keys: list) -> Hashable:
        """The method's part of the graph key of sequences of one batch class decoding together (their keys, in
        batch order); the default: the tuple of their keys. A coarser key is sound when the step reads what differs
        per sequence from `graph_row_flags`."""
        return tuple(method_keys)

    def graph_row_flags(self, method_key: Hashable) -> tuple[bool, ...]:
        """Per-sequence flags of a batch step, written before each replay into a static buffer the step reads
        (`ForwardBatch.decode_flags` [B, F] bool); the default: none."""
        return ()

    def graph_batching(self, seqs: list[SequenceSlice], method_key: Hashable) -> GraphBatching:
        """Several sequences (their slices) of one batch class (`graph_batch_class`) decode this step: one graph of
        them all (the default: the batch reads the weights once) or each one's own graph in turn."""
        return GraphBatching.ONE_GRAPH

    def decode_rope_positions(self, capacity: int) -> int:
        """RoPE table rows a decode step sized for `capacity` tokens may read. The engine reserves them before a
        prompt's last chunk (`GraphDecoder.reserve_rope`), so the tables are not regrown, and graphs captured over
        them (decode's, the short chunk's) not invalidated, by the decode that follows."""
        return capacity

    # A replay runs no Python: the host bookkeeping a decode step advances is saved around a capture and advanced
    # by hand after a replay. Defaults: the method keeps none.
    def host_counters(self, state: Any) -> Any:
        """A copy of the host-side bookkeeping that one decode step advances (restored after a capture)."""
        return None

    def set_host_counters(self, state: Any, counters: Any) -> None:
        """Put back what host_counters returned."""

    def advance_host_counters(self, state: Any, key: Hashable) -> None:
        """Advance the host bookkeeping as a decode step with this graph key does (after a replay)."""

    def after_batch_replay(self, seqs: list[SequenceSlice], method_keys: list) -> None:
        """After a graph of several sequences replayed (each one's counters advanced): the host bookkeeping such a
        step changes beyond each sequence's own (shared state its Python would have reset)."""


class KVOffload(ABC):
    """Runs with the KV in host memory behind GPU banks (`kv/offload/paged.py`: flat rows are not resident)."""

    @abstractmethod
    def check_offload(self, offload: Any, max_context_tokens: int, max_num_seqs: int) -> None:
        """Called with the OffloadConfig before anything is allocated: raise a ValueError naming the setting when
        the method cannot run with these banks."""

    def offload_spare_rows(self) -> int:
        """Rows per layer of the attention bank outside its LRU that the method copies store rows into itself
        (`OffloadedKV.copy_to_spare`)."""
        return 0

    def device_bytes_per_slot(self) -> int:
        """Device memory the method keeps per cache slot beside the KV itself (all layers), e.g. per-key statistics;
        the offload planner counts it with the banks' tables."""
        return 0


class PrefixCaching(ABC):
    """A cached prompt prefix reused exactly (kv/prefix_cache.py, kv/prefix_reuse.py, engine/prefix_pages.py)."""

    @abstractmethod
    def prefix_reuse(self) -> PrefixReuse:
        """Where and how a cached prefix may be reused so the result equals a run without caching."""

    # Needed with PrefixReuse.private_tail_tokens (the per-slot state of the keys before a boundary).
    def prefix_snapshot(self, cache: PagedKVCache, slots: torch.Tensor,
                        state: Any = None) -> dict[str, torch.Tensor] | None:
        """The per-slot state of slots [N] (the keys just before a prefix boundary, at the end of the chunk that
        reached it) and, given the sequence's state, what of it a hit resuming at the boundary needs; named host
        tensors, kept with the cached page (and saved to disk as they are)."""
        return None

    def restore_prefix(self, cache: PagedKVCache, slots: torch.Tensor, snapshot: dict[str, torch.Tensor] | None,
                       state: Any = None) -> None:
        """Write a prefix_snapshot into the slots [N] of a sequence's private copies of those keys (and its state)."""


class CacheCompaction(ABC):
    """The method keeps at most kv_token_limit cache slots per sequence (its `kv_sizing`), compacting the cache
    after the steps that fill it (after_forward)."""

    @abstractmethod
    def after_forward(self, seq: SequenceSlice, hooks: ChunkHooks) -> int | None:
        """After a sequence's tokens of this step (a prefill chunk or one decode token) went through every layer.
        Having compacted the sequence's cache (moved the k/v it keeps to the first slots), return how many slots
        it kept; None: the cache is as it was."""

    @property
    def kv_token_limit(self) -> int | None:
        """Most cache slots one sequence ever holds."""
        return self.own_kv_sizing().kv_token_limit

    @property
    def kv_scratch_tokens(self) -> int:
        """Cache slots past the kept ones that `ChunkHooks.extra_forward` may fill (they are never kept)."""
        return self.own_kv_sizing().kv_scratch_tokens


class TokenizerBinding(ABC):
    """The method encodes text of its own (InfiniPot's catalyst prompt) with the model's tokenizer."""

    @abstractmethod
    def bind_tokenizer(self, tokenizer: Any) -> None:
        """Called once, right after the method is created and before its sizes are read, with the model's tokenizer
        (None when it runs without one)."""


class TensorParallelHeads(ABC):
    """The method combines scores over heads (one selection shared by all heads): a tensor-parallel rank, holding
    some of the heads, combines them over every rank's heads too, so the selection is the one a single process
    makes."""

    # This rank's distributed/state.ParallelState (model_config then holds this rank's heads only); None
    # single-process.
    parallel: Any = None

    def bind_parallel(self, parallel: Any) -> None:
        """Called by the engine of a tensor-parallel rank before anything runs."""
        self.parallel = parallel

    def reduce_heads(self, scores: torch.Tensor, op: str) -> torch.Tensor:
        """Scores already combined over this rank's heads ("max" or "sum" of per-head scores), combined the same
        way over every rank's heads. Identity single-process."""
        return scores if self.parallel is None else self.parallel.all_reduce(scores, op)


# ---- what the engine does for a method, declared or not ------------------------------------------------------
def accept_offload(method: AttentionMethod, offload: Any, max_context_tokens: int, max_num_seqs: int) -> None:
    """Raise a ValueError unless the method runs with the KV offloaded under these settings."""
    if not supports(method, KVOffload):
        raise ValueError(f"method {method.name!r} does not support KV offloading (offload-enabled); "
                         "use method 'infinitehip' (or 'dense' for validation)")
    method.check_offload(offload, max_context_tokens, max_num_seqs)


def prefix_reuse_of(method: AttentionMethod) -> PrefixReuse | None:
    """How a cached prefix may be reused with the method; None: never (its prefix_reuse_note says why)."""
    return method.prefix_reuse() if supports(method, PrefixCaching) else None


def kv_token_limit(method: AttentionMethod) -> int | None:
    """Most cache slots one sequence holds; None: one per token."""
    return method.kv_token_limit if supports(method, CacheCompaction) else None


def kv_scratch_tokens(method: AttentionMethod) -> int:
    """Slots past the kept ones that a compacting method's extra forward may fill."""
    return method.kv_scratch_tokens if supports(method, CacheCompaction) else 0

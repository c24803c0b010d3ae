"""The core interface every attention method implements (dense, infinitehip, tokenselect, infinipot, ...).

One forward step of the engine covers several sequences; their new tokens are concatenated into a flat
batch [T, ...]. For each layer the decoder hands the method pre-RoPE q/k/v of all T tokens. The base
class stores the new k/v in the paged cache (keys without RoPE), then asks the method for the output of
each prefill chunk (all queries of the chunk at once: block-wise selection needs them) and of the
decode tokens of the step (as one group, so methods can batch them). Per-sequence, per-layer state
(mask caches, pots, statistics) lives in the object returned by `new_state`.

A method may also choose which prompt tokens the model reads (`select_prompt`, identity by default;
the `truncate` baseline drops the middle of over-long prompts, and the engine reports it).

Everything else a method may do (CUDA-graph decode, KV offloading, prefix caching, cache compaction with
`ChunkHooks`, a tokenizer of its own, tensor-parallel head reductions) is a capability it declares by
subclassing its class (attention/capabilities.py); a method declaring none gets the engine's safe defaults.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, ClassVar

import torch

from infinitehip.host_values import device_tensor
from infinitehip.config.model import ModelConfig
from infinitehip.kv.paged_cache import PagedKVCache
from infinitehip.model.rope import RotaryEmbedding


@dataclass(eq=False)
class SequenceSlice:
    """One sequence's new tokens in a forward step."""

    seq_id: int
    query_start: int  # offset of the first new token in the flat batch
    num_queries: int
    start_pos: int  # cache slots in use before this step = cache index (and position) of the first new token
    token_start: int  # tokens of the sequence before this step (== start_pos unless the method compacts its cache)
    page_table: torch.Tensor  # [num_pages] int32, on the cache's device
    cache: PagedKVCache
    state: Any  # what the method's new_state() returned for this sequence
    is_prefill: bool
    ends_prompt: bool = False  # a prefill chunk holding the prompt's last token (its last queries are the question)
    probe: Any = None  # a NeedleProbe (attention/common/needle_probe.py) when the request is being diagnosed
    scratch: bool = False  # ChunkHooks.extra_forward tokens: their k/v are never kept (later tokens overwrite them)
    text: Any = None  # the prompt's token ids (attention/common/repeated_text.py PromptText) in the chunk that ends the prompt
    # A prefix boundary inside this chunk (start_pos < it < context_len) at which sliding-window layers keep a copy
    # of their rings (attention/common/sliding_window.py): prefix caching reuses the chunk's full pages with them.
    ring_boundary: int | None = None

    @property
    def context_len(self) -> int:
        return self.start_pos + self.num_queries

    @property
    def query_rows(self) -> slice:
        return slice(self.query_start, self.query_start + self.num_queries)

    @cached_property
    def new_slots(self) -> torch.Tensor:
        """Flat cache slots [num_queries] of this step's tokens."""
        return self.cache.slots(self.page_table, self.start_pos, self.context_len)

    @cached_property
    def context_slots(self) -> torch.Tensor:
        """Flat cache slots [context_len] of every token of the sequence so far (computed once per step)."""
        return self.cache.slots(self.page_table, 0, self.context_len)


@dataclass(eq=False)
class ForwardBatch:
    slices: list[SequenceSlice]
    cache: PagedKVCache
    rope: RotaryEmbedding
    num_tokens: int
    prefill: list[SequenceSlice] = field(init=False)
    decode: list[SequenceSlice] = field(init=False)

    def __post_init__(self) -> None:
        self.prefill = [s for s in self.slices if s.is_prefill]
        self.decode = [s for s in self.slices if not s.is_prefill]
        # Decode tokens sit after the prefill chunks, one row each: a slice, never an index tensor
        # (building one per layer would copy host->device and stall the launch queue).
        first = self.decode[0].query_start if self.decode else 0
        if [s.query_start for s in self.decode] != list(range(first, first + len(self.decode))):
            raise ValueError("decode tokens must be contiguous and follow the prefill chunks in the batch")
        self.decode_rows = slice(first, first + len(self.decode))

    @cached_property
    def new_slots(self) -> torch.Tensor:
        return torch.cat([s.new_slots for s in self.slices])

    # Decode tokens as device tensors, for sync-free (CUDA-graph capturable) decode paths. A graph runner sets
    # these (and new_slots) to its static buffers; eager steps build them once per step here.
    @cached_property
    def decode_positions(self) -> torch.Tensor:
        """[B] int64 cache index (= position) of each decode token."""
        return device_tensor([s.start_pos for s in self.decode], torch.long, self.cache.device)

    @cached_property
    def decode_page_tables(self) -> torch.Tensor:
        """[B, P] int32 page tables of the decode sequences, zero-padded to the longest."""
        P = max(s.page_table.numel() for s in self.decode)
        return torch.stack([torch.nn.functional.pad(s.page_table, (0, P - s.page_table.numel())) for s in self.decode])

    @cached_property
    def decode_flags(self) -> torch.Tensor | None:
        """[B, F] bool per-sequence flags of a graph's batch (`GraphDecode.graph_row_flags`); None: an eager step
        (the method reads its host state)."""
        return None

    @cached_property
    def decode_capacity(self) -> int:
        """Tokens the decode sequences may hold this step (static shapes are sized for it)."""
        return max(s.context_len for s in self.decode)


@dataclass(frozen=True)
class ChunkHooks:
    """What a method may ask the model for after a step's tokens (`capabilities.CacheCompaction.after_forward`:
    InfiniPot's catalyst prompt and novelty)."""

    # Runs token ids [n] through the model after the sequence's cached tokens; returns logits [n, vocab].
    # Their k/v are not kept: the sequence's next tokens overwrite those slots.
    extra_forward: Callable[[torch.Tensor], torch.Tensor]
    # Negative log-likelihood [n - 1] (fp32) of the step's tokens 1..n-1, each given the tokens before it.
    token_nll: Callable[[], torch.Tensor]
    # The request's whole prompt (token ids, as the model reads it): the engine holds it from admission, so a
    # method may score its cache with the question at the prompt's end before that part is prefilled.
    prompt_ids: Sequence[int] = ()


@dataclass(frozen=True)
class KVSizing:
    """What the engine sizes from a method (`AttentionMethod.kv_sizing`), before the method is built."""

    default_max_context_tokens: int  # context limit when the user sets none
    # Most cache slots one sequence ever holds (methods that compact their cache); None: one per token.
    kv_token_limit: int | None = None
    # Cache slots past the kept ones that `ChunkHooks.extra_forward` may fill (never kept): the scheduler gives
    # every sequence page room for them on top of its cache (and kv_token_limit).
    kv_scratch_tokens: int = 0
    # The method's config as it runs, when the method fills in fields left to the model (InfiniPot's sizes);
    # None: the config as given.
    method_config: Any = None


class AttentionMethod(ABC):
    """The core: attention of prefill chunks and decode tokens, per-sequence state, prompt selection and sizes."""

    name: ClassVar[str]
    # Whether the method applies ModelConfig.attn_logit_softcapping (Gemma 2); the registry refuses others.
    supports_attn_softcapping: ClassVar[bool] = False
    # Why prefix caching is off for a method that does not declare capabilities.PrefixCaching (the engine logs it).
    prefix_reuse_note: ClassVar[str] = "the method does not declare how its state follows a reused prefix"

    def __init__(self, model_config: ModelConfig):
        self.model_config = model_config

    def new_state(self) -> Any:
        """Per-sequence state (created when a sequence is admitted)."""
        return None

    def release(self, state: Any) -> None:
        """Called when the sequence finishes or is cancelled."""

    def prompt_end_tokens(self, prompt_tokens: int) -> int:
        """Tokens the chunk that ends a prefill of `prompt_tokens` holds at least (when it has that many left to
        compute): the queries whose attention is decided only at the prompt's end (a question-time selection: the
        question's queries) must be in that chunk whatever the chunk boundaries, else the ones a boundary leaves in
        the chunk before never see it. The scheduler sizes the chunks before it to leave them (engine/scheduler.py),
        a prefix reuse stops before them (kv/prefix_reuse.py)."""
        return 1

    def select_prompt(self, prompt_ids: list[int], max_tokens: int | None) -> list[int]:
        """The prompt tokens the model reads, given the request's completion budget (None: unset). Identity:
        only a method whose documented purpose is dropping input (`truncate`) overrides it; the engine
        reports what was dropped."""
        return prompt_ids

    @classmethod
    def kv_sizing(cls, model_config: ModelConfig, config: Any = None, tokenizer: Any = None) -> KVSizing:
        """The method's sizes from the model, its config and the model's tokenizer alone, so the engine settles
        context and pages before building anything (engine/resolve.py). Default: the model's trained length, one
        slot per token, no scratch slots. A limit or scratch slots need capabilities.CacheCompaction."""
        return KVSizing(model_config.max_position_embeddings)

    def own_kv_sizing(self) -> KVSizing:
        """This built method's sizes (kv_sizing of its model view and config); a method whose sizes depend on what
        it encoded with the tokenizer (capabilities.TokenizerBinding) reads them from there."""
        return type(self).kv_sizing(self.model_config, getattr(self, "config", None))

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """q [T, H, d], k/v [T, Hkv, d] without RoPE -> attention output [T, H, d]."""
        batch.cache.write(layer, batch.new_slots, k, v)
        if not batch.prefill:  # a decode-only step: the method's output is the layer's (no copy into a buffer)
            out = self.decode(layer, q, batch.decode, batch)
            return out if out.dtype == q.dtype else out.to(q.dtype)
        out = torch.empty_like(q)
        for s in batch.prefill:
            out[s.query_rows] = self.prefill(layer, q[s.query_rows], s, batch)
        if batch.decode:
            rows = batch.decode_rows
            out[rows] = self.decode(layer, q[rows], batch.decode, batch)
        return out

    @abstractmethod
    def prefill(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> torch.Tensor:
        """Queries q [n, H, d] of one prefill chunk (its k/v already cached) -> [n, H, d]."""

    def decode(self, layer: int, q: torch.Tensor, seqs: list[SequenceSlice], batch: ForwardBatch) -> torch.Tensor:
        """One new query per sequence, q [B, H, d] -> [B, H, d]. Default: each as a one-token chunk."""
        return torch.cat([self.prefill(layer, q[i : i + 1], s, batch) for i, s in enumerate(seqs)])

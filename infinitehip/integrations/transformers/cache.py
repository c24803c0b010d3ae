"""`MethodCache`: a transformers `Cache` whose keys are stored before RoPE, in our paged KV, for our methods.

transformers calls `cache.update(k, v, layer_idx)` in every attention layer and hands what it returns to the
attention function. Under `patch` the model's RoPE is the identity, so those k/v are pre-RoPE; the layers here
return them unchanged and the attention function (`attention.py`) gives them to the method, which writes them
into `self.kv` (a `PagedKVCache`, keys without RoPE) and applies RoPE itself at the positions it chooses.

Every batch row is one sequence of the method (its own page table and method state). Pages are handed out as
rows grow; the storage doubles when full, keeping every page id (methods' states may hold slot ids).
"""

from __future__ import annotations

import itertools

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from infinitehip.attention.base import ChunkHooks, ForwardBatch, SequenceSlice
from infinitehip.attention.capabilities import CacheCompaction, kv_scratch_tokens, supports
from infinitehip.attention.common.hybrid import LayerRouter
from infinitehip.attention.common.repeated_text import PromptText
from infinitehip.attention.common.sliding_window import SlidingWindowAttention
from infinitehip.kv.paged_cache import PagedKVCache

_seq_ids = itertools.count(1 << 30)  # sequence ids for ring rows of sliding layers, apart from the engine's


class _PassThroughLayer(CacheLayerMixin):
    """One model layer's view: stores nothing itself (the method writes the paged KV), reports the lengths."""

    is_sliding = False

    def __init__(self, owner: "MethodCache"):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return key_states, value_states  # [B, Hkv, T, d] pre-RoPE: the attention function stores them

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.get_seq_length()

    def get_max_length(self) -> int:
        return -1


class MethodCache(Cache):
    def __init__(self, session, page_size: int = 64):
        self.session = session
        super().__init__(layers=[_PassThroughLayer(self) for _ in range(session.model_config.num_layers)])
        self.page_size = page_size
        self.kv: PagedKVCache | None = None  # allocated at the first forward (dtype/device of the model's k/v)
        self.rows: list[dict] = []  # per batch row: seq_id, pages, num_cached, num_computed, state
        self.prompt_len: int | None = None  # set by the patched generate: which prefill chunk ends the prompt
        self.batch: ForwardBatch | None = None  # the current forward's batch, built at its first layer
        # The token ids [B, T] of the forward being run (set by the patched forward; None: inputs_embeds). Each row
        # keeps its ids so far, so the chunk that ends the prompt hands the whole prompt to the methods
        # (SequenceSlice.text: the repeated-text settings read it), as the engine does.
        self.step_ids: torch.Tensor | None = None
        # The per-layer callable: the method, or for hybrid models (Gemma 3) a router with this cache's own ring
        # buffers for the sliding-window layers (one row per batch row).
        self.attention = session.method

    # ---- what transformers asks --------------------------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens the model has read (positions), not slots held: a compacting method keeps fewer."""
        return self.rows[0]["num_computed"] if self.rows else 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.get_seq_length()

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    @property
    def is_compileable(self) -> bool:
        return False

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("an infinitehip MethodCache cannot be cropped (assisted decoding is not supported)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("an infinitehip MethodCache does not support beam search; use greedy or sampling")

    # ---- the step ----------------------------------------------------------------------------------------
    def _ensure_rows(self, batch_size: int, like: torch.Tensor) -> None:
        if not self.rows:
            mc = self.session.model_config.method_view()
            self.kv = PagedKVCache(mc.num_layers, batch_size * 4, self.page_size, mc.num_kv_heads, mc.head_dim,
                                   like.dtype, like.device)
            self._next_page = 0
            self.rows = [dict(seq_id=next(_seq_ids), pages=[], num_cached=0, num_computed=0, ids=[],
                              state=self.session.method.new_state()) for _ in range(batch_size)]
            full = self.session.model_config
            if full.sliding_layers:
                sliding = SlidingWindowAttention(full, batch_size, like.device, like.dtype)
                self.attention = LayerRouter(self.session.method, full, sliding)
        elif len(self.rows) != batch_size:
            raise ValueError(f"this cache holds {len(self.rows)} sequences, the forward has {batch_size} rows")

    def _reserve(self, row: dict, tokens: int) -> torch.Tensor:
        """Pages for `tokens` slots of the row; [num_pages] int32 page table on the KV's device."""
        need = -(-tokens // self.page_size) - len(row["pages"])
        if need > 0:
            if self._next_page + need > self.kv.num_pages:
                self._grow(max(2 * self.kv.num_pages, self._next_page + need))
            row["pages"] += range(self._next_page, self._next_page + need)
            self._next_page += need
        return torch.tensor(row["pages"], dtype=torch.int32, device=self.kv.device)

    def _grow(self, num_pages: int) -> None:
        old = self.kv
        self.kv = PagedKVCache(old.num_layers, num_pages, old.page_size, old.k.shape[-2], old.k.shape[-1],
                               old.k.dtype, old.device)
        self.kv.k[:, : old.num_pages] = old.k  # page ids (so slot ids) are kept
        self.kv.v[:, : old.num_pages] = old.v

    def forward_batch(self, batch_size: int, num_tokens: int, like: torch.Tensor) -> ForwardBatch:
        """The step's ForwardBatch: B rows of T new tokens each, flattened row-major to [B * T]."""
        if self.batch is not None:
            return self.batch
        self._ensure_rows(batch_size, like)
        method, limit = self.session.method, self.session.max_context_tokens
        decode = num_tokens == 1 and self.get_seq_length() > 0
        slices = []
        for b, row in enumerate(self.rows):
            if row["num_computed"] + num_tokens > limit:
                raise ValueError(f"{row['num_computed'] + num_tokens} tokens exceed max_context_tokens={limit} of "
                                 f"method {method.name!r}; nothing was truncated (raise max_context_tokens)")
            table = self._reserve(row, row["num_cached"] + num_tokens + kv_scratch_tokens(method))
            ends_prompt = not decode and (self.prompt_len is None or row["num_computed"] + num_tokens == self.prompt_len)
            slices.append(SequenceSlice(
                seq_id=row["seq_id"], query_start=b * num_tokens, num_queries=num_tokens, start_pos=row["num_cached"],
                token_start=row["num_computed"], page_table=table, cache=self.kv, state=row["state"],
                is_prefill=not decode, ends_prompt=ends_prompt, text=self._prompt_text(row, b, ends_prompt)))
        self.session.rope.ensure(max(r["num_cached"] for r in self.rows) + num_tokens)
        self.batch = ForwardBatch(slices, self.kv, self.session.rope, batch_size * num_tokens)
        return self.batch

    def _prompt_text(self, row: dict, b: int, ends_prompt: bool) -> PromptText | None:
        """Keep row b's ids of this forward; at the prompt's last chunk, the prompt's ids (None once a forward
        came without ids: the text is unknown)."""
        if self.step_ids is None:
            row["ids"] = None
        elif row["ids"] is not None:
            row["ids"].append(self.step_ids[b])
        if not ends_prompt or row["ids"] is None:
            return None
        row["ids"] = [torch.cat(row["ids"])]  # one tensor from here on
        return PromptText(row["ids"][0].tolist())

    def end_step(self) -> None:
        """After the model's forward: count the tokens, let the method compact (streaming) via after_forward."""
        batch, self.batch = self.batch, None
        if batch is None:
            return
        hooks = ChunkHooks(extra_forward=_no_hooks, token_nll=_no_hooks)
        compacts = supports(self.session.method, CacheCompaction)
        for row, s in zip(self.rows, batch.slices):
            row["num_cached"] += s.num_queries
            row["num_computed"] += s.num_queries
            if not compacts:
                continue
            kept = self.session.method.after_forward(s, hooks)
            if kept is not None:
                row["num_cached"] = kept

    def release(self) -> None:
        """Hand the method's per-sequence states back (the patched generate does, for the caches it made)."""
        for row in self.rows:
            self.session.method.release(row["state"])


def _no_hooks(*args):
    raise NotImplementedError("this method needs engine hooks (ChunkHooks) the transformers integration lacks")

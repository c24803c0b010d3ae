"""How the infinitehip kernels reach a layer's keys and values: resident (the paged cache) or through the GPU banks.

The kernels read a key `t` as k_flat[page_table[t // page_size] * page_size + t % page_size]. With an
offloaded cache (`kv/offload/paged.py`), every read first resolves the needed store slots into a bank and the
kernels get a different (k_flat, page_table, page_size) triple over the bank's rows:
- representative scoring (mask bank, keys only): the scored representatives [M, N, H] are resolved in groups
  of chunks that fit the bank, each group's bank rows scattered into a token -> bank-row table, read with
  page_size 1, and the group scored before the next one is resolved (`RepresentativeKeys`): decode in static
  groups of mask_bank_tokens // min(H, chunk_size) chunks, prefill in groups sized from the chunks it scores;
- decode block-sparse attention (attention bank): each sequence's listed keys are resolved and the list
  positions 0..K-1 replace the token positions (`decode_attention_rows`; the RoPE positions are separate);
- prefill block-sparse attention: query blocks go in groups whose key lists fit the bank, through the token
  table (its causal mask needs token positions) (`prefill_attention_in_groups`);
- the landmark saliency update and the dense shortcut use the cache's `read_k` / `read` (attention bank);
- question-time selection scans every key of the context once per layer at the end of the prompt, straight from
  the store (`question_key_reader`), so the scan does not flush the banks;
- with `OffloadConfig.stage_prefill` (the default) a prefill chunk reads none of the above: each layer's context
  is copied from the store into one GPU buffer first (`StagedLayer`) and every prefill read goes there.
Decode paths are sync-free with static shapes (CUDA-graph capturable); prefill grouping syncs to size groups.
A resident cache gets its own rows back unchanged, so the method has one code path.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from infinitehip.attention.methods.infinitehip.bank_sizing import (
    BankRequests, check_bank_requests, decode_bank_requests,
)
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.kv.offload.compose import decode_tables, list_slots
from infinitehip.kv.offload.paged import safe_rows
from infinitehip.kv.offload.planner import CapacityError
from infinitehip.kv.paged_cache import is_offloaded, token_slots
from infinitehip.profiling import phase

# score(keys, rows, cols) -> the scores of query blocks `rows` and chunks `cols` (a slice each) with their
# representatives' keys read through keys = (k_flat, page_table, page_size).
Score = Callable[[tuple[torch.Tensor, torch.Tensor, int], slice, slice], torch.Tensor]


class RepresentativeKeys:
    """Representative keys of one layer and sequence through the mask bank (only built for an offloaded cache)."""

    def __init__(self, cache, layer: int, page_table: torch.Tensor):
        self.cache, self.layer, self.page_table = cache, layer, page_table
        self.bank = cache.kv.mask_bank

    @phase("mask-bank resolve + table")
    def __call__(self, reps: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """reps [M, N, H] token positions, lens [M, N] (0: padding chunk, not read) -> (k_flat, table, 1). Sync-free."""
        listed = (lens > 0)[..., None].expand_as(reps)
        return self.bank.flat_k(self.layer), self.cache.token_table(reps, self.rows(reps, listed), self.bank, listed), 1

    def rows(self, reps: torch.Tensor, listed: torch.Tensor) -> torch.Tensor:
        """Mask-bank indices [M, N, H] int32 of the listed reps, resolved (-1: not listed). Sync-free."""
        slots = torch.where(listed, token_slots(self.page_table, reps, self.cache.page_size), -1)
        return self.cache.kv.resolve_mask(self.layer, slots)

    def chunks_per_group(self, chunk_size: int, num_heads: int) -> int:
        """Chunks whose representatives always fit the mask bank together: a chunk has at most min(H, chunk_size)
        distinct ones (one per query head, inside the chunk). Refuses a bank smaller than one chunk's."""
        per_chunk = min(num_heads, chunk_size)
        if per_chunk > self.bank.bank_tokens:
            raise CapacityError(f"mask_bank_tokens={self.bank.bank_tokens:,} is smaller than one chunk's representatives "
                                f"({per_chunk:,}: one per query head, chunk size {chunk_size}); raise mask-bank-tokens")
        return self.bank.bank_tokens // per_chunk

    def score_in_fixed_groups(self, reps: torch.Tensor, lens: torch.Tensor, chunk_size: int, score: Score) -> torch.Tensor:
        """Decode: score(keys, rows, cols) -> [M, n(cols)(, H)] on groups of G = chunks_per_group chunks, each group's
        representatives resolved into the mask bank just before it is scored; scores concatenated along the
        chunk axis (the caller ranks the chunks over all groups). reps [M, N, H], lens [M, N]: the groups are
        static slices of N (the last one shorter), so the step is sync-free with fixed shapes."""
        N, H = reps.shape[1:]
        G = self.chunks_per_group(chunk_size, H)
        return torch.cat([score(self(reps[:, a : a + G], lens[:, a : a + G]), slice(None), slice(a, a + G))
                          for a in range(0, N, G)], dim=1)

    def score_in_groups(self, reps: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, chunk_size: int,
                        score: Score) -> torch.Tensor:
        """Prefill: score(keys, rows, cols) on groups of chunk columns whose representatives fit the mask bank;
        a column that does not fit alone is scored in groups of its query blocks (rows) instead. Scores
        concatenated along the chunk axis (syncs to size the groups).

        A column's distinct representatives are at most min(H, chunk_size) per distinct (start, len) chunk in
        it (query blocks share chunks: in stage 1 every block has the same ones), summed over the group's
        columns: an upper bound of the union that needs a sort of [N, M], not of the reps [N, M * H]."""
        M, N, H = reps.shape
        rows_per_group = self.chunks_per_group(chunk_size, H)  # one chunk per row of a column
        pairs = torch.where(lens > 0, starts * (chunk_size + 1) + lens, -1).T.sort(1).values  # [N, M]
        distinct = ((pairs[:, 1:] != pairs[:, :-1]) & (pairs[:, 1:] >= 0)).sum(1) + (pairs[:, 0] >= 0)
        per_column = (distinct * min(H, chunk_size)).tolist()
        groups, start, size = [], 0, 0  # (first column, end column, query blocks per group)
        for j, n in enumerate(per_column):
            if n > self.bank.bank_tokens:  # this column alone does not fit: its query blocks in groups
                groups += [(start, j, M)] * (j > start) + [(j, j + 1, rows_per_group)]
                start, size = j + 1, 0
                continue
            if size + n > self.bank.bank_tokens:
                groups.append((start, j, M))
                start, size = j, 0
            size += n
        groups += [(start, N, M)] * (N > start)
        parts = []
        for a, b, R in groups:
            cols = slice(a, b)
            parts.append(torch.cat([score(self(reps[r : r + R, cols], lens[r : r + R, cols]), slice(r, r + R), cols)
                                    for r in range(0, M, R)]))
        return torch.cat(parts, dim=1)


class StagedLayer:
    """An offloaded prefill's layer read as if resident: the sequence's keys of positions [0, context_len) copied
    from the store into one GPU buffer (`OffloadedPagedCache.stage`), row = token position, so the kernels read it
    with an identity page table. Stands in for `RepresentativeKeys` (every representative in one call). The values
    are staged on first use (`v`), only where the attention reads more keys than the context holds
    (`stages_values`); a short chunk (a question after a cached document) reads its few keys through the attention
    bank instead of copying a whole layer of values."""

    def __init__(self, cache, layer: int, page_table: torch.Tensor, context_len: int):
        self.cache, self.layer, self.context_len, self.source_table = cache, layer, context_len, page_table
        self.k = cache.stage(layer, page_table, context_len, "k")
        self._v: torch.Tensor | None = None
        self.page_size = cache.page_size
        self.page_table = torch.arange(self.k.shape[0] // self.page_size, dtype=page_table.dtype,
                                       device=page_table.device)

    @property
    def v(self) -> torch.Tensor:
        if self._v is None:
            self._v = self.cache.stage(self.layer, self.source_table, self.context_len, "v")
        return self._v

    def stages_values(self, key_counts: torch.Tensor) -> bool:
        """Whether the attention of query blocks with these key-list lengths [M] reads its values from a staged copy
        (one copy of the context) rather than through the attention bank (at most sum(key_counts) rows). Syncs."""
        return self._v is not None or int(key_counts.sum()) >= self.context_len

    def keys(self, start: int, end: int) -> torch.Tensor:
        """Keys [end - start, Hkv, d] of positions [start, end)."""
        return self.k[start:end]

    def score_in_groups(self, reps, starts, lens, chunk_size: int, score: Score) -> torch.Tensor:
        return score((self.k, self.page_table, self.page_size), slice(None), slice(None))


def stage_prefill_layer(cache, layer: int, page_table: torch.Tensor, context_len: int) -> StagedLayer | None:
    """The staged layer for an offloaded cache whose config asks for it (`OffloadConfig.stage_prefill`), else None."""
    if not is_offloaded(cache) or not cache.kv.config.stage_prefill:
        return None
    return StagedLayer(cache, layer, page_table, context_len)


def scoring_access(cache, layer: int, page_table: torch.Tensor) -> tuple[torch.Tensor, RepresentativeKeys | None]:
    """(k_flat for the scoring kernels, representative-key reader or None when the cache is resident)."""
    if not is_offloaded(cache):
        return cache.flat_k(layer), None
    return cache.kv.mask_bank.flat_k(layer), RepresentativeKeys(cache, layer, page_table)


def question_key_reader(cache, layer: int, page_table: torch.Tensor):
    """For an offloaded cache, the (start, end) -> keys reader question-time selection scans the context with
    (straight from the store, `OffloadedPagedCache.scan_k`); None for a resident cache (read in place)."""
    if not is_offloaded(cache):
        return None
    return lambda start, end: cache.scan_k(layer, page_table, start, end)


def decode_attention_rows(cache, layer: int, page_tables: torch.Tensor, key_tokens: torch.Tensor,
                          key_counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """(k_flat, v_flat, page_tables, page_size, key_tokens) for `sparse_attention_decode`. Sync-free."""
    if not is_offloaded(cache):
        return cache.flat_k(layer), cache.flat_v(layer), page_tables, cache.page_size, key_tokens
    bank = cache.kv.attention_bank
    slots = list_slots(page_tables, cache.page_size, key_tokens, key_counts)
    index = safe_rows(bank, cache.kv.resolve_attention(layer, slots))
    tables, tokens, page_size = decode_tables(index)
    return bank.flat_k(layer), bank.flat_v(layer), tables, page_size, tokens


def prefill_attention_in_groups(cache, layer: int, page_table: torch.Tensor, key_tokens: torch.Tensor,
                                key_counts: torch.Tensor, block_size: int, num_queries: int,
                                attend: Callable[..., torch.Tensor]) -> torch.Tensor:
    """attend(k_flat, v_flat, page_table, page_size, blocks: slice, rows: slice) -> [rows, H, d] for groups of
    query blocks whose key lists (key_tokens [M, K], key_counts [M]) fit the attention bank together."""
    if not is_offloaded(cache):
        return attend(cache.flat_k(layer), cache.flat_v(layer), page_table, cache.page_size,
                      slice(0, key_tokens.shape[0]), slice(0, num_queries))
    bank = cache.kv.attention_bank
    counts = key_counts.tolist()
    groups, start, size = [], 0, 0
    for m, n in enumerate(counts):  # sum of counts bounds the union of the group's keys
        if n > bank.bank_tokens:
            raise CapacityError(f"attention_bank_tokens={bank.bank_tokens:,} is smaller than one prefill query "
                                f"block's key list ({n:,} keys); raise attention-bank-tokens")
        if size + n > bank.bank_tokens:
            groups.append((start, m))
            start, size = m, 0
        size += n
    groups.append((start, len(counts)))
    outs = []
    for a, b in groups:
        tokens, cnt = key_tokens[a:b], key_counts[a:b]
        slots = list_slots(page_table[None].expand(b - a, -1), cache.page_size, tokens, cnt)
        index = cache.kv.resolve_attention(layer, slots)
        table = cache.token_table(tokens, index, bank, slots >= 0)
        rows = slice(a * block_size, min(b * block_size, num_queries))
        outs.append(attend(bank.flat_k(layer), bank.flat_v(layer), table, 1, slice(a, b), rows))
    return torch.cat(outs)


def check_offload(method: InfiniteHiPConfig, offload: OffloadConfig, context_tokens: int, num_heads: int,
                  max_num_seqs: int) -> BankRequests:
    """Refuse (naming the setting) what infinitehip cannot run with offloaded KV, before anything is allocated:
    SelectRep bisection (its kernel reads keys it finds on the way, not a list known beforehand) and banks
    smaller than one resolve call's worst case: one chunk's representatives (mask bank: decode and prefill score
    the candidates in groups of chunks that fit it, `RepresentativeKeys`), the key lists of max_num_seqs
    decoding sequences or of one prefill query block (attention bank)."""
    if method.representative != "landmark":
        raise ValueError(f"KV offloading needs representative='landmark' (got {method.representative!r}): the "
                         "bisection kernel reads keys it discovers on the way")
    batch = decode_bank_requests(method, context_tokens, num_heads, max_num_seqs)
    last_keep = max(method.keep_tokens[-1], method.early_last_keep_tokens if method.early_layers else 0)
    question = method.question_keep_tokens if method.question_tokens else 0
    block = min(context_tokens, method.sink_tokens + last_keep + question + method.stream_tokens
                + method.query_block_sizes[-1])
    # Question-time selection adds its chunks to every decoding sequence's key list (and to the question's blocks).
    decode = min(context_tokens * max_num_seqs, batch.attention_tokens + question * max_num_seqs)
    need = replace(batch, attention_tokens=max(decode, block))
    try:
        check_bank_requests(offload, need)
    except CapacityError as exc:
        raise CapacityError(f"{exc} (attention: max_num_seqs={max_num_seqs} decoding sequences share one call, "
                            f"or one prefill query block needs {block:,})") from None
    return need

"""KV offloading (paper Sec. 3.3, Alg. 4): host-memory KV store + GPU mask / attention banks with LRU resolve.

Modules: `store` (all K/V, pinned, flat slots like PagedKVCache), `bank` (one GPU bank: rows, slot
table, reverse map, LRU stamps and order, counters), `resolve` (the sync-free resolve / invalidate ops),
`reference` / `triton` (host<->bank row copy, eager oracle and UVA kernel), `lru/triton` (resolve / invalidate
kernels), `offloaded` (store + both banks from an OffloadConfig), `compose` (bank indices as page tables for the
unchanged kernels), `planner` (capacity before allocation),
`validate`, `paged` (the offloaded KV behind the paged-cache surface the engine and methods use).

Wiring (done): `paged.OffloadedPagedCache` is what the engine builds instead of PagedKVCache
(`engine/kv_setup.py`: method check, planner, summary, refusal before allocation);
`attention/methods/infinitehip/offload_access.py` (with `bank_sizing.py`, the worst-case requests per resolve call)
gives the infinitehip kernels their (k_flat, page_table, page_size)
triples over the banks (decode: options (a) for scoring, in static groups of chunks that fit the mask bank,
compose.decode_tables for attention; prefill: groups of chunk columns / query blocks sized to the banks), so
the mask bank needs only one chunk's representatives; `tests/engine/test_offload_engine.py` is the validation mode
(offloaded engine == resident engine, statistics, refusals). An FP8 store (kv_dtype) is upcast into the
banks (model dtype) by the miss copy, so the kernels never read FP8; a resident FP8 cache is refused.

Design note (as written before the wiring; the code above follows it)
---------------------------------------------------------------------
Engine (`LLMEngine.__init__`, when `OffloadConfig.offload_enabled`):
  1. plan = plan_capacity(L, Hkv, d, offload.torch_kv_dtype(model dtype), offload, gpu_free_bytes() after
     the model is loaded, host_available_bytes(), page_size); plan.check(kv tokens) refuses before any
     allocation; log plan.summary.
  2. check_bank_requests(offload, decode_bank_requests(method config, max_context_tokens, num_heads,
     sequences per resolve call)) refuses banks that one call could overflow.
  3. Build OffloadedKV(offload, L, num_pages * page_size, Hkv, d, dtype, device) instead of the full-size
     GPU PagedKVCache; the page allocator and page tables are unchanged (store slots = cache slots).
Write path (`AttentionMethod.__call__`): `kv.write(layer, batch.new_slots, k, v)` scatters the new rows into
  the pinned store with the Triton kernel (no sync) and drops stale bank copies of those slots (slots are
  reused across sequences). The new tokens come back as misses of the same step (one row per sequence).
Decode, per layer (Alg. 4), in the method:
  - Mask bank, before representative scoring of each refreshed stage: reps [M, N, H] token positions ->
    slots = token_slots(page_table, reps, page_size) -> idx = kv.resolve_mask(layer, slots). The scoring
    kernels find a key's row as page_table[tok // page_size] * page_size + tok % page_size, so either
    (a) pass page_size 1 and a per-sequence token -> bank-index table: seq_table = full([context], -1);
    seq_table.scatter_(0, reps.flatten(), idx.flatten()) (static shape, O(context) int32 fill per call), or
    (b) give the kernels an explicit row tensor (a small kernel change, no O(context) fill).
    Landmark representatives come from the saliency buffers (no key reads); only the scored reps are read.
    Stage 0 at 1M tokens reads chunks * H reps (131K for 3k with 32 heads): it runs in groups of chunks
    (resolve + score per group; top-k after), which the scores allow (done: one chunk's reps at the least).
  - Attention bank, before block-sparse attention: slots = compose.list_slots(page_tables, page_size,
    key_tokens, key_counts) (padding -> -1); idx = kv.resolve_attention(layer, slots.view(-1)).view(B, K);
    tables, tokens, 1 = compose.decode_tables(idx); sparse_attention_decode(q, bank.flat_k(layer),
    bank.flat_v(layer), tables, 1, tokens, key_counts, key_rope, query_rope, ...): decode attends every
    listed key, so list positions 0..K-1 replace the token positions (RoPE positions are separate).
    The landmark saliency update reads the stream window's keys: they are in the same list (resident).
  - Statistics: kv.stats() (hit ratio per bank and layer) between steps, e.g. in the server metrics.
Prefill: the same two calls per group of query blocks, with groups sized so the union of their requests
  fits each bank (per block: sink + keep + stream + the chunk's own keys); the prefill kernel's causal mask
  needs token positions, so it uses option (a) (a token -> bank-index table per sequence).
CUDA graphs: resolve and the row copy are sync-free with static shapes (pad key lists to the worst case of
  `attention/methods/infinitehip/bank_sizing.py`; padding slots are -1); the stamps come from a device-side clock, so replays advance LRU.
  An index returned by resolve is valid until the next resolve of the same bank and layer.
Validation mode: validate.validate_against_paged compares every row read through the banks with a
  resident PagedKVCache (debug runs at small contexts; it syncs every step).
"""

from infinitehip.kv.offload.bank import BankStats, KVBank
from infinitehip.kv.offload.offloaded import OffloadedKV
from infinitehip.kv.offload.paged import OffloadedPagedCache
from infinitehip.kv.offload.resolve import invalidate, resolve
from infinitehip.kv.offload.store import KVStore

__all__ = ["BankStats", "KVStore", "KVBank", "OffloadedKV", "OffloadedPagedCache", "invalidate", "resolve"]

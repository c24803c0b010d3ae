"""Chooses what each engine step computes. Plain Python over `Sequence` bookkeeping: no tensors.

Policy (continuous batching): every running sequence that finished its prefill decodes one token per
step; the rest of the step's token budget (`prefill_chunk_size`) goes to prefill chunks of running
sequences in arrival order, so a long prefill advances chunk by chunk while other streams keep decoding. The
last chunk of a prefill holds at least the method's `prompt_end_tokens` (the question's queries, which attend what
the method selects at the prompt's end): the chunk before it stops short where the grid would leave fewer.
KV pages are allocated as sequences grow: a waiting sequence is admitted (FIFO) when a running slot is
free and pages for its prefill plus one decoded token are free. When a decoding sequence needs a page
and none is free, the most recently admitted running sequence is preempted: its pages are freed and it
goes back to the head of the queue, to be recomputed (prompt + tokens generated so far) when pages free up.

Methods that compact their cache (InfiniPot) declare `kv_token_limit`: no sequence ever holds more cache
slots than that, whatever its length, so its pages are bounded by it and a prefill chunk never takes it
past the limit (the method compacts after each chunk). `kv_scratch_tokens` more slots per sequence are
room for tokens a method runs after the cache without keeping them (InfiniPot's catalyst prompt); they
never count toward the limit or a chunk's room.

Prefix caching (`prefix` set, with a `PrefixCachingAllocator`): at admission a sequence takes the longest cached
prefix of its prompt the method may reuse (`kv/prefix_reuse.py`) and prefills only the rest; after each prefill
chunk its full prompt pages are named by their hashes, so they stay cached when it finishes or is preempted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from infinitehip.engine.sequence import Sequence, SequenceStatus
from infinitehip.kv.page_allocator import PageAllocator
from infinitehip.kv.prefix_cache import page_hashes
from infinitehip.kv.prefix_reuse import PrefixHit, PrefixPolicy, last_token_only


@dataclass
class StepPlan:
    prefill: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, tokens this step)
    decode: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.prefill and not self.decode

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.prefill) + len(self.decode)


class Scheduler:
    def __init__(self, allocator: PageAllocator, max_num_seqs: int, prefill_chunk_size: int, kv_token_limit: int | None = None,
                 kv_scratch_tokens: int = 0, prefix: PrefixPolicy | None = None,
                 prompt_end_tokens: Callable[[int], int] = last_token_only):
        if kv_scratch_tokens < 0:
            raise ValueError(f"kv_scratch_tokens must be >= 0, got {kv_scratch_tokens}")
        # prefill length -> tokens the last chunk of that prefill holds at least (chunk_tokens)
        self.prompt_end_tokens = prompt_end_tokens
        self.allocator = allocator
        self.prefix = prefix  # None: prefix caching off (allocator is then a plain PageAllocator)
        self.kv_token_limit = kv_token_limit
        self.kv_scratch_tokens = kv_scratch_tokens
        self.max_num_seqs = max_num_seqs
        self.prefill_chunk_size = prefill_chunk_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        need = self.cache_tokens(seq.max_total_tokens)
        if self.allocator.pages_for(need) > self.allocator.num_pages:
            raise ValueError(
                f"request needs {need} tokens of KV cache, the cache holds {self.allocator.num_pages * self.allocator.page_size}"
            )
        self.waiting.append(seq)

    def cache_tokens(self, num_tokens: int) -> int:
        """Cache slots a sequence of num_tokens tokens needs at most (scratch slots included)."""
        kept = num_tokens if self.kv_token_limit is None else min(num_tokens, self.kv_token_limit)
        return kept + self.kv_scratch_tokens

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _admit(self) -> list[Sequence]:
        admitted = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            tokens = self.cache_tokens(seq.prefill_target + 1)
            hit = self._lookup(seq)
            if hit is not None:  # its pages are referenced now, so the room check below cannot evict them
                self.allocator.take(hit.shared + [src for src, _ in hit.copies])
                missing = self.allocator.pages_for(tokens) - len(hit.shared)
            else:
                missing = self.allocator.pages_for(tokens)
            if not self.allocator.can_allocate(missing) and hit is not None:
                # The hit holds its pages and the copies' sources while new pages are allocated: in a cache that
                # cannot hold both, compute the prompt from scratch (the cached pages are evictable again) rather
                # than wait for room that finishing requests will never free.
                self.allocator.release(hit.shared + [src for src, _ in hit.copies])
                hit, missing = None, self.allocator.pages_for(tokens)
            if not self.allocator.can_allocate(missing):
                break  # FIFO: later requests wait behind it rather than starving it
            self.waiting.popleft()
            if self.prefix is not None and seq.num_computed == 0:
                self.allocator.stats.queries += seq.num_prompt_tokens
                seq.cached_prompt_tokens = 0
            if hit is not None:
                self._apply_hit(seq, hit)
            self.allocator.grow(seq.page_table, tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    # ---- prefix caching ---------------------------------------------------------------------------------
    def _lookup(self, seq: Sequence) -> PrefixHit | None:
        """The cached prefix a sequence starting from scratch may reuse (None: none, or caching off)."""
        if self.prefix is None or seq.num_computed or seq.probe is not None or seq.params.prompt_logprobs is not None:
            return None  # a probe or prompt logprobs need every prompt position computed
        a, p = self.allocator, self.prefix
        if seq.page_hashes is None:
            seq.page_hashes = page_hashes(seq.prompt_ids, a.page_size)
        pages = a.match(seq.page_hashes)
        if p.reuse.needs_snapshot:  # pages of one owner only: their per-slot state matches these tokens (prefix_reuse.py)
            owner = a.owner(pages[0]) if pages else None
            pages = pages[: next((i for i, pg in enumerate(pages) if a.owner(pg) != owner), len(pages))]
        boundary = p.boundary(seq.num_prompt_tokens, len(pages))
        if p.needs_boundary_state:
            while boundary and a.payload(pages[boundary // a.page_size - 1]) is None:
                boundary -= p.grid
        if boundary == 0:
            return None
        tail = p.tail_pages(boundary)
        copies = [(pages[i], -1) for i in tail]
        state_page = pages[boundary // a.page_size - 1] if p.needs_boundary_state else None
        return PrefixHit(boundary, pages[: tail.start], copies, state_page)

    def _apply_hit(self, seq: Sequence, hit: PrefixHit) -> None:
        dst = self.allocator.allocate(len(hit.copies))
        hit = PrefixHit(hit.tokens, hit.shared, [(src, d) for (src, _), d in zip(hit.copies, dst)], hit.snapshot_page)
        seq.page_table[:] = hit.shared + dst
        seq.num_computed = seq.num_cached = hit.tokens
        seq.cached_prompt_tokens = hit.tokens
        # The copies hold the content of cached pages (named there), so registration goes on after the boundary.
        seq.registered_pages = hit.tokens // self.allocator.page_size
        seq.prefix_hit = hit if hit.copies or hit.snapshot_page is not None else None
        self.allocator.stats.hits += hit.tokens

    def copies_done(self, seq: Sequence) -> None:
        """The engine copied a hit's pages: drop the references that kept their sources from eviction."""
        if seq.prefix_hit is not None:
            self.allocator.release([src for src, _ in seq.prefix_hit.copies])
            seq.prefix_hit = None

    def cache_prefix(self, seq: Sequence, start: int) -> int | None:
        """After a prefill chunk [start, seq.num_computed): name the sequence's newly filled prompt pages by their
        hashes. Returns the token up to which they are cached when it grew, else None."""
        if self.prefix is None or seq.prefix_frozen or seq.probe is not None:
            return None
        end = self.prefix.registrable(start, seq.num_computed, seq.num_prompt_tokens)
        if end is None:
            seq.prefix_frozen = self.prefix.reuse.chunk_aligned and seq.num_computed < seq.num_prompt_tokens
            return None
        a = self.allocator
        if seq.page_hashes is None:
            seq.page_hashes = page_hashes(seq.prompt_ids, a.page_size)
        upto = end // a.page_size
        if upto <= seq.registered_pages:
            return None
        for i in range(seq.registered_pages, upto):
            if not a.register(seq.page_table[i], seq.page_hashes[i], seq.seq_id) and self.prefix.reuse.needs_snapshot:
                # Another sequence holds these pages: its chain continues, not ours (per-slot state is per owner).
                seq.prefix_frozen = True
                seq.registered_pages = i
                return None
        seq.registered_pages = upto
        return end

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.copies_done(seq)
        self.allocator.free(seq.page_table)
        seq.reset_cache()
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def _reserve_decode_pages(self) -> list[Sequence]:
        """Give every decoding sequence room for this step's token, preempting the newest when full."""
        preempted = []
        for seq in list(self.running):
            if seq.in_prefill or seq not in self.running:
                continue
            if self.kv_token_limit is not None and seq.num_cached >= self.kv_token_limit:
                raise RuntimeError(f"sequence {seq.seq_id} holds {seq.num_cached} cache slots, its method's limit")
            while not self._fits(seq, self.cache_tokens(seq.num_cached + 1)):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
        return preempted

    def decode_fits(self, seq: Sequence) -> bool:
        """Whether seq's next decode token has a cache slot or a free page for it (its step preempts nothing)."""
        if self.kv_token_limit is not None and seq.num_cached >= self.kv_token_limit:
            return False
        missing = self._missing_pages(seq, self.cache_tokens(seq.num_cached + 1))
        return missing <= 0 or self.allocator.can_allocate(missing)

    def decodes_fit(self, seqs: list[Sequence]) -> bool:
        """Whether every one of seqs' next decode tokens has a cache slot or a free page, together."""
        if self.kv_token_limit is not None and any(seq.num_cached >= self.kv_token_limit for seq in seqs):
            return False
        missing = sum(max(0, self._missing_pages(seq, self.cache_tokens(seq.num_cached + 1))) for seq in seqs)
        return missing <= 0 or self.allocator.can_allocate(missing)

    def _missing_pages(self, seq: Sequence, num_tokens: int) -> int:
        return self.allocator.pages_for(num_tokens) - len(seq.page_table)

    def _fits(self, seq: Sequence, num_tokens: int) -> bool:
        missing = self._missing_pages(seq, num_tokens)
        if missing <= 0:
            return True
        if not self.allocator.can_allocate(missing):
            return False
        self.allocator.grow(seq.page_table, num_tokens)
        return True

    def schedule(self) -> tuple[StepPlan, list[Sequence], list[Sequence]]:
        """The next step's work, the sequences admitted for it (their method state must be created) and
        those preempted (their method state and cached tensors must be dropped first: a sequence
        preempted for room may be re-admitted in the same step, to be recomputed)."""
        preempted = self._reserve_decode_pages()
        admitted = self._admit()
        plan = StepPlan(decode=[s for s in self.running if not s.in_prefill])
        budget = max(self.prefill_chunk_size - len(plan.decode), 1)
        for seq in self.running:
            if budget == 0:
                break
            if seq.in_prefill:
                n = self.chunk_tokens(seq.prefill_target - seq.num_computed, budget, seq.prefill_target)
                if self.kv_token_limit is not None:
                    room = self.kv_token_limit - seq.num_cached
                    if room <= 0:
                        raise RuntimeError(f"sequence {seq.seq_id} holds {seq.num_cached} cache slots, its method's limit")
                    n = min(n, room)
                plan.prefill.append((seq, n))
                budget = max(budget - n, 0)
        return plan, admitted, preempted

    def chunk_tokens(self, remaining: int, budget: int, prefill_tokens: int) -> int:
        """Tokens of a prefill of `prefill_tokens` with `remaining` left that this step computes, within the step's
        budget; the last `prompt_end_tokens` of a prefill are computed in one chunk (the method decides their
        attention at the prompt's end: `AttentionMethod.prompt_end_tokens`), so a chunk that would leave fewer for
        the last one stops short, and a last chunk of at most that many runs whole (past a budget smaller than it)."""
        end = self.prompt_end_tokens(prefill_tokens)
        if end < 1:
            raise ValueError(f"prompt_end_tokens must be >= 1, got {end} for a prefill of {prefill_tokens} tokens")
        if remaining <= max(budget, end):
            return remaining
        return min(budget, remaining - end)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.copies_done(seq)
        self.allocator.free(seq.page_table)

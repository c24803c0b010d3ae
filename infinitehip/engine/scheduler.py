"""Chooses what each engine step computes. Plain Python over `Sequence` bookkeeping: no tensors.

Policy (continuous batching): every running sequence that finished its prefill decodes one token per
step; the rest of the step's token budget (`prefill_chunk_size`) goes to prefill chunks of running
sequences in arrival order, so a long prefill advances chunk by chunk while other streams keep decoding.
KV pages are allocated as sequences grow: a waiting sequence is admitted (FIFO) when a running slot is
free and pages for its prefill plus one decoded token are free. When a decoding sequence needs a page
and none is free, the most recently admitted running sequence is preempted: its pages are freed and it
goes back to the head of the queue, to be recomputed (prompt + tokens generated so far) when pages free up.

Methods that compact their cache (InfiniPot) declare `kv_token_limit`: no sequence ever holds more cache
slots than that, whatever its length, so its pages are bounded by it and a prefill chunk never takes it
past the limit (the method compacts after each chunk). `kv_scratch_tokens` more slots per sequence are
room for tokens a method runs after the cache without keeping them (InfiniPot's catalyst prompt); they
never count toward the limit or a chunk's room.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from infinitehip.engine.sequence import Sequence, SequenceStatus
from infinitehip.kv.page_allocator import PageAllocator


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
                 kv_scratch_tokens: int = 0):
        if kv_scratch_tokens < 0:
            raise ValueError(f"kv_scratch_tokens must be >= 0, got {kv_scratch_tokens}")
        self.allocator = allocator
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
            if not self.allocator.can_allocate(self.allocator.pages_for(tokens)):
                break  # FIFO: later requests wait behind it rather than starving it
            self.waiting.popleft()
            self.allocator.grow(seq.page_table, tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
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

    def _fits(self, seq: Sequence, num_tokens: int) -> bool:
        missing = self.allocator.pages_for(num_tokens) - len(seq.page_table)
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
                n = min(seq.prefill_target - seq.num_computed, budget)
                if self.kv_token_limit is not None:
                    room = self.kv_token_limit - seq.num_cached
                    if room <= 0:
                        raise RuntimeError(f"sequence {seq.seq_id} holds {seq.num_cached} cache slots, its method's limit")
                    n = min(n, room)
                plan.prefill.append((seq, n))
                budget -= n
        return plan, admitted, preempted

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.allocator.free(seq.page_table)

"""Chooses what each engine step computes. Plain Python over `Sequence` bookkeeping: no tensors.

Policy (continuous batching): every running sequence that finished its prefill decodes one token per
step; the rest of the step's token budget (`prefill_chunk_size`) goes to prefill chunks of running
sequences in arrival order, so a long prefill advances chunk by chunk while other streams keep decoding.
A waiting sequence is admitted when a running slot is free and KV pages for its whole budget
(prompt + max_tokens) can be reserved, so an admitted request never runs out of cache mid-way.
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
    def __init__(self, allocator: PageAllocator, max_num_seqs: int, prefill_chunk_size: int):
        self.allocator = allocator
        self.max_num_seqs = max_num_seqs
        self.prefill_chunk_size = prefill_chunk_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        if self.allocator.pages_for(seq.max_total_tokens) > self.allocator.num_pages:
            raise ValueError(
                f"request needs {seq.max_total_tokens} tokens of KV cache, "
                f"the cache holds {self.allocator.num_pages * self.allocator.page_size}"
            )
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _admit(self) -> list[Sequence]:
        admitted = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.allocator.can_allocate(self.allocator.pages_for(seq.max_total_tokens)):
                break  # FIFO: later requests wait behind it rather than starving it
            self.waiting.popleft()
            self.allocator.grow(seq.page_table, seq.max_total_tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def schedule(self) -> tuple[StepPlan, list[Sequence]]:
        """The next step's work, and the sequences admitted for it (their method state must be created)."""
        admitted = self._admit()
        plan = StepPlan(decode=[s for s in self.running if not s.in_prefill])
        budget = max(self.prefill_chunk_size - len(plan.decode), 1)
        for seq in self.running:
            if budget == 0:
                break
            if seq.in_prefill:
                n = min(seq.num_prompt_tokens - seq.num_cached, budget)
                plan.prefill.append((seq, n))
                budget -= n
        return plan, admitted

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.allocator.free(seq.page_table)

"""Rank 0's model calls replayed on the other ranks: each step's scheduled sequences as plain data.

The scheduler, sampling and the API run on rank 0 only. Before every model call (`ModelRunner.run` of a scheduled
step, `forward_logits` of a prompt-logits chunk) rank 0 broadcasts a `StepMessage`: the sequences released since
the last call, and for each sequence in the call what the other ranks lack (new tokens, new page-table entries,
counters). Every rank keeps a mirror `Sequence` per running sequence with its own method state (its heads), and
runs the same call on it with its own `ModelRunner`: the collectives inside the model and the methods then meet
in the same order on every rank. Token ids and page tables are sent incrementally, so a decode step of a
million-token sequence sends one token.

Prefix caching: the page ids a hit copies and the boundaries whose state is kept go with the next call; each rank
copies its own shard of those pages and keeps its own heads' boundary state, by page id (rank 0's allocator
decides, the other ranks follow it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.runner import ModelRunner
from infinitehip.engine.scheduler import StepPlan
from infinitehip.engine.sequence import Sequence
from infinitehip.kv.prefix_reuse import PrefixHit, PrefixPolicy
from infinitehip.distributed.state import ParallelState


@dataclass
class SeqSync:
    seq_id: int
    num_computed: int
    num_cached: int
    tokens: list[int]  # the sequence's tokens past those already sent (prompt first, then outputs)
    pages: list[int]  # page-table entries past those already sent
    # The sequence's first message only (after a preemption the sequence is sent anew):
    prompt_len: int | None = None
    params: SamplingParams | None = None
    max_tokens: int | None = None


@dataclass
class HitSync:
    seq_id: int
    copies: list[tuple[int, int]]  # (source page, private copy) pairs
    state_page: int | None  # the page whose boundary state the hit restores


@dataclass
class StepMessage:
    op: str  # "run" (a scheduled step) | "forward_logits" (one prefill chunk of prompt_logits)
    # Boundary states kept after the last call, (seq_id, boundary, page): taken before `released` is applied.
    boundaries: list[tuple[int, int, int]] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    syncs: list[SeqSync] = field(default_factory=list)
    prefill: list[tuple[int, int]] = field(default_factory=list)  # (seq_id, tokens this step)
    decode: list[int] = field(default_factory=list)
    hits: list[HitSync] = field(default_factory=list)  # applied after the syncs, before the call


class DriverRunner:
    """Rank 0's runner: broadcasts each call, then runs it on its own ModelRunner (other attributes pass through)."""

    def __init__(self, local: ModelRunner, parallel: ParallelState):
        self.local, self.parallel = local, parallel
        self._sent: dict[int, tuple[int, int]] = {}  # seq_id -> (tokens sent, page-table entries sent)
        self._released: list[int] = []
        self._boundaries: list[tuple[int, int, int]] = []
        self._hits: list[tuple[Sequence, HitSync]] = []

    def __getattr__(self, name: str):
        return getattr(self.local, name)

    def _sync(self, seq: Sequence) -> SeqSync:
        first = seq.seq_id not in self._sent
        tokens_sent, pages_sent = self._sent.get(seq.seq_id, (0, 0))
        if len(seq.page_table) < pages_sent:  # a running sequence's table only grows; resend it whole if not
            raise RuntimeError(f"sequence {seq.seq_id}: page table shrank while running")
        sync = SeqSync(seq.seq_id, seq.num_computed, seq.num_cached, seq.token_ids(tokens_sent, seq.num_tokens),
                       seq.page_table[pages_sent:])
        if first:
            sync.prompt_len, sync.params, sync.max_tokens = seq.num_prompt_tokens, seq.params, seq.max_tokens
        self._sent[seq.seq_id] = (seq.num_tokens, len(seq.page_table))
        return sync

    def _broadcast(self, op: str, prefill: list[tuple[Sequence, int]], decode: list[Sequence]) -> None:
        seqs = [seq for seq, _ in prefill] + decode
        ids = {seq.seq_id for seq in seqs}
        seqs += [seq for seq, _ in self._hits if seq.seq_id not in ids]  # admitted, not in this call: sent anyway
        message = StepMessage(op, self._boundaries, self._released, [self._sync(seq) for seq in seqs],
                              [(seq.seq_id, n) for seq, n in prefill], [seq.seq_id for seq in decode],
                              [hit for _, hit in self._hits])
        self._released, self._boundaries, self._hits = [], [], []
        self.parallel.broadcast_object(message)

    def apply_prefix_hit(self, seq: Sequence, hit, state, page_size: int) -> None:
        self._hits.append((seq, HitSync(seq.seq_id, list(hit.copies), hit.snapshot_page)))
        self.local.apply_prefix_hit(seq, hit, state, page_size)

    def keep_boundary(self, seq: Sequence, policy, boundary: int):
        state = self.local.keep_boundary(seq, policy, boundary)
        if state is not None:
            self._boundaries.append((seq.seq_id, boundary, seq.page_table[boundary // policy.page_size - 1]))
        return state

    def run(self, plan: StepPlan):
        self._broadcast("run", plan.prefill, plan.decode)
        return self.local.run(plan)

    def forward_logits(self, seq: Sequence, n: int):
        self._broadcast("forward_logits", [(seq, n)], [])
        return self.local.forward_logits(seq, n)

    def release(self, seq: Sequence) -> None:
        self.local.release(seq)
        if self._sent.pop(seq.seq_id, None) is not None:  # the other ranks release theirs with the next call
            self._released.append(seq.seq_id)


class StepMirror:
    """A rank > 0: mirror sequences (with this rank's method state) and the calls rank 0 made on them."""

    def __init__(self, runner: ModelRunner, method, prefix: PrefixPolicy | None = None):
        self.runner, self.method, self.prefix = runner, method, prefix
        self.seqs: dict[int, Sequence] = {}
        # This rank's boundary states by page (rank 0's allocator holds its own; a page's state is replaced when
        # the page is a boundary again, so at most one per page).
        self.boundary_states: dict[int, object] = {}

    def apply(self, message: StepMessage) -> None:
        for seq_id, boundary, page in message.boundaries:
            self.boundary_states[page] = self.runner.keep_boundary(self.seqs[seq_id], self.prefix, boundary)
        for seq_id in message.released:
            seq = self.seqs.pop(seq_id, None)
            if seq is not None:
                self.method.release(seq.method_state)
                self.runner.release(seq)
        for sync in message.syncs:
            self._sync(sync)
        for h in message.hits:
            hit = PrefixHit(0, [], h.copies, h.state_page)
            state = None if h.state_page is None else self.boundary_states[h.state_page]
            self.runner.apply_prefix_hit(self.seqs[h.seq_id], hit, state, self.prefix.page_size)
        prefill = [(self.seqs[seq_id], n) for seq_id, n in message.prefill]
        decode = [self.seqs[seq_id] for seq_id in message.decode]
        if message.op == "run":
            self.runner.run(StepPlan(prefill, decode))
        elif message.op == "forward_logits":
            self.runner.forward_logits(*prefill[0])
        else:
            raise ValueError(f"unknown step op {message.op!r}")

    def _sync(self, sync: SeqSync) -> None:
        seq = self.seqs.get(sync.seq_id)
        if seq is None:
            n = sync.prompt_len
            seq = Sequence(sync.tokens[:n], sync.params, sync.max_tokens, seq_id=sync.seq_id,
                           output_ids=sync.tokens[n:], page_table=list(sync.pages))
            seq.method_state = self.method.new_state()
            self.seqs[sync.seq_id] = seq
        else:
            seq.output_ids += sync.tokens  # the prompt came whole in the first message
            seq.page_table += sync.pages
        seq.num_computed, seq.num_cached = sync.num_computed, sync.num_cached

    def release_all(self) -> None:
        for seq in self.seqs.values():
            self.method.release(seq.method_state)
            self.runner.release(seq)
        self.seqs.clear()

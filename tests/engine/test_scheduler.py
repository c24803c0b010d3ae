"""Scheduler policy without a model: admission by free KV pages, FIFO, continuous batching, max_num_seqs,
pages grown on demand and preemption by recompute."""

from __future__ import annotations

import pytest

from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.scheduler import Scheduler
from infinitehip.engine.sequence import Sequence, SequenceStatus
from infinitehip.kv.page_allocator import PageAllocator

PAGE = 16


def make_seq(prompt_len: int, max_tokens: int) -> Sequence:
    return Sequence(list(range(prompt_len)), SamplingParams(max_tokens=max_tokens), max_tokens)


def make_scheduler(num_pages: int = 64, max_num_seqs: int = 8, chunk: int = 256) -> Scheduler:
    return Scheduler(PageAllocator(num_pages, PAGE), max_num_seqs, chunk)


def execute(plan) -> None:
    """What the runner and engine do to the bookkeeping: cache the step's tokens, sample where due."""
    for seq, n in plan.prefill:
        seq.advance(n)
        if not seq.in_prefill:  # prompt complete: its last position samples the first token
            seq.output_ids.append(0)
    for seq in plan.decode:
        seq.advance(1)
        seq.output_ids.append(0)


def test_admission_waits_for_free_pages_for_prefill_plus_one_token():
    sched = make_scheduler(num_pages=9)
    a = make_seq(100, 28)  # admitted with 101 tokens -> 7 pages (not the whole 128-token budget)
    b = make_seq(40, 8)  # needs 41 tokens -> 3 pages
    sched.add(a)
    sched.add(b)
    plan, admitted, _ = sched.schedule()
    assert admitted == [a] and sched.running == [a] and list(sched.waiting) == [b]
    assert len(a.page_table) == 7 and sched.allocator.num_free == 2
    assert a.status is SequenceStatus.RUNNING and b.status is SequenceStatus.WAITING
    assert plan.prefill == [(a, 100)] and plan.decode == []
    execute(plan)
    plan, admitted, _ = sched.schedule()
    assert admitted == [] and plan.decode == [a]  # b still does not fit
    sched.finish(a, "length")
    assert sched.allocator.num_free == 9 and a.page_table == [] and a.finish_reason == "length"
    plan, admitted, _ = sched.schedule()
    assert admitted == [b] and plan.prefill == [(b, 40)]


def test_pages_grow_with_decoding_and_the_newest_sequence_is_preempted_then_recomputed():
    sched = make_scheduler(num_pages=8)
    a, b = make_seq(60, 40), make_seq(60, 40)  # 4 pages each at admission: the cache is full
    sched.add(a)
    sched.add(b)
    execute(sched.schedule()[0])  # both prefilled, one token each
    assert sched.allocator.num_free == 0
    for _ in range(4):  # the tokens at positions 60..63 still fit in the 4 pages (64 slots)
        plan, _, preempted = sched.schedule()
        assert plan.decode == [a, b] and preempted == []
        execute(plan)
    plan, admitted, preempted = sched.schedule()  # a needs a 5th page: b (newest) makes room
    assert preempted == [b] and admitted == [] and plan.decode == [a]
    assert len(a.page_table) == 5 and b.page_table == [] and b.num_cached == 0
    assert list(sched.waiting) == [b] and b.status is SequenceStatus.WAITING
    generated = list(b.output_ids)
    execute(plan)
    sched.finish(a, "stop")
    plan, admitted, _ = sched.schedule()
    assert admitted == [b] and plan.prefill == [(b, 60 + len(generated) - 1)]  # prompt + outputs but the newest
    assert b.output_ids == generated
    for seq, n in plan.prefill:
        seq.advance(n)  # re-prefill samples nothing: the next token to feed is already known
    assert not b.in_prefill
    plan, _, _ = sched.schedule()
    assert plan.decode == [b]


def test_request_larger_than_the_cache_is_rejected_at_add():
    sched = make_scheduler(num_pages=4)
    with pytest.raises(ValueError, match="KV cache"):
        sched.add(make_seq(60, 10))  # 70 tokens > 64 slots
    assert not sched.has_work


def test_fifo_head_of_line_is_not_overtaken():
    sched = make_scheduler(num_pages=10)
    big_running = make_seq(90, 6)  # 6 pages
    sched.add(big_running)
    sched.schedule()
    head = make_seq(70, 10)  # 5 pages: does not fit in the 4 free
    small = make_seq(10, 6)  # 1 page: would fit, but must wait behind `head`
    sched.add(head)
    sched.add(small)
    _, admitted, _ = sched.schedule()
    assert admitted == [] and list(sched.waiting) == [head, small]
    sched.finish(big_running, "stop")
    _, admitted, _ = sched.schedule()
    assert admitted == [head, small]  # arrival order
    assert [s.status for s in (head, small)] == [SequenceStatus.RUNNING] * 2


def test_max_num_seqs_limits_running_and_finishing_admits_the_next():
    sched = make_scheduler(num_pages=64, max_num_seqs=2)
    seqs = [make_seq(8, 4) for _ in range(5)]
    for s in seqs:
        sched.add(s)
    _, admitted, _ = sched.schedule()
    assert admitted == seqs[:2] and len(sched.waiting) == 3
    sched.finish(seqs[0], "stop")
    _, admitted, _ = sched.schedule()
    assert admitted == [seqs[2]] and sched.running == [seqs[1], seqs[2]]


def test_continuous_batching_decodes_every_step_while_a_long_prefill_advances_in_chunks():
    chunk = 128
    sched = make_scheduler(num_pages=200, chunk=chunk)
    short = [make_seq(20, 64), make_seq(30, 64)]
    for s in short:
        sched.add(s)
    plan, _, _ = sched.schedule()
    assert plan.prefill == [(short[0], 20), (short[1], 30)]  # both prompts fit in one step's budget
    execute(plan)
    long = make_seq(1000, 8)
    sched.add(long)
    processed, steps = [], 0
    while long.in_prefill:
        plan, _, _ = sched.schedule()
        steps += 1
        assert plan.decode == short, "running streams must decode every step"
        assert plan.num_tokens <= chunk, "the step's token budget covers decode + prefill"
        ((seq, n),) = plan.prefill
        assert seq is long and n == min(chunk - len(short), 1000 - long.num_cached)
        execute(plan)
        processed.append(long.num_cached)
    assert processed == sorted(processed) and processed[-1] == 1000
    assert steps == -(-1000 // (chunk - len(short)))
    assert all(len(s.output_ids) == 1 + steps for s in short)  # one token per step, no stall
    plan, _, _ = sched.schedule()
    assert plan.prefill == [] and plan.decode == [*short, long]  # the long prompt now decodes too


def test_several_prefills_share_the_budget_in_arrival_order():
    sched = make_scheduler(num_pages=200, chunk=100)
    a, b, c = make_seq(70, 4), make_seq(70, 4), make_seq(70, 4)
    for s in (a, b, c):
        sched.add(s)
    plan, _, _ = sched.schedule()
    assert plan.prefill == [(a, 70), (b, 30)]  # c gets nothing this step
    execute(plan)
    plan, _, _ = sched.schedule()
    assert plan.decode == [a] and plan.prefill == [(b, 40), (c, 59)]


def test_decode_keeps_running_when_decoders_exceed_the_budget():
    sched = make_scheduler(num_pages=64, max_num_seqs=8, chunk=4)
    decoders = [make_seq(2, 8) for _ in range(5)]
    for s in decoders:
        sched.add(s)
    while any(s.in_prefill for s in decoders):  # the budget shrinks as more of them decode
        execute(sched.schedule()[0])
    late = make_seq(10, 4)
    sched.add(late)
    plan, _, _ = sched.schedule()
    assert plan.decode == decoders  # every decoder runs even beyond the budget
    assert plan.prefill == [(late, 1)]  # and a prefill still makes progress (minimum 1 token)


def test_pages_freed_on_finish_and_waiting_sequences_can_be_finished():
    sched = make_scheduler(num_pages=8)
    a, b = make_seq(50, 14), make_seq(50, 14)  # 4 pages each
    c = make_seq(10, 6)
    for s in (a, b, c):
        sched.add(s)
    sched.schedule()
    assert sched.allocator.num_free == 0 and list(sched.waiting) == [c]
    sched.finish(c, "abort")  # a queued request that is cancelled
    assert not sched.waiting and c.is_finished and c.finish_reason == "abort"
    for s in (a, b):
        sched.finish(s, "stop")
    assert sched.allocator.num_free == 8 and not sched.running and not sched.has_work


def test_kv_token_limit_bounds_pages_and_prefill_chunks():
    """A compacting method (limit 64 slots): a 1000-token prompt holds <= 4 pages, chunks never pass the limit,
    and the sequence goes on once the method has compacted its cache."""
    sched = Scheduler(PageAllocator(8, PAGE), max_num_seqs=2, prefill_chunk_size=256, kv_token_limit=64)
    long = make_seq(1000, 10)
    sched.add(long)  # 1010 tokens but only 64 slots: accepted by an 8-page (128-slot) cache
    chunks = []
    while long.in_prefill:
        plan, _, _ = sched.schedule()
        ((seq, n),) = plan.prefill
        assert seq.num_cached + n <= 64 and len(seq.page_table) <= 4
        chunks.append(n)
        seq.advance(n)
        if seq.num_cached == 64:
            seq.num_cached = 16  # what the runner does when after_prefill_chunk compacted to 16 slots
    assert sum(chunks) == 1000 and chunks[:3] == [64, 48, 48]
    stuck = make_seq(200, 1)
    sched2 = Scheduler(PageAllocator(8, PAGE), 2, 256, kv_token_limit=64)
    sched2.add(stuck)
    plan, _, _ = sched2.schedule()
    stuck.advance(plan.prefill[0][1])  # a method that never compacts hits its own limit: a clear error
    with pytest.raises(RuntimeError, match="limit"):
        sched2.schedule()


def test_kv_scratch_tokens_give_room_past_the_limit_but_not_to_chunks():
    """Scratch slots (a method's catalyst prompt, 8 here) come on top of the 64-slot limit: pages for 72 slots,
    while prefill chunks still stop at the limit; a short sequence holds room for its tokens + the scratch."""
    sched = Scheduler(PageAllocator(8, PAGE), max_num_seqs=2, prefill_chunk_size=256, kv_token_limit=64, kv_scratch_tokens=8)
    long = make_seq(1000, 10)
    sched.add(long)
    plan, _, _ = sched.schedule()
    ((seq, n),) = plan.prefill
    assert n == 64 and len(seq.page_table) == 5  # 72 slots -> 5 pages of 16
    seq.advance(n)
    seq.num_cached = 16
    plan, _, _ = sched.schedule()
    assert plan.prefill[0][1] == 48 and len(seq.page_table) == 5
    short = make_seq(10, 4)
    sched.add(short)
    sched.schedule()
    assert len(short.page_table) == 2  # 11 tokens + 8 scratch slots
    with pytest.raises(ValueError, match="KV cache"):  # 64 + 8 slots do not fit a 4-page cache
        Scheduler(PageAllocator(4, PAGE), 2, 256, kv_token_limit=64, kv_scratch_tokens=8).add(make_seq(100, 1))
    with pytest.raises(ValueError, match="kv_scratch_tokens"):
        Scheduler(PageAllocator(4, PAGE), 2, 256, kv_scratch_tokens=-1)


@pytest.mark.parametrize("start,end", [(0, 3), (2, 5), (4, 6), (5, 7), (6, 7), (0, 7), (3, 9)])
def test_token_ids_spans_prompt_and_output(start, end):
    seq = Sequence([10, 11, 12, 13, 14], SamplingParams(max_tokens=4), 4)
    seq.output_ids += [20, 21]
    assert seq.token_ids(start, end) == ([10, 11, 12, 13, 14] + [20, 21])[start:end]


@pytest.mark.parametrize("prompt_len, chunk, decoding, expected", [
    (257, 256, 0, [225, 32]),  # one token past the grid: the chunk before stops 32 short
    (256 + 31, 256, 0, [255, 32]),
    (256 + 32, 256, 0, [256, 32]),  # enough left: the grid as without the rule
    (512, 256, 0, [256, 256]),
    (20, 256, 0, [20]),  # a prompt shorter than the rule's tokens: one chunk
    (40, 16, 6, [8, 32]),  # a step's budget (16 - 6 decoding) under the rule's 32: the last 32 still run whole
])
def test_the_chunk_that_ends_a_prefill_holds_the_prompt_end_tokens(prompt_len, chunk, decoding, expected):
    sched = Scheduler(PageAllocator(256, PAGE), 16, chunk, prompt_end_tokens=lambda n: 32)
    for _ in range(decoding):  # sequences decoding beside it take one token of every step's budget
        sched.add(make_seq(2, 64))
    execute(sched.schedule()[0])
    seq = make_seq(prompt_len, 4)
    sched.add(seq)
    sizes = []
    while seq.in_prefill:
        plan = sched.schedule()[0]
        assert len(plan.decode) == decoding
        sizes += [n for s, n in plan.prefill if s is seq]
        execute(plan)
    assert sizes == expected


def test_prompt_end_tokens_are_validated():
    sched = Scheduler(PageAllocator(64, PAGE), 2, 256, prompt_end_tokens=lambda n: 0)
    sched.add(make_seq(300, 4))
    with pytest.raises(ValueError, match="prompt_end_tokens must be >= 1, got 0 for a prefill of 300 tokens"):
        sched.schedule()

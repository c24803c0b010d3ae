"""The engine loop: one background thread owns the (single-threaded) LLMEngine; asyncio handlers talk to it.

Handlers call `AsyncEngine.submit` (validates, then enqueues an "add" command) and read the returned
`RequestStream`; closing a stream (client gone, request done) enqueues an "abort" command. Only the
engine thread touches the engine: it applies pending commands between steps, runs `engine.step()`,
turns the step's tokens into text deltas per sequence and hands each stream its events with one
`loop.call_soon_threadsafe` per step. When there is no work it sleeps on a condition variable.

Text deltas are computed from `Sequence.output_text` (the engine's detokenization, already cut at stop
strings). Until a sequence finishes, a tail that could still turn into a stop string, or that ends in
an incomplete UTF-8 character (U+FFFD), is held back, so the concatenated deltas equal the final text
and a stream never shows text that the non-streaming response would not contain.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.detokenize import stable_text
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.engine.sequence import Sequence, SequenceStatus
from infinitehip.server.metrics import ServerMetrics
from infinitehip.server.request_stream import (
    SHUTDOWN_CODE, SHUTDOWN_MESSAGE, EngineUnavailableError, ErrorEvent, Event, ProgressEvent, QueueFullError,
    RequestStream, TokenEvent, _SeqState,
)

logger = logging.getLogger("infinitehip.server")


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_waiting_requests: int = 64, metrics: ServerMetrics | None = None):
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self.metrics = metrics or ServerMetrics()
        self._cv = threading.Condition()
        self._commands: list[tuple[str, RequestStream | None]] = []
        self._num_queued = 0  # sequences accepted but not yet running (guarded by _cv)
        self._stopping = False
        self._draining = False  # shutting down: no new requests (event loop)
        self._live: set[RequestStream] = set()  # submitted, not finished, failed or aborted (event loop)
        self._thread: threading.Thread | None = None
        # Engine-thread-only state.
        self._by_seq: dict[int, _SeqState] = {}
        self._queued: set[_SeqState] = set()  # added to the scheduler, still WAITING
        self._prefilling: set[_SeqState] = set()  # running or waiting, no token yet
        self.last_error: str | None = None

    # ---- lifecycle (any thread) -------------------------------------------------------------------------
    def start(self) -> None:
        with self._cv:
            if self._thread is None:
                self._publish_state()  # the engine's state before any request: a prefix cache loaded from disk
                self._thread = threading.Thread(target=self._run, name="infinitehip-engine", daemon=True)
                self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    async def drain(self, timeout: float) -> None:
        """Shutting down (event loop): refuse new requests, give the running ones `timeout` seconds to finish, then
        end the rest with a 503 error (a stream: an error event and [DONE]). The step running then stops at its next
        layer (engine.request_cancel)."""
        self._draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._live and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if not self._live:
            return
        logger.warning("%d request(s) still running %s s after the shutdown began: ending them", len(self._live),
                       timeout)
        for stream in list(self._live):
            self.cancel_running(stream)
        self._enqueue(("fail_all", None), 0)
        while self._live and self._thread is not None and self._thread.is_alive():
            await asyncio.sleep(0.05)

    def cancel_running(self, stream: RequestStream) -> None:
        """A step of only cancelled sequences stops at its next layer instead of running to its end (a long prefill
        chunk); the engine thread aborts them with the command queued before this."""
        for st in stream.states:
            if st.seq is not None:  # None: not added yet, the add sees the stream closed
                self.engine.request_cancel(st.seq)

    @property
    def healthy(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping and not self._draining

    @property
    def num_queued(self) -> int:
        return self._num_queued

    # ---- requests (event loop) --------------------------------------------------------------------------
    def submit(self, seqs: list[tuple[list[int], SamplingParams]], want_progress: bool = False) -> RequestStream:
        """Validate and enqueue one request's sequences (all or none). Raises ValueError (incl. the
        engine's ContextLengthError) for requests that can never run, QueueFullError when busy."""
        for prompt_ids, params in seqs:
            self.engine.check_request(prompt_ids, params.max_tokens)  # pure check: context and KV room, no engine state
        if self._stopping or self._draining:
            raise EngineUnavailableError("the server is shutting down")
        self.start()
        stream = RequestStream(self, asyncio.get_running_loop(), [len(p) for p, _ in seqs], want_progress)
        stream.states = [_SeqState(stream, i, list(p), params) for i, (p, params) in enumerate(seqs)]
        self._enqueue(("add", stream), len(seqs))
        self._live.add(stream)
        return stream

    def _enqueue(self, command: tuple[str, RequestStream | None], new_queued: int) -> None:
        with self._cv:
            if new_queued:
                if self._num_queued + new_queued > self.max_waiting_requests:
                    raise QueueFullError(
                        f"the server has {self._num_queued} sequences waiting (limit {self.max_waiting_requests}); "
                        "retry later"
                    )
                self._num_queued += new_queued
            self._commands.append(command)
            self._cv.notify()

    # ---- engine thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._cv:
                while not self._commands and not engine.has_work and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    break
                commands, self._commands = self._commands, []
            for kind, stream in commands:
                if kind == "fail_all":
                    self._fail_all(SHUTDOWN_MESSAGE, 503, SHUTDOWN_CODE)
                else:
                    self._add(stream) if kind == "add" else self._abort(stream)
            if commands:
                self._publish_state()
            if engine.has_work:
                self._step()
        self._fail_all(SHUTDOWN_MESSAGE, 503, SHUTDOWN_CODE)

    def _release_queued(self, count: int) -> None:
        if count:
            with self._cv:
                self._num_queued -= count

    def _add(self, stream: RequestStream) -> None:
        if stream.closed:
            self._release_queued(len(stream.states))
            return
        added = []
        try:
            for st in stream.states:
                st.seq = self.engine.add_request(st.prompt_ids, st.params)
                self.metrics.prompt_length.observe(len(st.prompt_ids))
                added.append(st)
                self._by_seq[st.seq.seq_id] = st
                self._queued.add(st)
                self._prefilling.add(st)
        except Exception as exc:  # validated in submit, so unexpected; fail this request only
            logger.exception("add_request failed")
            for st in added:
                self._drop(st)
                self.engine.abort(st.seq)
            self._release_queued(len(stream.states) - len(added))
            stream.push_threadsafe([ErrorEvent(f"could not start the request: {exc}")])

    def _drop(self, st: _SeqState) -> None:
        if st.seq is not None:
            self._by_seq.pop(st.seq.seq_id, None)
        if st in self._queued:
            self._queued.discard(st)
            self._release_queued(1)
        self._prefilling.discard(st)

    def _abort(self, stream: RequestStream) -> None:
        for st in stream.states:
            if st.seq is not None and not st.seq.is_finished:
                self._drop(st)
                self.engine.abort(st.seq)
                self.metrics.finished.labels(reason="abort").inc()

    def _step(self) -> None:
        start = time.perf_counter()
        try:
            outputs, prefilled = self.engine.step(self._on_scheduled)
        except Exception as exc:  # a bug or device error: fail the running requests, keep serving
            logger.exception("engine step failed")
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._fail_all(f"internal engine error: {self.last_error}")
            return
        now = time.perf_counter()
        self.metrics.observe_step(prefilled, len(outputs), now - start)
        events: dict[RequestStream, list[Event]] = {}
        for st in [st for st in self._queued if st.seq.status is not SequenceStatus.WAITING]:
            self._queued.discard(st)
            self._release_queued(1)
        for st in self._prefilling:
            seq = st.seq
            # num_computed, not num_cached: a method that compacts its cache holds fewer slots than it has read
            if st.stream.want_progress and seq.num_computed != st.last_progress and seq.status is SequenceStatus.RUNNING:
                st.last_progress = seq.num_computed
                events.setdefault(st.stream, []).append(ProgressEvent(st.index, seq.num_computed, seq.num_prompt_tokens))
        for out in outputs:
            st = self._by_seq.get(out.seq.seq_id)
            if st is None:
                continue
            if st.last_token_time is None:
                self._prefilling.discard(st)
                self.metrics.ttft.observe(now - st.stream.arrival)
            else:
                self.metrics.itl.observe(now - st.last_token_time)
            st.last_token_time = now
            if out.seq.finish_reason == "error":  # this request's error (non-finite logits); its siblings abort
                self._drop(st)
                self.metrics.finished.labels(reason="error").inc()
                events.setdefault(st.stream, []).append(ErrorEvent(out.seq.error, 500, "non_finite_logits"))
                continue
            events.setdefault(st.stream, []).append(self._token_event(st, out.finished))
            if out.finished:
                self._drop(st)
                self.metrics.e2e.observe(now - st.stream.arrival)
                self.metrics.generation_length.observe(len(out.seq.output_ids))
                self.metrics.finished.labels(reason=out.seq.finish_reason).inc()
        for stream, evs in events.items():
            stream.push_threadsafe(evs)
        self._publish_state()

    def _on_scheduled(self, admitted: list[Sequence], preempted: list[Sequence]) -> None:
        """Before the model runs: admissions and preemptions reach the metrics now, not after a step that may last
        seconds (a one-step prefill would otherwise never show as running)."""
        now = time.perf_counter()
        for seq in admitted:
            st = self._by_seq.get(seq.seq_id)
            if st is not None and not st.admitted:  # re-admission after a preemption is not queue time
                st.admitted = True
                self.metrics.queue_time.observe(now - st.stream.arrival)
        self.metrics.preemptions.inc(len(preempted))
        self._publish_state()

    def _token_event(self, st: _SeqState, finished: bool) -> TokenEvent:
        seq = st.seq
        text = seq.output_text if finished else stable_text(seq.output_text, seq.params.stop)
        delta = text[st.sent_len :] if len(text) > st.sent_len else ""
        st.sent_len = max(st.sent_len, len(text))
        logprobs = None
        if seq.params.logprobs is not None:
            logprobs, st.sent_logprobs = seq.output_logprobs[st.sent_logprobs :], len(seq.output_logprobs)
        if not finished:
            return TokenEvent(st.index, delta, len(seq.output_ids), logprobs=logprobs, cached_tokens=seq.cached_prompt_tokens)
        prompt = seq.prompt_logprobs if seq.params.prompt_logprobs is not None else None
        return TokenEvent(st.index, delta, len(seq.output_ids), seq.finish_reason, seq.output_text, logprobs, prompt,
                          seq.cached_prompt_tokens)

    def _fail_all(self, message: str, status: int = 500, code: str = "engine_error") -> None:
        streams = {st.stream for st in self._by_seq.values()}
        for st in list(self._by_seq.values()):
            self._drop(st)
            if not st.seq.is_finished:
                try:
                    self.engine.abort(st.seq)
                except Exception:  # keep failing the others
                    logger.exception("abort failed")
                self.metrics.finished.labels(reason="error").inc()
        with self._cv:
            pending, self._commands = self._commands, []
        for kind, stream in pending:
            if kind == "add":
                self._release_queued(len(stream.states))
                streams.add(stream)
        for stream in streams:
            stream.push_threadsafe([ErrorEvent(message, status, code, "internal_error" if status == 500 else
                                               "service_unavailable")])
        self._publish_state()

    def _publish_state(self) -> None:
        sched = self.engine.scheduler
        alloc = sched.allocator
        kv = 1.0 - alloc.num_free / alloc.num_pages if alloc.num_pages else 0.0
        self.metrics.set_engine_state(len(sched.running), self._num_queued, kv)
        prefix = self.engine.prefix_cache_stats()  # None when prefix caching is off
        if prefix is not None:
            self.metrics.set_prefix_cache(prefix, alloc.num_cached_pages * alloc.page_size)
        banks = self.engine.kv_stats()  # None unless the KV is offloaded
        if banks is not None:
            self.metrics.set_kv_banks(banks)

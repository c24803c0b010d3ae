"""What a request's handler reads from the engine loop (async_engine.py): its events (tokens with their text deltas,
prefill progress, an error) as an async stream, and the engine thread's bookkeeping of each of its sequences. The
stream is filled from the engine thread through the event loop (`push_threadsafe`) and read by one handler."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.sequence import Sequence


class QueueFullError(RuntimeError):
    """Too many requests waiting for a running slot; the client should retry later."""


class EngineUnavailableError(RuntimeError):
    """The engine loop is stopped (server shutting down)."""


@dataclass
class TokenEvent:
    index: int  # choice index within the request
    text: str  # new text (may be empty when only held-back text grew)
    completion_tokens: int  # tokens generated so far by this sequence
    finish_reason: str | None = None  # "stop" | "length" once finished
    final_text: str | None = None  # the sequence's whole output text, on the finishing event
    # With SamplingParams.logprobs: TokenLogprob of the tokens generated since the last event (engine/logprobs.py);
    # with prompt_logprobs, the prompt's on the finishing event.
    logprobs: list | None = None
    prompt_logprobs: list | None = None
    cached_tokens: int = 0  # prompt tokens the sequence took from the prefix cache (usage.prompt_tokens_details)


@dataclass
class ProgressEvent:
    index: int
    processed: int  # prompt tokens that went through the model
    total: int  # prompt tokens


@dataclass
class ErrorEvent:
    message: str
    status: int = 500  # of a non-streaming answer; a stream sends an error event
    code: str = "engine_error"
    type: str = "internal_error"


SHUTDOWN_CODE = "server_shutting_down"  # a request ended by the server's shutdown
SHUTDOWN_MESSAGE = "the server is shutting down: the request did not finish within the drain timeout; retry"


Event = TokenEvent | ProgressEvent | ErrorEvent


@dataclass(eq=False)
class _SeqState:
    """Engine-thread bookkeeping of one sequence."""

    stream: RequestStream
    index: int
    prompt_ids: list[int]
    params: SamplingParams
    seq: Sequence | None = None
    sent_len: int = 0
    sent_logprobs: int = 0
    admitted: bool = False
    last_progress: int = -1
    last_token_time: float | None = None


class StreamOwner(Protocol):
    """What a stream asks of the engine loop that fills it (async_engine.AsyncEngine)."""

    _live: set

    def _enqueue(self, command: tuple, new_queued: int) -> None: ...

    def cancel_running(self, stream: "RequestStream") -> None: ...


class RequestStream:
    """One HTTP request's sequences (n choices / several prompts) as an async source of event batches."""

    def __init__(self, owner: StreamOwner, loop: asyncio.AbstractEventLoop, prompt_lens: list[int], want_progress: bool):
        self._owner, self._loop = owner, loop
        self.prompt_lens = prompt_lens  # per choice
        self.want_progress = want_progress
        self.arrival = time.perf_counter()
        self._events: deque[Event] = deque()
        self._ready = asyncio.Event()
        self._pending = len(prompt_lens)  # choices not finished yet
        self.error: str | None = None
        self.failure: ErrorEvent | None = None  # the error that ended the request (its message is `error`)
        self.closed = False  # aborted (by the client going away or by the handler)
        self.states: list[_SeqState] = []

    @property
    def done(self) -> bool:
        return self.closed or self.error is not None or (self._pending == 0 and not self._events)

    def _push(self, events: list[Event]) -> None:  # on the event loop
        for ev in events:
            if isinstance(ev, TokenEvent) and ev.finish_reason is not None:
                self._pending -= 1
            elif isinstance(ev, ErrorEvent):
                self.error, self.failure = ev.message, ev
        if self._pending == 0 or self.error is not None:
            self._owner._live.discard(self)
        self._events.extend(events)
        self._ready.set()

    def push_threadsafe(self, events: list[Event]) -> None:
        try:
            self._loop.call_soon_threadsafe(self._push, events)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    async def get(self, timeout: float | None = None) -> list[Event] | None:
        """Next events (possibly several steps' worth); [] once done; None when `timeout` passed first."""
        while not self._events:
            if self.done:
                return []
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except asyncio.TimeoutError:
                return None
        events = list(self._events)
        self._events.clear()
        return events

    def abort(self) -> None:
        """Stop generating (idempotent); frees the KV pages of unfinished sequences. Wakes a waiting get()."""
        if self.closed:
            return
        self.closed = True
        self._ready.set()
        self._owner._live.discard(self)
        if self._pending > 0:
            self._owner._enqueue(("abort", self), 0)
            self._owner.cancel_running(self)

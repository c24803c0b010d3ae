"""OpenAI request handling: request -> token ids + SamplingParams -> engine stream -> JSON or SSE response."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from infinitehip.config.sampling import SamplingParams
from infinitehip.config.server import ServerConfig
from infinitehip.engine.request_limits import ContextLengthError
from infinitehip.engine.sampler import GENERATION_DEFAULTS
from infinitehip.engine.settings import engine_preset
from infinitehip.engine.structured import json_object_schema
from infinitehip.server.async_engine import AsyncEngine
from infinitehip.server.request_stream import (
    EngineUnavailableError, ErrorEvent, ProgressEvent, QueueFullError, RequestStream, TokenEvent,
)
from infinitehip.server.errors import APIError, error_body
from infinitehip.server.logprobs_format import (
    NonFiniteLogprobError, TokenText, chat_logprobs, completion_logprobs, text_end,
)
from infinitehip.server.protocol import ChatCompletionRequest, CompletionRequest, _SamplingRequest, check_unicode

MAX_N = 64  # choices per request
MAX_STOP = 16  # stop strings per request
MAX_STOP_CHARS = 1024  # characters per stop string
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions (chat: up to the context)

_PARAM_OF_MESSAGE = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "stop_token_ids",
                     "stop", "logprobs", "prompt_logprobs")


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class OpenAIServing:
    def __init__(self, engine: AsyncEngine, config: ServerConfig, model_name: str, aliases: set[str]):
        self.engine, self.config, self.model_name = engine, config, model_name
        self.aliases = aliases | {model_name}
        llm = engine.engine
        self.vocab_size = llm.model_config.vocab_size
        self.method = llm.config.method
        self.preset = engine_preset(llm)

    # ---- endpoints ------------------------------------------------------------------------------------
    async def completions(self, body: CompletionRequest, request: Request):
        self._check_common(body)
        prompts = self._completion_prompts(body.prompt)
        ids = [await run_in_threadpool(self._encode_prompt, p) for p in prompts]
        max_tokens = body.max_tokens if "max_tokens" in body.model_fields_set else COMPLETIONS_DEFAULT_MAX_TOKENS
        score_only = bool(body.echo) and max_tokens == 0  # the scoring idiom: the prompt's log-probabilities only
        if score_only:
            max_tokens = 1  # the token the prefill samples anyway, left out of the answer
        echo = None
        if body.echo:  # the prompt as given (token-id prompts decoded), before each choice's text
            if body.stream and body.logprobs is not None:
                raise APIError(400, "echo with logprobs is not supported when streaming; send stream: false",
                               param="echo")
            echo = [p if isinstance(p, str) else self.engine.engine.tokenizer.decode(p) for p in prompts]
        return await self._serve(body, request, ids, max_tokens, "prompt", chat=False, echo=echo,
                                 score_only=score_only)

    async def chat(self, body: ChatCompletionRequest, request: Request):
        self._check_common(body)
        messages = [self.message_dict(i, m) for i, m in enumerate(body.messages)]
        ids = [await run_in_threadpool(self._encode_chat, messages)]
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        return await self._serve(body, request, ids, max_tokens, "messages", chat=True)

    # ---- request validation -----------------------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.aliases:
            raise APIError(404, f"model {model!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    def _check_common(self, body: _SamplingRequest) -> None:
        self.check_model(body.model)
        # Accepted by the schema but wrong together (OpenAI answers these with a 400 too).
        if body.stream_options is not None and not body.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options")
        if isinstance(body, ChatCompletionRequest):
            if body.tool_choice is not None and not body.tools:
                raise APIError(400, "tool_choice is only allowed when tools are specified", param="tool_choice")
            for i, m in enumerate(body.messages):
                if m.role == "user" and m.content is None:
                    raise APIError(400, f"messages[{i}]: a user message needs content", param=f"messages[{i}].content")
        check_unicode(body)
        bad = body.unsupported_fields()
        if bad:
            raise APIError(400, f"not supported by this server: {', '.join(bad)}", param=bad[0], code="unsupported")
        if body.method is not None and body.method != self.method:
            raise APIError(
                400, f"this server runs attention method {self.method!r} (one engine per server); the request asked "
                f"for {body.method!r}. Start a server with --method {body.method} for that.",
                param="method", code="method_mismatch",
            )
        if body.preset is not None and body.preset != self.preset:
            if self.preset:
                runs = f"preset {self.preset!r}"
            else:
                runs = "a custom configuration" if getattr(self.engine.engine.method, "config", None) else "no preset"
            raise APIError(400, f"this server runs method {self.method!r} with {runs} (one engine per server); the "
                           f"request asked for preset {body.preset!r}", param="preset", code="preset_mismatch")
        if isinstance(body, ChatCompletionRequest) and body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if not 1 <= body.n <= min(MAX_N, self.config.max_waiting_requests):
            raise APIError(400, f"n must be in [1, {min(MAX_N, self.config.max_waiting_requests)}], got {body.n}",
                           param="n")

    def _params(self, body: _SamplingRequest, max_tokens: int | None, choice: int,
                json_schema: str | None) -> SamplingParams:
        stop = body.stop if body.stop is not None else ()
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        if len(stop) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stop):
            raise APIError(400, f"at most {MAX_STOP} stop strings of at most {MAX_STOP_CHARS} characters", param="stop")
        seed = body.seed
        if seed is not None:
            if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
                raise APIError(400, f"seed must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}], got {seed}", param="seed")
            seed = (seed + choice) % 2**64  # independent choices, reproducible per choice
        if isinstance(body, ChatCompletionRequest):
            logprobs, prompt_logprobs = ((body.top_logprobs or 0) if body.logprobs else None), None
        else:
            logprobs = body.logprobs
            prompt_logprobs = body.logprobs if body.echo else None
        bad_ids = [t for t in body.stop_token_ids or () if not 0 <= t < self.vocab_size]
        if bad_ids:
            raise APIError(400, f"stop_token_ids must be token ids in [0, {self.vocab_size}), got {bad_ids[0]}",
                           param="stop_token_ids")
        # Fields the request leaves unset take the model's generation_config.json defaults (EngineConfig).
        defaults = self.engine.engine.sampling_defaults
        sampling = {name: getattr(body, name) for name in GENERATION_DEFAULTS if getattr(body, name) is not None}
        try:
            return SamplingParams(
                **{**defaults, **sampling}, max_tokens=max_tokens, seed=seed, stop=stop, ignore_eos=body.ignore_eos,
                logprobs=logprobs, prompt_logprobs=prompt_logprobs, stop_token_ids=tuple(body.stop_token_ids or ()),
                json_schema=json_schema,
            )
        except ValueError as exc:
            msg = str(exc)
            param = next((p for p in _PARAM_OF_MESSAGE if msg.startswith(p)), None)
            raise APIError(400, msg, param=param) from None

    def _json_schema(self, body: _SamplingRequest) -> str | None:
        """response_format -> the JSON schema text that constrains the output (None: free text), checked here so a
        schema that cannot constrain output is a 400 naming response_format."""
        fmt = body.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return json_object_schema()
        if not fmt.json_schema or not isinstance(fmt.json_schema.get("schema"), dict):
            raise APIError(400, "response_format json_schema needs json_schema.schema (an object)",
                           param="response_format")
        schema = json.dumps(fmt.json_schema["schema"])
        try:
            self.engine.engine.structured.grammar(schema)
        except ValueError as exc:
            raise APIError(400, f"response_format: {exc}", param="response_format") from None
        return schema

    def _completion_prompts(self, prompt) -> list[str | list[int]]:
        if isinstance(prompt, str):
            prompts = [prompt]
        elif prompt and all(isinstance(t, int) for t in prompt):
            prompts = [prompt]
        else:
            prompts = list(prompt)
        if not prompts:
            raise APIError(400, "prompt is empty", param="prompt")
        if len(prompts) > MAX_N:
            raise APIError(400, f"at most {MAX_N} prompts per request, got {len(prompts)}", param="prompt")
        for p in prompts:
            if isinstance(p, list) and any(not 0 <= t < self.vocab_size for t in p):
                raise APIError(400, f"token ids must be in [0, {self.vocab_size})", param="prompt")
        return prompts

    def _encode_prompt(self, prompt: str | list[int]) -> list[int]:
        return self.engine.engine.encode_prompt(prompt)

    @staticmethod
    def message_dict(i: int, m) -> dict[str, str]:
        if isinstance(m.content, list):
            parts = []
            for part in m.content:
                if part.type != "text":
                    raise APIError(400, f"messages[{i}]: only text content parts are supported, got {part.type!r}",
                                   param=f"messages[{i}].content")
                if not isinstance(part.text, str):
                    raise APIError(400, f"messages[{i}]: a content part of type 'text' needs a 'text' string",
                                   param=f"messages[{i}].content")
                parts.append(part.text)
            content = "\n".join(parts)
        else:
            content = m.content or ""
        return {"role": "system" if m.role == "developer" else m.role, "content": content}

    def _encode_chat(self, messages: list[dict]) -> list[int]:
        try:
            return self.engine.engine.encode_chat(messages)
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from None
        except Exception as exc:  # template errors (jinja raise_exception, odd role orders) are the request's
            raise APIError(400, f"could not apply the chat template: {exc}", param="messages") from None

    # ---- running ----------------------------------------------------------------------------------------
    async def _serve(self, body, request: Request, prompt_ids: list[list[int]], max_tokens, prompt_param: str, chat: bool,
                     echo: list[str] | None = None, score_only: bool = False):
        if len(prompt_ids) * body.n > self.config.max_waiting_requests:
            raise APIError(400, f"{len(prompt_ids)} prompts x n={body.n} sequences exceed the server's limit of "
                           f"{self.config.max_waiting_requests} queued sequences", param="n")
        json_schema = self._json_schema(body)  # checked once per request
        seqs = [(ids, self._params(body, max_tokens, i, json_schema)) for ids in prompt_ids for i in range(body.n)]
        try:
            stream = self.engine.submit(seqs, want_progress=body.stream and body.prefill_progress)
        except QueueFullError as exc:
            raise APIError(503, str(exc), code="queue_full", headers={"Retry-After": "5"}) from None
        except EngineUnavailableError as exc:
            raise APIError(503, str(exc), code="unavailable", headers={"Retry-After": "30"}) from None
        except ContextLengthError as exc:
            raise APIError(400, str(exc), param=prompt_param, code="context_length_exceeded") from None
        except ValueError as exc:
            raise APIError(400, str(exc), param=prompt_param) from None
        prompt_tokens = sum(len(ids) for ids in prompt_ids)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            echoes = None if echo is None else [e for e in echo for _ in range(body.n)]  # per choice
            gen = self._stream(stream, rid, chat, prompt_tokens, include_usage, echoes, body.n, score_only)
            return StreamingResponse(gen, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        choice_prompts = [ids for ids in prompt_ids for _ in range(body.n)]
        return await self._complete(stream, request, rid, chat, prompt_tokens, choice_prompts,
                                    None if echo is None else [e for e in echo for _ in range(body.n)], body.n,
                                    score_only)

    async def _complete(self, stream: RequestStream, request: Request, rid: str, chat: bool, prompt_tokens: int,
                        choice_prompts: list[list[int]], echo: list[str] | None, n: int = 1, score_only: bool = False):
        watcher = asyncio.create_task(self._abort_on_disconnect(request, stream))
        finals: dict[int, TokenEvent] = {}
        logprobs: dict[int, list] = {}
        try:
            while events := await stream.get():
                for ev in events:
                    if isinstance(ev, TokenEvent):
                        if ev.logprobs is not None:
                            logprobs.setdefault(ev.index, []).extend(ev.logprobs)
                        if ev.finish_reason:
                            finals[ev.index] = ev
        finally:
            watcher.cancel()
            stream.abort()  # no-op when finished; frees KV when the client went away or we were cancelled
        if stream.failure is not None:
            f = stream.failure
            raise APIError(f.status, f.message, code=f.code, type=f.type,
                           headers={"Retry-After": "30"} if f.status == 503 else None)
        if len(finals) < len(stream.prompt_lens):  # client disconnected: nobody reads this
            return JSONResponse(error_body("client disconnected", "invalid_request_error"), status_code=499)
        if score_only:  # max_tokens 0 with echo: the sampled token is not part of the answer
            finals = {i: dataclasses.replace(ev, final_text="", completion_tokens=0, finish_reason="length")
                      for i, ev in finals.items()}
            logprobs = {i: [] for i in logprobs}
        try:
            choices = self._choices(finals, logprobs, chat, choice_prompts, echo)
        except NonFiniteLogprobError as exc:
            raise APIError(500, str(exc), code="non_finite_logprobs", type="internal_error") from None
        completion_tokens = sum(ev.completion_tokens for ev in finals.values())
        cached = _cached_tokens({i: ev.cached_tokens for i, ev in finals.items()}, n)
        return JSONResponse({
            "id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": self.model_name, "choices": choices, "usage": _usage(prompt_tokens, completion_tokens, cached),
        })

    def _choices(self, finals: dict[int, TokenEvent], logprobs: dict[int, list], chat: bool,
                 choice_prompts: list[list[int]], echo: list[str] | None) -> list[dict]:
        choices, text = [], TokenText(self.engine.engine.tokenizer)
        for index in sorted(finals):
            ev = finals[index]
            lp = logprobs.get(index)
            if chat:
                choices.append({"index": index, "message": {"role": "assistant", "content": ev.final_text},
                                "logprobs": None if lp is None else chat_logprobs(lp, text),
                                "finish_reason": ev.finish_reason})
            else:
                if lp is not None and ev.prompt_logprobs is not None:  # echo: the prompt's tokens first
                    lp = completion_logprobs(lp, text, ev.prompt_logprobs, choice_prompts[index][0],
                                             echo[index] if echo else None)
                elif lp is not None:
                    lp = completion_logprobs(lp, text)
                choices.append({"index": index, "text": (echo[index] if echo else "") + ev.final_text,
                                "logprobs": lp, "finish_reason": ev.finish_reason})
        return choices

    @staticmethod
    async def _abort_on_disconnect(request: Request, stream: RequestStream) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                stream.abort()
                return

    async def _stream(self, stream: RequestStream, rid: str, chat: bool, prompt_tokens: int, include_usage: bool,
                      echo: list[str] | None = None, n: int = 1, score_only: bool = False) -> AsyncIterator[str]:
        created, obj = int(time.time()), "chat.completion.chunk" if chat else "text_completion"
        base = {"id": rid, "object": obj, "created": created, "model": self.model_name}
        extra = {"usage": None} if include_usage else {}

        token_text = TokenText(self.engine.engine.tokenizer)
        offsets: dict[int, int] = {}  # per choice: text_offset of its next token

        def chunk(index: int, text: str | None, finish_reason: str | None, role: bool = False, lp=None) -> str:
            if chat:
                delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
                logprobs = None if lp is None else chat_logprobs(lp, token_text)
                choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            else:
                logprobs = None
                if lp is not None:
                    logprobs = completion_logprobs(lp, token_text, start=offsets.get(index, 0))
                    offsets[index] = text_end(logprobs, token_text, lp)
                choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
            return _sse({**base, "choices": [choice], **extra})

        completion_tokens: dict[int, int] = {}
        cached: dict[int, int] = {}
        try:
            if chat:
                for index in range(len(stream.prompt_lens)):
                    yield chunk(index, None, None, role=True)
            elif echo:
                for index, prompt in enumerate(echo):
                    yield chunk(index, prompt, None)
            while True:
                events = await stream.get(timeout=self.config.keepalive_interval_s)
                if events is None:
                    yield ": keepalive\n\n"
                    continue
                if not events:
                    break
                for ev in events:
                    if isinstance(ev, TokenEvent):
                        cached[ev.index] = ev.cached_tokens
                        if score_only:  # max_tokens 0 with echo: the prompt only
                            completion_tokens[ev.index] = 0
                            if ev.finish_reason:
                                yield chunk(ev.index, None, "length")
                            continue
                        completion_tokens[ev.index] = ev.completion_tokens
                        lp = ev.logprobs or None  # the tokens since the last event (text may be held back)
                        if chat and ev.text and ev.finish_reason:
                            yield chunk(ev.index, ev.text, None, lp=lp)
                            yield chunk(ev.index, None, ev.finish_reason)
                        elif ev.text or ev.finish_reason or lp:
                            yield chunk(ev.index, ev.text, ev.finish_reason, lp=lp)
                    elif isinstance(ev, ProgressEvent):
                        progress = {"index": ev.index, "processed": ev.processed, "total": ev.total}
                        yield _sse({**base, "choices": [], "prefill_progress": progress, **extra})
                    elif isinstance(ev, ErrorEvent):
                        yield _sse(error_body(ev.message, ev.type, code=ev.code))
                        yield "data: [DONE]\n\n"
                        return
            if stream.closed:
                return
            if include_usage:
                yield _sse({**base, "choices": [], "usage": _usage(prompt_tokens, sum(completion_tokens.values()),
                                                                  _cached_tokens(cached, n))})
            yield "data: [DONE]\n\n"
        except NonFiniteLogprobError as exc:  # the request's error, stated; the stream stays valid JSON lines
            yield _sse(error_body(str(exc), "internal_error", code="non_finite_logprobs"))
            yield "data: [DONE]\n\n"
        finally:
            stream.abort()  # client disconnected (generator cancelled / closed) or done: frees KV if unfinished


def _cached_tokens(per_choice: dict[int, int], n: int) -> int:
    """Prompt tokens served from the prefix cache: each prompt's first choice (its n choices read one prompt)."""
    return sum(c for index, c in per_choice.items() if index % n == 0)


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}

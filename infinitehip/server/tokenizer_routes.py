"""vLLM's tokenizer routes, same request and response shapes: POST /tokenize (a prompt, or chat messages through
the chat template), POST /detokenize, GET /tokenizer_info (what a client needs to tokenize locally as we do;
lm-eval asks for it). Served at the root as vLLM does, and under /v1 too."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.engine.long_text import encode_long
from infinitehip.server.errors import APIError
from infinitehip.server.protocol import ChatMessage, check_unicode

_STRICT = ConfigDict(strict=True, extra="ignore")
MAX_DETOKENIZE = 1 << 20  # token ids per /detokenize request


class TokenizeRequest(BaseModel):
    model_config = _STRICT

    model: str | None = None
    prompt: str | None = Field(None, description="Text to tokenize (or send messages)")
    messages: list[ChatMessage] | None = Field(None, description="Chat messages, tokenized through the chat template")
    add_special_tokens: bool = Field(True, description="Prompt form: add the tokenizer's special tokens (BOS)")
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = _STRICT

    model: str | None = None
    tokens: list[int]


def tokenizer_router(engine: LLMEngine, check_model, message_dict) -> APIRouter:
    """check_model(name | None) raises for a model this server does not serve; message_dict(i, message) -> the
    {role, content} dict the chat path uses (the same validation as /v1/chat/completions)."""
    router = APIRouter()
    tokenizer = engine.tokenizer

    def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
        check_unicode(body)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "send exactly one of prompt or messages", param="prompt")
        if body.prompt is not None:
            ids = encode_long(tokenizer, body.prompt, body.add_special_tokens)  # the ids a completion would use
        else:
            try:
                ids = engine.encode_chat([message_dict(i, m) for i, m in enumerate(body.messages)])
            except ValueError as exc:
                raise APIError(400, str(exc), param="messages") from None
        strs = tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": engine.max_sequence_tokens, "tokens": ids, "token_strs": strs}

    def detokenize(body: DetokenizeRequest) -> dict[str, str]:
        check_model(body.model)
        if len(body.tokens) > MAX_DETOKENIZE:
            raise APIError(400, f"at most {MAX_DETOKENIZE} tokens per request", param="tokens")
        vocab = engine.model_config.vocab_size
        if any(not 0 <= t < vocab for t in body.tokens):
            raise APIError(400, f"token ids must be in [0, {vocab})", param="tokens")
        return {"prompt": tokenizer.decode(body.tokens)}

    def info() -> dict[str, Any]:
        special = {name: getattr(tokenizer, name, None) for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
        return {"tokenizer_class": type(tokenizer).__name__, "model_max_length": engine.max_context_tokens,
                "vocab_size": len(tokenizer), "chat_template": getattr(tokenizer, "chat_template", None),
                "add_bos_token": getattr(tokenizer, "add_bos_token", None), **special}

    for prefix in ("", "/v1"):
        @router.post(f"{prefix}/tokenize")
        async def tokenize_route(body: TokenizeRequest):
            return JSONResponse(await run_in_threadpool(tokenize, body))

        @router.post(f"{prefix}/detokenize")
        async def detokenize_route(body: DetokenizeRequest):
            return JSONResponse(await run_in_threadpool(detokenize, body))

        @router.get(f"{prefix}/tokenizer_info")
        async def info_route():
            return JSONResponse(info())

    return router

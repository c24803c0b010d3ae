"""OpenAI wire format: request and response models of /v1/completions, /v1/chat/completions, /v1/models.

Request models check types only (strictly); values are checked where the engine defines them (SamplingParams,
context limits) so that the messages match the offline API. Unknown fields are ignored, as OpenAI's
server does; fields we accept but cannot honour (penalties, logit_bias, suffix, tools, ...) are rejected with a
400 only when set to something other than their no-op value (see `unsupported_fields`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from infinitehip.server.errors import APIError

# ---- requests ---------------------------------------------------------------------------------------


# strict: no silent coercion ("16" is not an integer, 1 is not a boolean), as OpenAI's API does.
_STRICT = ConfigDict(strict=True, extra="ignore")


class StreamOptions(BaseModel):
    model_config = _STRICT

    include_usage: bool = False


class ResponseFormat(BaseModel):
    model_config = _STRICT

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = Field(None, description="{name, schema, strict}: the output matches `schema`")


class _SamplingRequest(BaseModel):
    model_config = _STRICT

    model: str | None = Field(None, description="Served model id (see /v1/models); omitted: the served model")
    max_tokens: int | None = Field(None, description="Completion token limit (None: what the context allows)")
    temperature: float | None = Field(None, description="0 = greedy; default 1")
    top_p: float | None = None
    seed: int | None = Field(None, description="Per-request seed; choice i uses seed + i")
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # Extensions (send with the openai client's `extra_body`).
    top_k: int | None = Field(None, description="Top-k filter (None: off)")
    min_p: float | None = Field(None, description="Drop tokens below min_p x the most likely one's probability")
    repetition_penalty: float | None = Field(None, description="> 1 discourages tokens of the prompt and output")
    stop_token_ids: list[int] | None = Field(None, description="Token ids that end generation")
    response_format: ResponseFormat | None = Field(None, description="json_object / json_schema: constrained output")
    ignore_eos: bool = False
    method: str | None = Field(None, description="Must equal the server's attention method (one engine per server)")
    preset: str | None = Field(None, description="Must equal the server's method preset")
    prefill_progress: bool = Field(False, description="Streaming: send `prefill_progress` chunks during prefill")

    def unsupported_fields(self) -> list[str]:
        bad = []
        if self.presence_penalty not in (None, 0, 0.0):
            bad.append("presence_penalty")
        if self.frequency_penalty not in (None, 0, 0.0):
            bad.append("frequency_penalty")
        if self.logit_bias:
            bad.append("logit_bias")
        return bad


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        ..., description="Text, token ids, or a list of either (one choice group per prompt)"
    )
    echo: bool = Field(False, description="Return the prompt before the completion (with logprobs: the prompt's too)")
    suffix: str | None = None
    logprobs: int | None = Field(None, description="Log-probabilities of each token with this many alternatives")
    best_of: int | None = None

    def unsupported_fields(self) -> list[str]:
        bad = super().unsupported_fields()
        if self.suffix:
            bad.append("suffix")
        if self.best_of not in (None, 1, self.n):
            bad.append("best_of")
        return bad


class ContentPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = _STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(None, description="Alias of max_tokens (takes precedence)")
    logprobs: bool | None = Field(None, description="Log-probabilities of the generated tokens")
    top_logprobs: int | None = Field(None, description="Alternatives per token (needs logprobs: true)")
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None

    def unsupported_fields(self) -> list[str]:
        bad = super().unsupported_fields()
        if self.tools:
            bad.append("tools")
        return bad


# ---- checks ------------------------------------------------------------------------------------------


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, BaseModel):
        return [s for name in type(value).model_fields for s in _strings(getattr(value, name))]
    return []


def check_unicode(body: BaseModel) -> None:
    """A lone surrogate (JSON allows "\\ud800") is not text: refuse it by name, before a tokenizer fails on it."""
    for text in _strings(body):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise APIError(400, "the request contains a lone UTF-16 surrogate, which is not valid Unicode text",
                           code="invalid_unicode") from None


# ---- responses (documentation of the wire format; handlers build the dicts directly) -------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens served from the prefix cache (not prefilled again)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: Literal["stop", "length"] | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: Literal["stop", "length"] | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class PrefillProgress(BaseModel):
    """Extra field of streamed chunks (with `prefill_progress: true`); such chunks have no choices."""

    index: int
    processed: int
    total: int


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "infinitehip"
    max_model_len: int
    method: str
    preset: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo

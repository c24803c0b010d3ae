"""Log-probabilities in OpenAI's wire formats: chat (`logprobs.content`) and legacy completions (`tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`; with echo, the prompt's tokens first, the first with null).
Token strings are each token decoded alone (as OpenAI and vLLM return them), with their UTF-8 bytes in chat.
A non-finite log-probability raises NonFiniteLogprobError: the caller answers with an error, never invalid JSON."""

from __future__ import annotations

import math
from typing import Any

from infinitehip.engine.logprobs import TokenLogprob


class NonFiniteLogprobError(ValueError):
    """The model gave a NaN or infinite log-probability (JSON has no such number): an error of the request."""


def _finite(entries: list[TokenLogprob]) -> list[TokenLogprob]:
    for e in entries:
        for token, logprob in ((e.token, e.logprob), *e.top):
            if not math.isfinite(logprob):
                raise NonFiniteLogprobError(
                    f"the model gave a non-finite log-probability ({logprob}) for token {token}: its logits are not "
                    "finite (damaged weights or KV cache?); the request was stopped")
    return entries


class TokenText:
    """Decodes single tokens once each (the top alternatives repeat across positions)."""

    def __init__(self, tokenizer):
        self.tokenizer, self._cache = tokenizer, {}
        self.special = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())  # not in a generated text

    def __call__(self, token: int) -> str:
        if token not in self._cache:
            self._cache[token] = self.tokenizer.decode([token])
        return self._cache[token]


def chat_logprobs(entries: list[TokenLogprob], text: TokenText) -> dict[str, Any]:
    def item(token: int, logprob: float) -> dict[str, Any]:
        s = text(token)
        return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8"))}

    content = [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in _finite(entries)]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[TokenLogprob], text: TokenText, prompt: list[TokenLogprob] | None = None,
                        first_prompt_token: int | None = None, prompt_text: str | None = None,
                        start: int = 0) -> dict[str, Any]:
    """Legacy completions format. With echo, `prompt` holds the prompt tokens after the first (first_prompt_token),
    which has no log-probability (nothing precedes it), and prompt_text the echoed prompt. `text_offset` is each
    token's position in the returned text (from `start`: a stream's earlier chunks): a generated special token
    (left out of the text) takes no room, a prompt's special token only where the echoed prompt shows it."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = start

    def add(token: int, logprob: float | None, alternatives: dict[str, float] | None, in_prompt: bool) -> None:
        nonlocal offset
        s = text(token)
        tokens.append(s)
        token_logprobs.append(logprob)
        top.append(alternatives)
        offsets.append(offset)
        if token not in text.special or (in_prompt and (prompt_text is None or prompt_text.startswith(s, offset))):
            offset += len(s)

    if first_prompt_token is not None:
        add(first_prompt_token, None, None, True)
    for e in _finite(prompt or []):
        add(e.token, e.logprob, {text(t): lp for t, lp in e.top}, True)
    if prompt_text is not None:
        offset = start + len(prompt_text)  # the completion's text follows the echoed prompt exactly
    for e in _finite(entries):
        add(e.token, e.logprob, {text(t): lp for t, lp in e.top}, False)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def text_end(logprobs: dict[str, Any], text: TokenText, entries: list[TokenLogprob]) -> int:
    """The offset after the last of `entries` (formatted into `logprobs` by completion_logprobs): where a stream's
    next chunk starts."""
    if not entries:
        return -1
    last = entries[-1].token
    return logprobs["text_offset"][-1] + (0 if last in text.special else len(text(last)))

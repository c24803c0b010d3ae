"""Log-probabilities in OpenAI's wire formats: chat (`logprobs.content`) and legacy completions (`tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`; with echo, the prompt's tokens first, the first with null).
Token strings are each token decoded alone (as OpenAI and vLLM return them), with their UTF-8 bytes in chat."""

from __future__ import annotations

from typing import Any

from infinitehip.engine.logprobs import TokenLogprob


class TokenText:
    """Decodes single tokens once each (the top alternatives repeat across positions)."""

    def __init__(self, tokenizer):
        self.tokenizer, self._cache = tokenizer, {}

    def __call__(self, token: int) -> str:
        if token not in self._cache:
            self._cache[token] = self.tokenizer.decode([token])
        return self._cache[token]


def chat_logprobs(entries: list[TokenLogprob], text: TokenText) -> dict[str, Any]:
    def item(token: int, logprob: float) -> dict[str, Any]:
        s = text(token)
        return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8"))}

    content = [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[TokenLogprob], text: TokenText, prompt: list[TokenLogprob] | None = None,
                        first_prompt_token: int | None = None) -> dict[str, Any]:
    """Legacy completions format. With echo, `prompt` holds the prompt tokens after the first (first_prompt_token),
    which has no log-probability (nothing precedes it)."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = 0

    def add(token: int, logprob: float | None, alternatives: dict[str, float] | None) -> None:
        nonlocal offset
        s = text(token)
        tokens.append(s)
        token_logprobs.append(logprob)
        top.append(alternatives)
        offsets.append(offset)
        offset += len(s)

    if first_prompt_token is not None:
        add(first_prompt_token, None, None)
    for e in (prompt or []) + entries:
        add(e.token, e.logprob, {text(t): lp for t, lp in e.top})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}

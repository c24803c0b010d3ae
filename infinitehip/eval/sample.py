"""Shared types and token-counting helpers for the synthetic eval tasks.

An :class:`EvalSample` is one fully built prompt (as chat messages; the engine
applies the tokenizer's chat template) plus everything needed to score the
model's reply.  Builders live in :mod:`infinitehip.eval.passkey` and
:mod:`infinitehip.eval.niah`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from infinitehip.engine.prompt_format import chat_prompt_ids, has_chat_template

__all__ = [
    "EvalSample",
    "completion_suffix",
    "encode_len",
    "fit_to_length",
    "length_tolerance",
    "prompt_length",
    "prompt_token_ids",
    "user_message",
    "validate_request",
]

_WS = re.compile(r"\s+")


def _normalise(text: str) -> str:
    return _WS.sub(" ", text).strip().lower()


@dataclass(frozen=True)
class EvalSample:
    task: str  # "passkey" | "niah"
    messages: list[dict]  # [{"role": "user", "content": ...}]
    answer: str  # expected answer string
    context_tokens: int  # requested length (tokens) of the whole templated prompt
    depth: float  # 0..1, where the needle sits in the haystack
    seed: int
    prompt_tokens: int  # length the builder measured/predicted for the templated prompt
    key_phrase: str = ""  # niah: the fact that must appear in the reply (default: answer)

    def is_correct(self, output_text: str) -> bool:
        if output_text is None:
            return False
        if self.task == "passkey":
            return re.search(rf"\b{re.escape(self.answer)}\b", output_text) is not None
        key = _normalise(self.key_phrase or self.answer)
        return bool(key) and key in _normalise(output_text)


def length_tolerance(context_tokens: int) -> int:
    """Allowed |actual - requested| prompt length: 1% or 16 tokens, whichever is larger."""
    return max(16, math.ceil(0.01 * context_tokens))


def validate_request(context_tokens: int, depth: float) -> None:
    if int(context_tokens) != context_tokens or context_tokens <= 0:
        raise ValueError(f"context_tokens must be a positive int, got {context_tokens!r}")
    if not 0.0 <= float(depth) <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth!r}")


def encode_len(tokenizer: Any, text: str) -> int:
    """Number of tokens of ``text`` without special tokens."""
    return len(tokenizer.encode(text, add_special_tokens=False))


def _as_ids(out: Any) -> list[int]:
    # transformers >= 5 returns a BatchEncoding from apply_chat_template(tokenize=True);
    # older versions return a plain list.
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], list):  # batched shape [1, n]
        out = out[0]
    return list(out)


def prompt_token_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Token ids of the templated prompt exactly as the engine feeds it (engine/prompt_format.py)."""
    return chat_prompt_ids(tokenizer, messages)


def completion_suffix(tokenizer: Any, answer_prefix: str) -> str:
    """What a task appends after its question: nothing for a chat model; for a base model (no chat template) the
    completion form RULER uses for base models: "Answer:" and the answer's first words, which the model continues."""
    return "" if has_chat_template(tokenizer) else f"\nAnswer: {answer_prefix}"


def prompt_length(tokenizer: Any, messages: list[dict]) -> int:
    return len(prompt_token_ids(tokenizer, messages))


def user_message(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def fit_to_length(tokenizer: Any, context_tokens: int, n_hay: int, build: Any, rounds: int, large: int) -> tuple[int, str]:
    """Size a prompt: `build(n)` is the user content with n haystack tokens. Measure, correct the haystack by the
    overshoot and repeat up to `rounds` times (stop within 4 tokens, or within the tolerance above `large`
    tokens, where each measurement is costly) -> (measured templated length, content) of the closest try."""
    tol = length_tolerance(context_tokens)
    best: tuple[int, str] | None = None
    tried: set[int] = set()
    for _ in range(rounds):
        if n_hay in tried:
            break
        tried.add(n_hay)
        content = build(n_hay)
        actual = prompt_length(tokenizer, user_message(content))
        if best is None or abs(actual - context_tokens) < abs(best[0] - context_tokens):
            best = (actual, content)
        delta = actual - context_tokens
        if abs(delta) <= 4 or (abs(delta) <= tol and context_tokens > large):
            break
        n_hay = max(0, n_hay - delta)
    assert best is not None
    return best

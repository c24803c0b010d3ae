"""Chat messages -> prompt token ids, the one way the engine, the evals and the needle probe all use.

A tokenizer with a chat template renders the conversation with it (the template holds the special tokens).
A base model's tokenizer has none: the messages' contents, joined by blank lines, are the prompt, with the
tokenizer's own special tokens (BOS) added, as for a plain completion. Tasks written for both kinds of model
end their content in a completion form for base models (`eval/sample.completion_suffix`).
"""

from __future__ import annotations

from typing import Any

from infinitehip.engine.long_text import encode_long


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_text(tokenizer: Any, messages: list[dict]) -> tuple[str, bool]:
    """(prompt string, whether tokenizing it adds the tokenizer's special tokens)."""
    if not messages:
        raise ValueError("messages is empty")
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), False
    return "\n\n".join(m["content"] for m in messages), True


def chat_prompt_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    text, special = chat_text(tokenizer, messages)
    return encode_long(tokenizer, text, special)

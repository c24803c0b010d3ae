"""Where the needle sentences sit in the token ids the engine is fed.

The engine's needle probe (``LLM.chat(needle_tokens=...)``) takes positions in the chat-templated
prompt.  We find them from the templated string and a fast tokenizer's offset mapping, after
checking that this tokenization is exactly :func:`infinitehip.eval.sample.prompt_token_ids`;
otherwise a position could point at the wrong token, so we refuse.
"""

from __future__ import annotations

from typing import Any

from infinitehip.engine.prompt_format import chat_text
from infinitehip.eval.sample import prompt_token_ids

__all__ = ["needle_token_positions"]




def needle_token_positions(tokenizer: Any, messages: list[dict], texts: list[str] | tuple[str, ...]) -> list[int]:
    """Sorted positions of every prompt token overlapping any occurrence of any of ``texts``."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("needle_token_positions needs a fast tokenizer (offset mappings)")
    text, special = chat_text(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    expected = prompt_token_ids(tokenizer, messages)
    if ids != expected:
        first = next((i for i, (a, b) in enumerate(zip(ids, expected)) if a != b), min(len(ids), len(expected)))
        raise ValueError(f"tokenizing the templated prompt string ({len(ids)} tokens) differs from the engine's "
                         f"prompt ids ({len(expected)} tokens) from token {first}; needle positions would be wrong")
    spans: list[tuple[int, int]] = []
    for needle in texts:
        start = text.find(needle)
        if not needle or start < 0:
            raise ValueError(f"needle text not in the prompt: {needle[:60]!r}")
        while start >= 0:
            spans.append((start, start + len(needle)))
            start = text.find(needle, start + 1)
    spans.sort()
    positions = []
    for i, (a, b) in enumerate(offsets):
        if b > a and any(a < e and b > s for s, e in spans):
            positions.append(i)
    return positions

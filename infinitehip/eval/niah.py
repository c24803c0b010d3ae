"""Needle-in-a-haystack (NIAH) task over the Paul Graham essays.

A needle sentence (chosen deterministically from ``NEEDLES`` by ``seed``) is
inserted at the sentence boundary nearest to ``depth`` of an essay haystack
(:mod:`infinitehip.eval.haystack`), and the templated prompt is sized to
``context_tokens``: the haystack length is first estimated from the measured
prompt overhead, then corrected from one measurement of the full prompt.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from .haystack import haystack_split
from .sample import EvalSample, completion_suffix, fit_to_length, length_tolerance, prompt_length, user_message, validate_request

__all__ = ["NEEDLES", "Needle", "insert_needle", "make_niah_sample", "needle_for_seed"]


@dataclass(frozen=True)
class Needle:
    needle: str  # sentence hidden in the haystack
    question: str
    answer: str  # reference answer
    key_phrase: str  # what a correct reply must contain (case-insensitive)
    answer_prefix: str  # a base model's completion starts here (the question restated as a statement)


NEEDLES: tuple[Needle, ...] = (
    Needle(
        "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.",
        "What is the best thing to do in San Francisco?",
        "eat a sandwich and sit in Dolores Park on a sunny day",
        "dolores park",
        "The best thing to do in San Francisco is",
    ),
    Needle(
        "The secret ingredient in Grandma Rosa's famous tomato soup is a spoonful of smoked paprika.",
        "What is the secret ingredient in Grandma Rosa's famous tomato soup?",
        "a spoonful of smoked paprika",
        "paprika",
        "The secret ingredient in Grandma Rosa's famous tomato soup is",
    ),
    Needle(
        "The treasure of Captain Marlow is buried under the old lighthouse on Gull Island.",
        "Where is the treasure of Captain Marlow buried?",
        "under the old lighthouse on Gull Island",
        "gull island",
        "The treasure of Captain Marlow is buried",
    ),
    Needle(
        "The name of the cat that lives aboard the Orion space station is Biscuit.",
        "What is the name of the cat that lives aboard the Orion space station?",
        "Biscuit",
        "biscuit",
        "The name of the cat that lives aboard the Orion space station is",
    ),
    Needle(
        "The magic word that opens the door of the old village library is marmalade.",
        "What is the magic word that opens the door of the old village library?",
        "marmalade",
        "marmalade",
        "The magic word that opens the door of the old village library is",
    ),
)

TASK = (
    "There is an important fact hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will ask you a question about it."
)
QUESTION_SUFFIX = "Answer in one short sentence."

_SENT_END = re.compile(r"[.!?][\"')\]]*(?=\s)")
_SEARCH_WINDOW = 2000  # chars either side of the cut to look for a sentence end
_LARGE = 262_144  # above this, accept any length within tolerance (each measurement is costly)


def needle_for_seed(seed: int) -> Needle:
    return NEEDLES[random.Random(seed).randrange(len(NEEDLES))]


def insert_needle(before: str, after: str, needle: str) -> str:
    """Join ``before + after`` with ``needle`` at the sentence end nearest the join."""
    text = before + after
    cut = len(before)
    if not text:
        return needle
    if cut == 0:
        return f"{needle} {text}"
    if cut >= len(text):
        return f"{text} {needle}"
    lo, hi = max(0, cut - _SEARCH_WINDOW), min(len(text), cut + _SEARCH_WINDOW)
    ends = [m.end() for m in _SENT_END.finditer(text, lo, hi)]  # absolute positions
    if ends:
        j = min(ends, key=lambda e: (abs(e - cut), e))
    else:  # no sentence end nearby: fall back to the next whitespace
        j = cut
        while j < len(text) and not text[j].isspace():
            j += 1
    return f"{text[:j]} {needle}{text[j:]}"


def _content(haystack: str, question: str, suffix: str = "") -> str:
    return f"{TASK}\n\n{haystack}\n\n{question} {QUESTION_SUFFIX}{suffix}"


def make_niah_sample(tokenizer: Any, context_tokens: int, depth: float, seed: int) -> EvalSample:
    """Build a NIAH sample whose templated prompt is ~``context_tokens`` tokens long."""
    validate_request(context_tokens, depth)
    depth = float(depth)
    nd = needle_for_seed(seed)
    tol = length_tolerance(context_tokens)
    suffix = completion_suffix(tokenizer, nd.answer_prefix)
    base = prompt_length(tokenizer, user_message(_content(nd.needle, nd.question, suffix)))
    if context_tokens < base - tol:
        raise ValueError(f"context_tokens={context_tokens} is below the bare prompt length {base}")

    def build(n_hay: int) -> str:
        before, after = haystack_split(tokenizer, n_hay, round(depth * n_hay))
        return _content(insert_needle(before, after, nd.needle), nd.question, suffix)

    actual, content = fit_to_length(tokenizer, context_tokens, max(0, context_tokens - base), build, 3, _LARGE)

    return EvalSample(
        task="niah",
        messages=user_message(content),
        answer=nd.answer,
        context_tokens=int(context_tokens),
        depth=depth,
        seed=seed,
        key_phrase=nd.key_phrase,
        prompt_tokens=actual,
    )

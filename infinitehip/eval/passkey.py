"""Classic passkey retrieval task, sized to an exact templated-prompt length.

The haystack is the repeated filler "The grass is green. The sky is blue. ..."
split into sentences; the needle line "The pass key is NNNNN. Remember it. NNNNN
is the pass key." sits at a sentence boundary at ``depth`` of the filler.

Sizing never tokenizes the full prompt more than once.  The filler is a cycle
of five sentences that the tokenizer splits at word boundaries, so the token
count of a long run is additive: we measure each sentence once, measure a
small *skeleton* prompt (the real prompt with the interior of every filler run
removed) and add the removed sentences' counts back arithmetically.  For
prompts up to ``VERIFY_MAX_TOKENS`` the final prompt is tokenized once more to
verify (and correct) the prediction; above that the prediction is trusted, so
a 1M-token sample builds in well under a second.
"""

from __future__ import annotations

import random
from typing import Any

from .sample import (
    EvalSample,
    completion_suffix,
    encode_len,
    length_tolerance,
    prompt_length,
    user_message,
    validate_request,
)

__all__ = ["FILLER_SENTENCES", "VERIFY_MAX_TOKENS", "make_passkey_sample", "passkey_for_seed"]

FILLER_SENTENCES = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)
TASK = (
    "There is an important pass key hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about the pass key."
)
QUESTION = "What is the pass key? Answer with the 5-digit number only."
NEEDLE_TEMPLATE = "The pass key is {key}. Remember it. {key} is the pass key."

VERIFY_MAX_TOKENS = 262_144
_EDGE = 5  # sentences kept verbatim at each end of a filler run in the skeleton
_CYCLE = len(FILLER_SENTENCES)


def passkey_for_seed(seed: int) -> str:
    """The 5-digit pass key used for ``seed`` (independent of length/depth)."""
    return str(random.Random(seed).randint(10000, 99999))


class _FillerCost:
    """Token cost of filler sentences in the interior of a run (prefix sums over the cycle)."""

    def __init__(self, tokenizer: Any) -> None:
        costs = [encode_len(tokenizer, " " + s) for s in FILLER_SENTENCES]
        self.prefix = [0]
        for c in costs:
            self.prefix.append(self.prefix[-1] + c)
        self.cycle = self.prefix[-1]

    def upto(self, n: int) -> int:
        """Cost of sentences 0..n-1."""
        return (n // _CYCLE) * self.cycle + self.prefix[n % _CYCLE]

    def cost(self, start: int, count: int) -> int:
        return self.upto(start + count) - self.upto(start) if count > 0 else 0

    def count_for(self, budget: float) -> int:
        """Sentence count n (from index 0) whose cost is nearest to ``budget``."""
        if budget <= 0:
            return 0
        n = _CYCLE * int(budget // self.cycle)
        while self.upto(n + 1) <= budget:
            n += 1
        return n + 1 if self.upto(n + 1) - budget < budget - self.upto(n) else n


def _sentences(indices) -> str:
    return " ".join(FILLER_SENTENCES[i % _CYCLE] for i in indices)


ANSWER_PREFIX = "The pass key is"  # base models continue it (completion form)


def _content(before: str, needle: str, after: str, suffix: str = "") -> str:
    body = " ".join(p for p in (before, needle, after) if p)
    return f"{TASK}\n\n{body}\n\n{QUESTION}{suffix}"


def _skeleton_run(start: int, count: int) -> tuple[list[int], int, int]:
    """Indices kept in the skeleton, plus (start, count) of the removed interior."""
    if count <= 2 * _EDGE:
        return list(range(start, start + count)), 0, 0
    kept = list(range(start, start + _EDGE)) + list(range(start + count - _EDGE, start + count))
    return kept, start + _EDGE, count - 2 * _EDGE


def _predict(tokenizer: Any, fc: _FillerCost, needle: str, a: int, b: int) -> int:
    kept_b, rs_b, rc_b = _skeleton_run(0, a)
    kept_a, rs_a, rc_a = _skeleton_run(a, b)
    skeleton = _content(_sentences(kept_b), needle, _sentences(kept_a), completion_suffix(tokenizer, ANSWER_PREFIX))
    return prompt_length(tokenizer, user_message(skeleton)) + fc.cost(rs_b, rc_b) + fc.cost(rs_a, rc_a)


def _plan(fc: _FillerCost, budget: float, depth: float) -> tuple[int, int]:
    n = fc.count_for(budget)
    a = min(n, fc.count_for(depth * fc.upto(n)))
    return a, n - a


def _fit(tokenizer, fc, needle, context_tokens, budget, depth):
    """Iterate plan -> predicted length until it stops improving. Returns (a, b, predicted)."""
    best = None
    seen = set()
    for _ in range(6):
        a, b = _plan(fc, budget, depth)
        if (a, b) in seen:
            break
        seen.add((a, b))
        n_tok = _predict(tokenizer, fc, needle, a, b)
        if best is None or abs(n_tok - context_tokens) < abs(best[2] - context_tokens):
            best = (a, b, n_tok)
        if n_tok == context_tokens:
            break
        budget -= n_tok - context_tokens
    return best


def make_passkey_sample(
    tokenizer: Any,
    context_tokens: int,
    depth: float,
    seed: int,
    *,
    verify: bool | None = None,
) -> EvalSample:
    """Build a passkey sample whose templated prompt is ~``context_tokens`` tokens long.

    ``verify`` (default: only when ``context_tokens <= VERIFY_MAX_TOKENS``) tokenizes the
    final prompt once to confirm the arithmetic prediction and corrects it if needed.
    """
    validate_request(context_tokens, depth)
    depth = float(depth)
    if verify is None:
        verify = context_tokens <= VERIFY_MAX_TOKENS
    key = passkey_for_seed(seed)
    needle = NEEDLE_TEMPLATE.format(key=key)
    fc = _FillerCost(tokenizer)
    suffix = completion_suffix(tokenizer, ANSWER_PREFIX)
    base = prompt_length(tokenizer, user_message(_content("", needle, "", suffix)))
    tol = length_tolerance(context_tokens)
    if context_tokens < base - tol:
        raise ValueError(f"context_tokens={context_tokens} is below the bare prompt length {base}")

    a, b, n_tok = _fit(tokenizer, fc, needle, context_tokens, context_tokens - base, depth)
    content = _content(_sentences(range(a)), needle, _sentences(range(a, a + b)), suffix)
    if verify:
        actual = prompt_length(tokenizer, user_message(content))
        if abs(actual - context_tokens) > tol:  # additivity broke for this tokenizer: correct once
            budget = (context_tokens - base) - (actual - context_tokens) + (n_tok - context_tokens)
            a, b, _ = _fit(tokenizer, fc, needle, context_tokens, budget, depth)
            content = _content(_sentences(range(a)), needle, _sentences(range(a, a + b)), suffix)
            actual = prompt_length(tokenizer, user_message(content))
        n_tok = actual

    return EvalSample(
        task="passkey",
        messages=user_message(content),
        answer=key,
        context_tokens=int(context_tokens),
        depth=depth,
        seed=seed,
        key_phrase=key,
        prompt_tokens=n_tok,
    )

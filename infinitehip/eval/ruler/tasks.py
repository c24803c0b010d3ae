"""RULER-style retrieval tasks (Hsieh et al., 2024) over a real-prose haystack, sized in tokens.

Every task hides "The secret <kind> for the <key> is <value>." sentences at sentence boundaries
of a haystack and asks for the value(s) of one or more keys; the question repeats the key.

- ``niah_single_{word,number,uuid}``: one needle, one value of that kind;
- ``niah_multikey``: the target plus 3 distractor needles with other keys and values;
- ``niah_multivalue``: 4 needles with the same key, all 4 values must be named;
- ``niah_multiquery``: 4 keys, one needle each, all asked at once;
- ``vt_chain``, ``niah_paraphrase``, ``niah_two_part``: variable tracking (multi-hop), a key phrased unlike the
  question, two halves of one answer (:mod:`infinitehip.eval.ruler.plans`).

The target needle sits at ``depth``; the others at seed-drawn depths at least 0.05 away. The
templated prompt is sized like :func:`infinitehip.eval.niah.make_niah_sample`: estimate the
haystack from the prompt without it, build, measure once and correct (at most two full
tokenizations above 256K tokens, where any length within tolerance is accepted).
A reply scores the share of expected values it contains (case-insensitive substring); the
sample counts as correct only when all are there.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from infinitehip.eval.niah import insert_needle
from infinitehip.eval.sample import (
    completion_suffix, fit_to_length, length_tolerance, prompt_length, user_message, validate_request,
)

from .haystacks import get_haystack
from .needles import KINDS, draw_keys, draw_values, needle_sentence, spread_depths
from .plans import Plan, chain_plan, paraphrase_plan, two_part_plan

__all__ = ["TASKS", "RulerSample", "TaskSpec", "make_ruler_sample"]


@dataclass(frozen=True)
class TaskSpec:
    kind: str  # value kind: word | number | uuid
    queries: int = 1  # keys asked
    values_per_key: int = 1  # needles sharing the asked key (multivalue)
    distractors: int = 0  # needles with other keys, not asked
    answer_tokens: int = 32  # max_tokens of the reply
    form: str = "niah"  # niah: key-value needles (above); chain / paraphrase / two_part: plans.py


TASKS: dict[str, TaskSpec] = {
    "niah_single_word": TaskSpec("word"),
    "niah_single_number": TaskSpec("number"),
    "niah_single_uuid": TaskSpec("uuid", answer_tokens=48),
    "niah_multikey": TaskSpec("number", distractors=3),
    "niah_multivalue": TaskSpec("number", values_per_key=4, answer_tokens=64),
    "niah_multiquery": TaskSpec("number", queries=4, answer_tokens=64),
    "vt_chain": TaskSpec("number", answer_tokens=48, form="chain"),
    "niah_paraphrase": TaskSpec("word", form="paraphrase"),
    "niah_two_part": TaskSpec("number", answer_tokens=48, form="two_part"),
}
_FORMS = {"chain": chain_plan, "paraphrase": paraphrase_plan, "two_part": two_part_plan}

_LARGE = 262_144  # above this, accept any length within tolerance (each measurement is costly)
_LINE_WINDOW = 2000  # chars either side of a cut to look for a line break


@dataclass(frozen=True)
class RulerSample:
    task: str
    haystack: str
    messages: list[dict]
    expected: tuple[str, ...]  # values a correct reply must contain
    context_tokens: int  # requested templated prompt length
    depth: float  # of the (first) target needle
    seed: int
    prompt_tokens: int  # measured templated prompt length
    needle_texts: tuple[str, ...]  # inserted sentences holding the asked values
    distractor_texts: tuple[str, ...] = ()  # inserted sentences holding other values
    needle_depths: tuple[float, ...] = field(default=())  # depth of each needle_texts entry
    haystack_start: float = 0.0  # where in the corpus the haystack begins (fraction; 0: its first token)
    haystack_span: int = 0  # corpus tokens repeated to fill the haystack (0: the whole corpus)

    def score(self, output: str | None) -> float:
        """Share of expected values in ``output`` (case-insensitive substring)."""
        if not output or not self.expected:
            return 0.0
        low = output.lower()
        return sum(v.lower() in low for v in self.expected) / len(self.expected)

    def is_correct(self, output: str | None) -> bool:
        return self.score(output) == 1.0


def _plan(task: str, depth: float, seed: int) -> Plan:
    spec = TASKS[task]
    if spec.form != "niah":
        return _FORMS[spec.form](depth, seed)
    rng = random.Random(seed)
    kind = KINDS[spec.kind]
    keys = draw_keys(rng, spec.queries + spec.distractors)
    n_values = spec.queries * spec.values_per_key + spec.distractors
    values = draw_values(rng, spec.kind, n_values)
    asked = keys[: spec.queries]
    targets: list[tuple[str, str]] = []  # (key, value) of every needle holding an asked value
    for i, key in enumerate(asked):
        targets += [(key, v) for v in values[i * spec.values_per_key:(i + 1) * spec.values_per_key]]
    others = list(zip(keys[spec.queries:], values[len(targets):]))
    one_of = spec.values_per_key > 1
    needle_texts = [needle_sentence(k, v, spec.kind, one_of) for k, v in targets]
    distractor_texts = [needle_sentence(k, v, spec.kind) for k, v in others]
    depths = [depth] + spread_depths(rng, depth, len(needle_texts) + len(distractor_texts) - 1)
    placed = list(zip(depths, needle_texts + distractor_texts))

    if spec.values_per_key > 1:
        question = (f"What are all the secret {kind.plural} for the {asked[0]}? "
                    f"There are {spec.values_per_key} of them; list every one.")
        prefix = f"The secret {kind.plural} for the {asked[0]} are:"
    elif spec.queries > 1:
        names = ", ".join(f"the {k}" for k in asked[:-1]) + f" and the {asked[-1]}"
        question = f"What are the secret {kind.plural} for {names}? Give the {kind.singular} of each."
        prefix = f"The secret {kind.plural} for {names} are:"
    else:
        question = f"What is the secret {kind.singular} for the {asked[0]}? Answer with the {kind.singular} only."
        prefix = f"The secret {kind.singular} for the {asked[0]} is"
    instruction = (f"Some secret {kind.plural} are hidden inside the long text below. "
                   "Find and memorize them; a question about them follows the text.")
    return Plan(instruction, question, placed, tuple(v for _, v in targets), tuple(needle_texts),
                 tuple(depths[: len(needle_texts)]), tuple(distractor_texts), prefix)


def _content(plan: Plan, haystack: str, suffix: str = "") -> str:
    return f"{plan.instruction}\n\n{haystack}\n\n{plan.question}{suffix}"


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _at_line(before: str, after: str, needle: str) -> str:
    """Join ``before + after`` with ``needle`` as a line of its own at the line break nearest the join (code and
    records); no line break within reach: at a sentence end (`insert_needle`)."""
    text, cut = before + after, len(before)
    lo, hi = max(0, cut - _LINE_WINDOW), min(len(text), cut + _LINE_WINDOW)
    breaks = [i + 1 for i in range(lo, hi) if text[i] == "\n"]
    if not breaks:
        return insert_needle(before, after, needle)
    j = min(breaks, key=lambda b: (abs(b - cut), b))
    return f"{text[:j]}{needle}\n{text[j:]}"


def _with_needles(tokenizer: Any, ids: list[int], placed: list[tuple[float, str]], boundary: str = "sentence") -> str:
    """Haystack ids cut at each needle's depth, decoded piecewise, each needle joined in at a sentence end (or a
    line break: `Haystack.boundary`)."""
    join = _at_line if boundary == "line" else insert_needle
    order = sorted(placed, key=lambda p: p[0])
    cuts = [round(d * len(ids)) for d, _ in order]
    bounds = [0] + cuts + [len(ids)]
    pieces = [_decode(tokenizer, ids[a:b]) for a, b in zip(bounds, bounds[1:])]
    text = pieces[0]
    for (_, sentence), piece in zip(order, pieces[1:]):
        text = join(text, piece, sentence)
    return text


def haystack_start(seed: int) -> float:
    """The corpus fraction a seed's haystack begins at (`RulerConfig.vary_haystack`): with one fixed start, every
    seed's needle at one depth and length lands in the same text, so seeds would vary the needle but never its
    surroundings."""
    return random.Random(f"haystack-start-{seed}").random()


def make_ruler_sample(tokenizer: Any, task: str, haystack: str, context_tokens: int, depth: float,
                      seed: int, vary_haystack: bool = False, haystack_span: int = 0,
                      haystack_dir: str | None = None) -> RulerSample:
    """One sample whose chat-templated prompt is ~``context_tokens`` tokens long; ``vary_haystack``: the haystack
    begins at a seed-drawn point of the corpus (`haystack_start`) instead of its first token; ``haystack_span``:
    only that many corpus tokens, repeated (`Haystack.token_ids`); ``haystack_dir``: exported texts instead of the
    installed packages (`get_haystack`)."""
    if task not in TASKS:
        raise ValueError(f"unknown RULER task {task!r}; available: {', '.join(TASKS)}")
    validate_request(context_tokens, depth)
    hay = get_haystack(haystack, haystack_dir)
    depth = float(depth)
    plan = _plan(task, depth, seed)
    tol = length_tolerance(context_tokens)
    bare = " ".join(s for _, s in plan.placed)
    suffix = completion_suffix(tokenizer, plan.answer_prefix)
    base = prompt_length(tokenizer, user_message(_content(plan, bare, suffix)))
    if context_tokens < base - tol:
        raise ValueError(f"context_tokens={context_tokens} is below the bare {task} prompt length {base}")

    start = haystack_start(seed) if vary_haystack else 0.0

    def build(n_hay: int) -> str:
        ids = hay.token_ids(tokenizer, n_hay, start, haystack_span)
        return _content(plan, _with_needles(tokenizer, ids, plan.placed, hay.boundary), suffix)

    rounds = 3 if context_tokens <= _LARGE else 2  # at most two full tokenizations of a long prompt
    actual, content = fit_to_length(tokenizer, context_tokens, max(0, context_tokens - base), build, rounds, _LARGE)
    return RulerSample(task, haystack, user_message(content), plan.expected, int(context_tokens), depth, seed,
                       actual, plan.needle_texts, plan.distractor_texts, plan.needle_depths, start, haystack_span)

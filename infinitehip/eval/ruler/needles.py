"""Keys, values and the sentences that carry them, all drawn from one ``random.Random(seed)``.

A key is a two-word name ("the silver harbor"); a value is a word-number code ("amber-4721"),
a 7-digit number or a UUID-shaped hex string.  The word lists are our own; only the idea of
random key/value needles comes from RULER (Hsieh et al., 2024).
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

__all__ = ["KINDS", "ValueKind", "draw_keys", "draw_values", "needle_sentence", "spread_depths"]

_ADJECTIVES = (
    "silver", "quiet", "crimson", "hollow", "northern", "amber", "frozen", "golden", "hidden", "ancient",
    "copper", "velvet", "distant", "broken", "gentle", "iron", "lunar", "misty", "narrow", "painted",
    "restless", "scarlet", "shallow", "sleeping", "stone", "sunken", "tidal", "wooden", "woven", "yellow",
)
_NOUNS = (
    "harbor", "archive", "lantern", "orchard", "bridge", "canal", "cellar", "chapel", "citadel", "compass",
    "corridor", "fountain", "garden", "glacier", "granary", "island", "kettle", "lighthouse", "meadow", "mill",
    "observatory", "pavilion", "quarry", "river", "saddle", "tower", "tunnel", "valley", "vineyard", "workshop",
)
_CODE_WORDS = (
    "amber", "basil", "cobalt", "dune", "ember", "falcon", "garnet", "hazel", "indigo", "juniper",
    "kestrel", "lotus", "maple", "nectar", "onyx", "pepper", "quartz", "raven", "saffron", "thistle",
    "umber", "violet", "walnut", "willow", "zephyr", "cedar", "coral", "fennel", "marble", "olive",
)


@dataclass(frozen=True)
class ValueKind:
    singular: str  # "code word"
    plural: str  # "code words"


KINDS = {
    "word": ValueKind("code word", "code words"),
    "number": ValueKind("number", "numbers"),
    "uuid": ValueKind("identifier", "identifiers"),
}


def _value(rng: random.Random, kind: str) -> str:
    if kind == "word":
        return f"{rng.choice(_CODE_WORDS)}-{rng.randint(1000, 9999)}"
    if kind == "number":
        return str(rng.randint(1_000_000, 9_999_999))
    if kind == "uuid":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown value kind {kind!r}; available: {', '.join(KINDS)}")


def draw_keys(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct two-word keys."""
    keys: list[str] = []
    while len(keys) < n:
        key = f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
        if key not in keys:
            keys.append(key)
    return keys


def draw_values(rng: random.Random, kind: str, n: int) -> list[str]:
    """``n`` distinct values, none a substring of another (so substring scoring cannot confuse them)."""
    values: list[str] = []
    while len(values) < n:
        v = _value(rng, kind)
        if not any(v in w or w in v for w in values):
            values.append(v)
    return values


def needle_sentence(key: str, value: str, kind: str, one_of: bool = False) -> str:
    """The inserted sentence; ``one_of`` phrases it as one of several values of the key (multivalue)."""
    k = KINDS[kind]
    if one_of:
        return f"One of the secret {k.plural} for the {key} is {value}."
    return f"The secret {k.singular} for the {key} is {value}."


def spread_depths(rng: random.Random, target: float, n: int, min_gap: float = 0.05) -> list[float]:
    """``n`` depths in [0.02, 0.98] for the other needles, each ``min_gap`` away from the target and each other.

    Deterministic given the rng state; falls back to a smaller gap when the interval is too crowded.
    """
    placed = [target]
    out: list[float] = []
    gap = min_gap
    tries = 0
    while len(out) < n:
        d = round(rng.uniform(0.02, 0.98), 4)
        if all(abs(d - p) >= gap for p in placed):
            placed.append(d)
            out.append(d)
        tries += 1
        if tries % 200 == 0:
            gap /= 2
    return out

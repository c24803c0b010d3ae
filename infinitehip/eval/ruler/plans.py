"""What a RULER sample hides and asks (`Plan`), and the plans of the tasks beyond key-value retrieval:

- ``vt_chain`` (RULER's variable tracking): ``VAR ABCDE = 12345.`` then hops ``VAR FGHIJ = VAR ABCDE.`` in text
  order; the question asks for every variable that holds the value, so every hop must be found (multi-hop);
- ``niah_paraphrase``: the needle names its key in other words than the question (no shared content word
  besides "secret code word"), so a lexical match of the question does not find it;
- ``niah_two_part``: two needles, each half of one code; the answer must name both halves.

The phrasings and word lists are our own; only the task ideas come from RULER (Hsieh et al., 2024).
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from .needles import draw_keys, draw_values, spread_depths

__all__ = ["Plan", "chain_plan", "paraphrase_plan", "two_part_plan"]


@dataclass(frozen=True)
class Plan:
    instruction: str
    question: str
    placed: list[tuple[float, str]]  # (depth, sentence) for every needle
    expected: tuple[str, ...]
    needle_texts: tuple[str, ...]
    needle_depths: tuple[float, ...]
    distractor_texts: tuple[str, ...]
    answer_prefix: str  # a base model's completion starts here (eval/sample.completion_suffix)


# (how the needle names the key, how the question names it): the same thing, no shared content word
_PARAPHRASES = (
    ("opens the blue door of the old museum", "unlocks the azure entrance of the ancient gallery"),
    ("the night guard at the harbor uses", "the watchman of the port relies on after dark"),
    ("starts the engine of the red boat", "powers up the motor of the scarlet vessel"),
    ("the baker on the hill writes on his flour sacks", "is printed on the bags of the bread maker up the slope"),
    ("lets a visitor into the king's library", "grants entry to the royal reading room"),
    ("the captain shouts when the storm begins", "is called out by the ship's commander as bad weather arrives"),
    ("unlocks the iron chest in the cellar", "opens the metal trunk kept underground"),
    ("the twins use to greet each other", "a pair of siblings born together say as a hello"),
    ("switches off the alarm of the bank", "silences the warning siren at the lender's office"),
    ("the gardener hides under the largest rose", "is buried beneath the biggest flower by the groundskeeper"),
    ("opens the gate of the northern farm", "unbars the entry to the upland ranch"),
    ("the pilot reads before every takeoff", "an aviator checks prior to each departure"),
    ("the teacher writes on the first day of school", "is put on the board by the instructor when term opens"),
    ("the miners shout at the bottom of the shaft", "workers cry out deep down in the pit"),
    ("lets trains pass the mountain tunnel", "clears locomotives through the passage beneath the peak"),
    ("the doctor keeps in her top drawer", "the physician stores in the highest compartment of her desk"),
)
_VAR_LETTERS = string.ascii_uppercase


def _var_names(rng: random.Random, n: int) -> list[str]:
    names: list[str] = []
    while len(names) < n:
        name = "".join(rng.choice(_VAR_LETTERS) for _ in range(5))
        if name not in names:
            names.append(name)
    return names


def chain_plan(depth: float, seed: int, hops: int = 4) -> Plan:
    """One value passed along `hops` assignments; the first needle at `depth`, the hops after it in text order."""
    rng = random.Random(seed)
    names = _var_names(rng, hops + 1)
    value = str(rng.randint(10_000, 99_999))
    later = sorted(d for d in spread_depths(rng, depth, hops) if d > depth)
    while len(later) < hops:  # a target late in the text leaves little room after it: hops closer together
        later.append(round(min(0.999, (later[-1] if later else depth) + (1.0 - depth) / (hops + 1)), 4))
    depths = [depth] + sorted(later)[:hops]
    sentences = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i + 1]} = VAR {names[i]}." for i in range(hops)]
    instruction = ("Memorize and track the chain of variable assignments hidden in the following text; a question "
                   "about them follows the text.")
    question = f"Find all variables that are assigned the value {value} in the text above."
    prefix = (f"According to the chain of variable assignments in the text above, {hops + 1} variables "
              f"are assigned the value {value}, they are:")
    return Plan(instruction, question, list(zip(depths, sentences)), tuple(names), tuple(sentences), tuple(depths),
                (), prefix)


def paraphrase_plan(depth: float, seed: int) -> Plan:
    rng = random.Random(seed)
    needle_key, asked_key = rng.choice(_PARAPHRASES)
    (value,) = draw_values(rng, "word", 1)
    sentence = f"The secret code word that {needle_key} is {value}."
    instruction = ("A secret code word is hidden inside the long text below. Find and memorize it; a question "
                   "about it follows the text, and it may describe the code word in other words.")
    question = f"What is the secret code word that {asked_key}? Answer with the code word only."
    prefix = f"The secret code word that {asked_key} is"
    return Plan(instruction, question, [(depth, sentence)], (value,), (sentence,), (depth,), (), prefix)


def two_part_plan(depth: float, seed: int) -> Plan:
    rng = random.Random(seed)
    (key,) = draw_keys(rng, 1)
    first, second = draw_values(rng, "number", 2)
    other = spread_depths(rng, depth, 1)[0]
    d1, d2 = sorted((depth, other))
    s1 = f"The first half of the secret code for the {key} is {first}."
    s2 = f"The second half of the secret code for the {key} is {second}."
    instruction = ("A secret code is hidden inside the long text below in two halves. Find and memorize both; "
                   "a question about the code follows the text.")
    question = (f"What is the whole secret code for the {key}? Give its first half and then its second half.")
    prefix = f"The whole secret code for the {key} is"
    placed = [(d1, s1), (d2, s2)]
    return Plan(instruction, question, placed, (first, second), (s1, s2), (d1, d2), (), prefix)

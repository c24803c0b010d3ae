"""Haystack genres beyond prose (their texts, the tuning / held-out split, exported copies for another machine),
the held-out protocol of bench/pick_setting.py, and the tasks beyond key-value retrieval (variable tracking, a
paraphrased key, a two-part answer)."""

from __future__ import annotations

import gzip
import json
import sys

import pytest

from bench import pick_setting
from infinitehip.eval.ruler import corpora
from infinitehip.eval.ruler.haystacks import HAYSTACKS, HELD_OUT, TUNING, genre_text, get_haystack
from infinitehip.eval.ruler.tasks import TASKS, make_ruler_sample
from infinitehip.eval.sample import length_tolerance, prompt_length

# dictionary: a Debian package (dict-gcide: .ci/run installs it); without it its cases skip, naming it
HAS_GCIDE = (corpora.DICTD / "gcide.dict.dz").is_file()
NEEDS_GCIDE = pytest.mark.skipif(not HAS_GCIDE, reason="haystack 'dictionary' needs Debian's dict-gcide")
NEW_GENRES = ("licenses", "code", "shakespeare", "cmudict", "catalogs", "apispecs", "tables",
              pytest.param("dictionary", marks=NEEDS_GCIDE))


@pytest.fixture(scope="module")
def tok(tokenizer):
    return tokenizer


def test_split_covers_every_genre_once():
    assert set(TUNING) | set(HELD_OUT) == set(HAYSTACKS) and not set(TUNING) & set(HELD_OUT)
    assert len(HAYSTACKS) >= 7 and len(HELD_OUT) >= 3
    assert {"sotu", "essays"} <= set(TUNING)  # the genres every earlier setting was chosen on
    assert len({h.genre for h in HAYSTACKS.values()}) == len(HAYSTACKS)
    # the rotation: cmudict and catalogs, reported for three settings and their misses read, are tuning now; two
    # genres no run has read took their place
    assert {"cmudict", "catalogs"} <= set(TUNING) and {"apispecs", "tables"} <= set(HELD_OUT)
    # apispecs, tables and shakespeare were counted for a diagnosis (the question split at a chunk boundary): a
    # genre no run has read joined them
    assert "dictionary" in HELD_OUT
    assert all(HAYSTACKS[n].boundary == "line"
               for n in ("code", "cmudict", "catalogs", "apispecs", "tables", "dictionary"))


@pytest.mark.parametrize("name", NEW_GENRES)
def test_genre_texts_are_long_real_and_read_without_import(name):
    text = genre_text(name)
    # > 4M characters: over 1M tokens of any tokenizer here, so a 1M-token prompt does not repeat its text
    assert corpora.MAX_CHARS * 0.5 < len(text) <= corpora.MAX_CHARS + 1_000_000
    assert text == genre_text(name)  # deterministic
    located = {"licensedcode", "shksprdata", "cmudict", "pycountry", "googleapiclient", "statsmodels"}
    assert located.isdisjoint(sys.modules)  # located, never imported
    markers = {"licenses": "WITHOUT WARRANTY", "code": "# file: sympy/", "shakespeare": "ACT I",
               "cmudict": "\nabandon AH0 B AE1 N D AH0 N\n", "catalogs": "# catalog: de/iso3166-1\n",
               "apispecs": "# document: abusiveexperiencereport.v1\n{\n\"basePath\"",
               "tables": "\n\n# table: randhie/src/randhie.csv\nplan,site,coins,",
               "dictionary": "\nAbdication \\Ab`di*ca\"tion\\, n. [L. abdicatio: cf. F.\n"}
    assert markers[name] in text
    if name == "licenses":
        assert "\nkey: " not in text[:5000]  # YAML headers dropped
    if name == "shakespeare":
        assert text.count("THE TRAGEDY OF KING LEAR") == 1  # one edition of each work
    if name == "apispecs":  # one version per API, its stable one; each document cut at a line break
        assert "# document: compute.v1\n" in text and "# document: compute.beta\n" not in text
        assert text.count("\n# document: ") >= 300 and text.count("\n# document: drive.") == 1
    if name == "tables":  # a raw src/ copy stands in for its processed twin; every other table once
        assert "# table: randhie/randhie.csv" not in text and text.count("# table: ") >= 30
        assert "# table: co2/co2.csv\ndate,co2\n" in text and "\r" not in text
    if name == "dictionary":  # from the first headword's entry (it opens with the dictionary's epigraph)
        assert "00-database" not in text and "GNU General Public License" not in text
        assert text.startswith("A dictionary containing a natural history") and text.endswith("[1913 Webster]")


def test_exported_texts_round_trip_and_refuse_damage(tmp_path, tok):
    corpora.export_corpus("pydoc", genre_text("pydoc"), tmp_path, "test")
    hay = get_haystack("pydoc", str(tmp_path))
    assert hay.token_ids(tok, 500, 0.3) == HAYSTACKS["pydoc"].token_ids(tok, 500, 0.3)
    with gzip.open(tmp_path / "pydoc.txt.gz", "wt", encoding="utf-8") as f:
        f.write(genre_text("pydoc").replace("the", "teh", 1))  # one changed word
    with pytest.raises(RuntimeError, match=r"pydoc\.txt\.gz does not match the sha256"):
        corpora.read_exported("pydoc", tmp_path)
    (tmp_path / "pydoc.txt.gz").write_bytes(b"not gzip")
    with pytest.raises(RuntimeError, match=r"cannot read .*pydoc\.txt\.gz"):
        corpora.read_exported("pydoc", tmp_path)
    with pytest.raises(RuntimeError, match="cannot read"):
        corpora.read_exported("sotu", tmp_path)  # not exported: no manifest entry


def _results(tmp_path, name, haystack, hits):
    path = tmp_path / f"{name}.json"
    samples = [{"haystack": haystack, "correct": i < hits} for i in range(10)]
    path.write_text(json.dumps({"samples": samples}))
    return str(path)


def test_pick_setting_chooses_on_tuning_genres_and_refuses_held_out(tmp_path):
    a = _results(tmp_path, "a", "licenses", 6)
    b = _results(tmp_path, "b", "sotu", 8)
    assert pick_setting.pick([f"a={a}=--x 1", f"b={b}=--x 2"]) == ("b", "--x 2")
    for genre in HELD_OUT:
        held = _results(tmp_path, "h", genre, 10)
        with pytest.raises(pick_setting.HeldOutError, match=f"held-out genre '{genre}'"):
            pick_setting.pick([f"a={a}=--x 1", f"h={held}=--x 3"])
    assert {"apispecs", "tables"} <= set(HELD_OUT)  # the loop above refused the new held-out genres
    for genre in ("cmudict", "catalogs"):  # tuning now; a file written while it was held-out stays refused
        tuned = _results(tmp_path, "t", genre, 9)
        assert pick_setting.pick([f"a={a}=--x 1", f"t={tuned}=--x 5"]) == ("t", "--x 5")
        old = tmp_path / "old.json"
        old.write_text(json.dumps({"samples": [{"haystack": genre, "split": "held-out", "correct": True}]}))
        with pytest.raises(pick_setting.HeldOutError, match=f"held-out genre '{genre}'"):
            pick_setting.pick([f"a={a}=--x 1", f"o={old}=--x 6"])
    unknown = _results(tmp_path, "u", "novels", 10)
    with pytest.raises(pick_setting.HeldOutError, match="no known genre"):
        pick_setting.pick([f"u={unknown}=--x 4"])


@pytest.mark.parametrize("haystack", ["essays", "cmudict", "code", "catalogs", "apispecs", "tables"])
def test_variable_tracking_hides_a_chain_in_text_order(tok, haystack):
    s = make_ruler_sample(tok, "vt_chain", haystack, 3000, 0.3, seed=11, vary_haystack=True)
    assert abs(prompt_length(tok, s.messages) - 3000) <= length_tolerance(3000)
    content = s.messages[0]["content"]
    positions = [content.index(t) for t in s.needle_texts]
    assert positions == sorted(positions) and len(s.expected) == 5  # the value, then 4 hops after it
    value = s.needle_texts[0].rsplit(" = ", 1)[1].rstrip(".")
    assert value in content.rsplit("\n\n", 1)[1]  # the question names the value, not the variables
    for prev, name, text in zip(s.expected, s.expected[1:], s.needle_texts[1:]):
        assert text == f"VAR {name} = VAR {prev}."
    assert s.is_correct(" ".join(s.expected)) and not s.is_correct(" ".join(s.expected[:-1]))
    if HAYSTACKS[haystack].boundary == "line":  # code and records: each needle a line of its own
        assert all(f"\n{t}\n" in content for t in s.needle_texts)


def test_paraphrased_key_shares_no_content_word_with_the_question(tok):
    stop = {"the", "a", "of", "to", "is", "that", "secret", "code", "word", "what", "answer", "with", "only", "at",
            "on", "in", "by", "when", "before", "every", "after", "up", "his", "her", "each", "into", "under"}
    for seed in range(12):
        s = make_ruler_sample(tok, "niah_paraphrase", "sotu" if seed % 2 else "licenses", 1500, 0.5, seed)
        question = s.messages[0]["content"].rsplit("\n\n", 1)[1]
        needle_words = {w.strip(".?,'").lower() for w in s.needle_texts[0].rsplit(" is ", 1)[0].split()} - stop
        question_words = {w.strip(".?,:'").lower() for w in question.split()} - stop
        assert needle_words and not needle_words & question_words, (needle_words & question_words)
        assert s.expected[0] in s.needle_texts[0] and s.expected[0] not in question


def test_two_part_answer_needs_both_needles(tok):
    s = make_ruler_sample(tok, "niah_two_part", "shakespeare", 2000, 0.7, seed=3)
    content = s.messages[0]["content"]
    assert len(s.needle_texts) == 2 and all(content.count(t) == 1 for t in s.needle_texts)
    assert "first half" in s.needle_texts[0] and "second half" in s.needle_texts[1]
    first, second = s.expected
    assert s.is_correct(f"{first}{second}") and s.is_correct(f"{first} and {second}")
    assert not s.is_correct(first) and s.score(first) == 0.5


def test_every_task_builds_on_every_new_genre(tok):
    for task, spec in TASKS.items():
        for haystack in [g for g in NEW_GENRES if isinstance(g, str)] + (["dictionary"] if HAS_GCIDE else []):
            s = make_ruler_sample(tok, task, haystack, 1200, 0.9, seed=2, vary_haystack=True)
            content = s.messages[0]["content"]
            assert all(content.count(t) == 1 for t in s.needle_texts + s.distractor_texts), (task, haystack)


def test_a_damaged_dictionary_database_is_an_error_naming_its_file(tmp_path, monkeypatch):
    monkeypatch.setattr(corpora, "DICTD", tmp_path)
    with pytest.raises(RuntimeError, match="needs Debian's dict-gcide"):
        corpora.load_dictionary.__wrapped__()
    body = b"\n\n  epigraph.\nabacus \\Ab\"a*cus\\, n.\n   A counting frame.\n   [1913 Webster]\n\nabaft adv.\n   Behind.\n"
    with gzip.open(tmp_path / "gcide.dict.dz", "wb") as f:
        f.write(b"00-database-info\n   about it\n" + body)
    (tmp_path / "gcide.index").write_text("00-database-info\tA\tc\nabacus\tc\tZ\n")  # offsets 0 and 28
    assert corpora.load_dictionary.__wrapped__().startswith("epigraph.\nabacus")
    (tmp_path / "gcide.index").write_text("abacus\tc\n")
    with pytest.raises(RuntimeError, match=r"gcide\.index: line 1 is not a dictd index line"):
        corpora.load_dictionary.__wrapped__()
    (tmp_path / "gcide.index").write_text("abacus\tzzzz\tZ\n")
    with pytest.raises(RuntimeError, match=r"gcide\.index names no entry inside .*gcide\.dict\.dz"):
        corpora.load_dictionary.__wrapped__()
    (tmp_path / "gcide.index").write_text("abacus\tc\tZ\n")
    (tmp_path / "gcide.dict.dz").write_bytes((tmp_path / "gcide.dict.dz").read_bytes()[:20])  # truncated
    with pytest.raises(RuntimeError, match=r"cannot read .*gcide\.dict\.dz"):
        corpora.load_dictionary.__wrapped__()

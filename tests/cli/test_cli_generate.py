"""`infinitehip generate` streams its answer as it is generated and, without --max-tokens, stops at a bounded
default (vLLM's); `LLM.stream` holds a stop string's start back; eval's result lines stay one line each."""

from __future__ import annotations

import io
import sys

import pytest
from rich.console import Console

from infinitehip import LLM, SamplingParams
from infinitehip.cli.generate import DEFAULT_MAX_TOKENS
from infinitehip.cli.main import main
from infinitehip.eval.runner import EvalConfig, run_eval

PROMPT = "Hello, my name is"


@pytest.fixture(scope="module")
def llm():
    return LLM(show_progress=False)


@pytest.fixture(scope="module")
def reference(llm):
    """The greedy answer to PROMPT with the generate command's default bound, from LLM.generate."""
    (out,) = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=DEFAULT_MAX_TOKENS))
    return out


class _Writes:
    """A stdout that keeps each write apart."""

    def __init__(self) -> None:
        self.pieces: list[str] = []

    def write(self, text: str) -> int:
        self.pieces.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_generate_without_max_tokens_streams_a_bounded_answer(reference, monkeypatch):
    out = _Writes()
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["generate", "--prompt", PROMPT, "--temperature", "0", "--show-progress", "false"]) == 0
    monkeypatch.undo()
    ref = reference
    assert ref.finish_reason == "length" and len(ref.token_ids) == DEFAULT_MAX_TOKENS  # the bound ended it
    assert "".join(out.pieces) == ref.text + "\n"
    assert len(out.pieces) - 1 >= DEFAULT_MAX_TOKENS // 2  # written as the tokens came, not once at the end


def test_stream_joins_to_the_final_text_and_never_sends_a_stop_string(llm, reference):
    stop = reference.text.split()[3]  # a word from the middle of the answer
    stopped = SamplingParams(temperature=0.0, max_tokens=DEFAULT_MAX_TOKENS, stop=(stop,))
    (ref,) = llm.generate(PROMPT, stopped)
    pieces = list(llm.stream(PROMPT, stopped))
    assert "".join(pieces) == ref.text and stop not in ref.text and len(pieces) > 1
    chat, params = [{"role": "user", "content": "Name three primes."}], SamplingParams(temperature=0.0, max_tokens=4)
    (ref,) = llm.chat(chat, params)
    assert "".join(llm.stream(chat, params)) == ref.text
    assert not llm.engine.has_work


def test_closing_a_stream_early_aborts_its_request(llm):
    pieces = llm.stream(PROMPT, SamplingParams(temperature=0.0, max_tokens=DEFAULT_MAX_TOKENS))
    next(pieces)
    pieces.close()
    assert not llm.engine.has_work


def test_eval_result_lines_stay_whole_on_a_narrow_terminal(llm):
    console = Console(file=io.StringIO(), width=40)  # a result line is longer than the terminal
    run_eval(llm, "passkey", EvalConfig(lengths=(256,), depths=(0.5,)), console)
    printed = console.file.getvalue().splitlines()
    (line,) = [line for line in printed if line.startswith("passkey len=256")]
    assert "expected" in line and " got " in line and line.endswith("s)"), printed

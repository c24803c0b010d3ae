"""What a newcomer sees first: `make demo` says what it does within seconds of its first run (a status line per
phase, the GGUF conversion with progress), `infinitehip --version`, and an unavailable device is one error line."""

from __future__ import annotations

import importlib.metadata
import queue
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from infinitehip.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
FIRST_LINE_SECONDS = 5  # the bound on a first run's silence


def demo_command() -> list[str]:
    """The command of the Makefile's `demo` recipe, with this interpreter as $(PY)."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    recipe = lines[next(i for i, line in enumerate(lines) if line.startswith("demo:")) + 1].strip()
    assert recipe.startswith("$(PY) "), recipe
    return [sys.executable, *shlex.split(recipe.removeprefix("$(PY) "))]


def _read_chunks(stream, out: queue.Queue) -> None:
    while chunk := stream.read1(1 << 16):
        out.put((time.perf_counter(), chunk.decode(errors="replace")))
    out.put((time.perf_counter(), None))


def test_demo_first_run_prints_a_status_line_per_phase_from_its_start(tmp_path):
    """The demo's command on a first run (an empty model cache: the embedded GGUF is converted): its first line
    comes within seconds, then the model's load, the conversion and the conversion's progress; stopped there."""
    start = time.perf_counter()
    proc = subprocess.Popen([*demo_command(), "--model-cache-dir", str(tmp_path / "models")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    chunks: queue.Queue = queue.Queue()
    threading.Thread(target=_read_chunks, args=(proc.stdout, chunks), daemon=True).start()
    text, first = "", None
    try:
        while "tensors:" not in text:  # the conversion's progress bar (tqdm: "tensors:  0%|")
            at, chunk = chunks.get(timeout=300)
            assert chunk is not None, f"the demo ended before converting the model:\n{text}"
            first = at if first is None else first
            text += chunk
    finally:
        proc.kill()
        proc.wait()
    assert first - start < FIRST_LINE_SECONDS, f"first output after {first - start:.1f} s"
    lines = text.splitlines()
    assert lines[0].startswith("infinitehip eval passkey: starting")
    phases = ["starting", "loading the embedded SmolLM2-135M-Instruct", "converting SmolLM2-135M-Instruct",
              "tensors:"]
    where = [text.index(p) for p in phases]
    assert where == sorted(where), text


def test_version_is_the_installed_package_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"infinitehip {importlib.metadata.version('infinitehip')}"


def test_an_unavailable_device_is_one_error_line_before_anything_loads(capsys):
    device = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"  # one past the GPUs here
    assert main(["generate", "--prompt", "hi", "--device", device]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"device {device!r} is not available" in errors[0], err
    assert "Traceback" not in err and not any(line.startswith("loading ") for line in err.splitlines())

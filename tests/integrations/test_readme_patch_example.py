"""The README's transformers `patch` example runs as written with the Hugging Face Hub unreachable (offline mode):
the model it loads is the embedded one, converted on this machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
# The example's prompt and answer lengths; the fast test shortens them to a 100-token prefill and its one token (on
# the CPU the whole example takes a minute or more: an 8.6K-token prefill, then 15 decode steps).
LONG_IDS = "ids = torch.tensor([list(range(1000, 9600))])"
NEW_TOKENS = "max_new_tokens=16"


def readme_patch_example() -> str:
    """The first python block of the README's "Inside a transformers model" section."""
    text = README.read_text()
    section = text[text.index("### Inside a transformers model"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run_offline(code: str, cwd: Path) -> tuple[int, int]:
    """Run `code` in a fresh interpreter with the Hub offline; (generated length, prompt length) of its output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    script = code + "\nprint('shapes', out.shape[1], ids.shape[1])\n"
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    total, prompt = done.stdout.split("shapes")[-1].split()
    return int(total), int(prompt)


def test_readme_patch_example_runs_offline_on_a_short_prompt(tmp_path):
    """The example as written but for its lengths (the slow test below runs it whole)."""
    code = readme_patch_example()
    assert code.count(LONG_IDS) == 1 and code.count(NEW_TOKENS) == 1, "the README example changed: update this test"
    short = code.replace(LONG_IDS, "ids = torch.tensor([list(range(1000, 1100))])")
    short = short.replace(NEW_TOKENS, "max_new_tokens=1")
    total, prompt = run_offline(short, tmp_path)
    assert (prompt, total) == (100, 101)  # the whole prompt read, then the new token


@pytest.mark.slow
def test_readme_patch_example_runs_offline_as_written(tmp_path):
    total, prompt = run_offline(readme_patch_example(), tmp_path)
    assert prompt > 8192 and total == prompt + 16  # past the embedded model's 8K trained positions

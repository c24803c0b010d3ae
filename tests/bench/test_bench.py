"""The benchmark entry point (`python -m bench SUITE`): each CPU-capable suite's smoke configuration writes its JSON
with the meta block; the commands in docs/results.md and in the plans parse under the suites' flags."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
META = ("suite", "argv", "args", "git_commit", "git_dirty", "date", "device", "torch", "triton", "python", "host")


def run_suite(tmp_path: Path, *argv: str) -> dict:
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "bench", *argv, "--output", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    meta = data["meta"]
    assert all(key in meta for key in META), sorted(meta)
    assert meta["suite"] == argv[0] and meta["argv"][: len(argv) - 1] == list(argv[1:])
    assert meta["git_commit"] and meta["torch"] and meta["device"]
    return data


FAST = [
    ("decode", "--smoke"),
    ("batch-decode", "--smoke", "--bandwidth-gbs", "100", "--profile-steps", "1", "--profile-rows", "5"),
    ("paged-decode", "--smoke", "--op", "sparse"),
    ("paged-decode", "--smoke"),
    ("prefill", "--smoke", "--dense-layerwise"),
    ("prefix-ttft", "--smoke"),
    ("attention-latency", "--device", "cpu", "--contexts", "4096", "--chunk", "256", "--impl", "reference",
     "--presets", "default", "--prefill-preset", "default", "--fast-preset", "default", "--heads", "4",
     "--kv-heads", "1", "--e2e-steps", "2"),
    ("method-latency", "--smoke"),
]
SLOW = [
    ("offload-decode", "--smoke", "--dense-layerwise"),
    ("offload-resolve", "--smoke"),
    ("hip-attn", "--smoke", "--skip-hip"),
    ("tensor-parallel", "--smoke"),
    ("memory", "--smoke"),
    ("accuracy", "--smoke"),
    ("server-latency", "--concurrency", "1", "2", "--requests-per-client", "1", "--prompt-tokens", "32",
     "--admit-prompt-tokens", "600", "--admit-streams", "2", "--admit-stream-tokens", "48",
     "--max-tokens", "4"),
]


@pytest.mark.parametrize("argv", FAST, ids=[a[0] for a in FAST])
def test_suite_smoke(tmp_path, argv):
    data = run_suite(tmp_path, *argv)
    assert data.get("rows") or data.get("results")
    if argv[0] == "attention-latency":  # the prefill's landmark saliency update timed alone, beside its CPU form
        prefill = data["results"][0]["ours_prefill"]
        assert prefill["saliency"]["ms"] > 0 and prefill["saliency_cpu_formulation"]["ms"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("argv", SLOW, ids=[a[0] for a in SLOW])
def test_suite_smoke_slow(tmp_path, argv):
    data = run_suite(tmp_path, *argv)
    assert data.get("ok", True) is not False
    if argv[0] == "server-latency":  # a prompt admitted mid-stream holds the streams up for its prefill chunk's step
        admission = data["admission"]
        assert admission["admit_ttft_s"] > 0 and admission["itl_during_max_ms"] > admission["itl_before_median_ms"]
        # prompts asked for in tokens have about that many as the server tokenizes them (its /tokenize)
        assert abs(data["prompt_tokens"]["600"] - 600) <= 60 and abs(data["prompt_tokens"]["32"] - 32) <= 8


def _commands() -> list[list[str]]:
    """Every `python -m bench ...` of docs/results.md and the plans, $VARIABLES filled in."""
    texts = [m for m in re.findall(r"`python -m bench ([^`]+)`", (ROOT / "docs" / "results.md").read_text())]
    for plan in sorted((ROOT / "bench" / "plans").glob("*.sh")):
        for line in plan.read_text().splitlines():
            if "-m bench " in line and not line.lstrip().startswith("#"):
                texts.append(line.split("-m bench ", 1)[1].rstrip().rstrip("\""))  # G="python3 -m bench ..."
    fill = {"OUT_DIR": "/tmp/x", "MODEL_DIR": "/root", "m": "dense", "h": "essays", "S": "", "W": "", "EXTRA": "",
            "METHOD": "tokenselect", "HAYSTACK": "sotu", "haystack": "sotu", "LENGTH": "1048576", "SEEDS": "0 1", "seed": "0", "name": "x",
            "json": "{}", "FLAGS": "", "TAG": ""}

    def filled(t: str) -> str:  # ${NAME:-default}: the default unless filled; then $NAME / ${NAME}
        t = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: fill.get(m.group(1), m.group(2)), t)
        return re.sub(r"\$\{?(\w+)\}?", lambda m: fill.get(m.group(1), "x"), t)

    return [shlex.split(filled(t)) for t in set(texts)]


def test_documented_commands_parse():
    from bench.cli import build_parser
    from infinitehip.cli.config_file import parse_args

    commands = _commands()
    assert len(commands) >= 10
    for argv in commands:
        args = parse_args(build_parser(argv[0]), argv)
        assert args.suite == argv[0]


def test_listing_names_every_suite(capsys):
    from bench.cli import SUITES, main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert all(name in text for name in SUITES)


def test_ruler_suite_takes_every_flag_of_eval_ruler():
    """`python -m bench ruler` hands its namespace to `infinitehip eval ruler`'s run: a flag that only the product
    registers (seen: --print-config) crashed every bench ruler command on the GPU."""
    from bench.cli import build_parser
    from infinitehip.cli.main import build_parser as product_parser

    bench = vars(build_parser("ruler").parse_args(["ruler"]))
    product = vars(product_parser().parse_args(["eval", "ruler"]))
    missing = set(product) - set(bench) - {"command", "task", "func"}
    assert not missing, sorted(missing)

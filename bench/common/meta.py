"""The JSON every suite writes: {"meta": {...}, ...the suite's body}, the meta block saying what ran where.

meta: suite, argv (the suite's arguments, as typed), args (every parsed value, defaults included), git_commit,
git_dirty, date, device, gpus, torch, triton, python, host, and resolved_configs: each distinct engine the suite
built, with every value it ran with (`ResolvedConfig.as_dict()`, config/resolved.py; `record_engine`). A suite
that runs on the CPU although a GPU is present (--smoke) sets out.meta["device"] = "cpu".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def parsed_args(args: argparse.Namespace) -> dict:
    """The namespace's values, without the parser's own objects (parsers, functions)."""
    return jsonable({k: v for k, v in vars(args).items() if not callable(v) and k != "command_parser"})


def meta(suite: str, argv: list[str], args: argparse.Namespace) -> dict:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = torch.cuda.is_available()
    status = _git("status", "--porcelain", "--untracked-files=no")
    return dict(suite=suite, argv=list(argv), args=parsed_args(args),
                git_commit=_git("rev-parse", "HEAD") or os.environ.get("BENCH_GIT_COMMIT"),
                git_dirty=bool(status) if status is not None else None, date=time.strftime("%Y-%m-%d %H:%M:%S"),
                device=torch.cuda.get_device_name() if cuda else "cpu", gpus=torch.cuda.device_count() if cuda else 0,
                torch=torch.__version__, triton=triton_version, python=platform.python_version(), host=platform.node())


class ResultFile:
    """The suite's JSON file (--output; none: nothing written). write() replaces it whole, atomically, so a suite
    may write after every row and a run cut short still leaves its rows. The newest one is the running suite's
    (bench/cli.py opens one per process): `record_engine` adds to its meta."""

    running: "ResultFile | None" = None

    def __init__(self, path: str | None, meta_block: dict):
        self.path = Path(path) if path else None
        self.meta = meta_block
        self.meta.setdefault("resolved_configs", [])
        ResultFile.running = self

    def record_resolved(self, resolved: dict | None) -> None:
        """One engine's resolved settings (a ResolvedConfig.as_dict()), kept once however often it is built."""
        value = jsonable(resolved)
        if value is not None and value not in self.meta["resolved_configs"]:
            self.meta["resolved_configs"].append(value)

    def write(self, body: dict) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"meta": self.meta, **{k: v for k, v in body.items() if k != "meta"}}, indent=1,
                                  default=str))
        os.replace(tmp, self.path)


def record_engine(engine: Any) -> Any:
    """Keep the engine's resolved settings in the running suite's meta; returns the engine."""
    if ResultFile.running is not None:
        ResultFile.running.record_resolved(engine.resolved.as_dict())
    return engine

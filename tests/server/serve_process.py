"""`infinitehip serve` started as a real process for the tests that need one: a free port, the command line, and
the wait for /health (the model loads first, so the wait is long on the CPU)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import httpx

START_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(*flags: str, log: IO[str] | None = None) -> tuple[subprocess.Popen, str]:
    """`infinitehip serve --port P FLAGS...` -> (the process, its base URL). log: where stdout and stderr go (one
    stream); None: pipes the caller reads with communicate()."""
    port = free_port()
    cmd = [sys.executable, "-m", "infinitehip.cli.main", "serve", "--port", str(port), *flags]
    if log is None:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    else:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def wait_healthy(proc: subprocess.Popen, url: str, log_path: Path | None = None) -> None:
    """Until GET /health answers 200; the process exiting first, or START_TIMEOUT_S passing, fails the test with
    what the server printed (its log file, or its pipes)."""
    def printed() -> str:
        if log_path is not None:
            return log_path.read_text()
        return "".join(proc.communicate()) if proc.stdout is not None else ""

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}: {printed()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the server did not start within {START_TIMEOUT_S} s: {printed()}")

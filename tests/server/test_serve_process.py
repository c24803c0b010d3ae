"""`infinitehip serve` as a real process: a damaged prefix cache file refuses the start in one line naming it, or
(--on-bad-prefix-cache skip) is moved aside and changes no answer; SIGTERM with a stream and a non-streaming request
in flight ends both with a well-formed answer (the official `openai` client), saves the prefix cache and exits 0."""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import threading
import time

import openai
import pytest

from infinitehip import SamplingParams
from infinitehip.config.engine import EngineConfig
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.server.prefix_cache_file import PREFIX_CACHE_FILE, REJECTED_SUFFIX
from tests.server.serve_process import free_port, start_serve, wait_healthy
from tests.server.test_server import metric

CONTEXT, KV = 2048, 4096  # dense: its prefix pages are cached page by page (the default may cache on a chunk grid)
DRAIN_S = 2.0
QUESTION = "List the planets of the solar system."


def _engine() -> LLMEngine:
    return LLMEngine(EngineConfig(method="dense", max_context_tokens=CONTEXT, kv_cache_tokens=KV, show_progress=False))


def _answer(engine: LLMEngine, prompt: str) -> str:
    seq = engine.add_request(engine.encode_prompt(prompt), SamplingParams(temperature=0.0, max_tokens=8))
    while engine.has_work:
        engine.step()
    return seq.output_text


@pytest.fixture(scope="module")
def damaged_dir(tmp_path_factory):
    """(a prefix cache directory whose file has one flipped byte in its keys, the greedy answer of a clean engine)."""
    engine = _engine()
    expected = _answer(_engine(), QUESTION)
    _answer(engine, QUESTION + " " + "The Sun is a star. " * 30)
    directory = tmp_path_factory.mktemp("prefix")
    path = directory / PREFIX_CACHE_FILE
    assert engine.save_prefix_cache(path) > 0
    data = bytearray(path.read_bytes())
    (header_len,) = struct.unpack("<Q", data[:8])
    start, end = json.loads(data[8 : 8 + header_len])["k"]["data_offsets"]
    data[8 + header_len + (start + end) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return directory, expected


def _serve(*flags: str) -> tuple[subprocess.Popen, str]:
    return start_serve("--method", "dense", "--max-context-tokens", str(CONTEXT), "--kv-cache-tokens", str(KV),
                       "--log-level", "warning", *flags)


def test_damaged_prefix_cache_file_refuses_the_start_in_one_line(damaged_dir, tmp_path, capsys):
    """The command line's own path (in this process: the model is loaded already): one line naming the file, exit 2."""
    from infinitehip.cli.main import main

    directory, _ = damaged_dir
    target = tmp_path / PREFIX_CACHE_FILE
    target.write_bytes((directory / PREFIX_CACHE_FILE).read_bytes())
    code = main(["serve", "--method", "dense", "--port", str(free_port()), "--max-context-tokens", str(CONTEXT),
                 "--kv-cache-tokens", str(KV), "--show-progress", "false", "--prefix-cache-dir", str(tmp_path)])
    stderr = capsys.readouterr().err
    assert code == 2
    (line,) = [l for l in stderr.splitlines() if l.startswith("error:")]
    assert f"prefix cache file {target}: tensor 'k' fails its checksum" in line and "--on-bad-prefix-cache" in line
    assert target.exists()  # refused, never changed


def test_sigterm_drains_ends_both_requests_cleanly_and_exits_0(damaged_dir):
    directory, expected = damaged_dir
    proc, url = _serve("--prefix-cache-dir", str(directory), "--on-bad-prefix-cache", "skip",
                       "--drain-timeout-s", str(DRAIN_S))
    try:
        wait_healthy(proc, url)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        # The damaged file was set aside, kept, and the answer is a clean engine's.
        assert (directory / (PREFIX_CACHE_FILE + REJECTED_SUFFIX)).exists()
        assert not (directory / PREFIX_CACHE_FILE).exists()
        answer = client.completions.create(model=model, prompt=QUESTION, max_tokens=8, temperature=0)
        assert answer.choices[0].text == expected

        outcomes: dict[str, object] = {}
        numbers = " ".join(str(i) for i in range(1, 60))  # full KV pages: cached, saved at the end
        long_request = dict(model=model, prompt=f"Go on counting: {numbers}", max_tokens=1800, temperature=0,
                            extra_body={"ignore_eos": True})

        def streaming():
            text = []
            try:
                for chunk in client.completions.create(stream=True, **long_request):
                    text.append(chunk.choices[0].text)
                outcomes["stream"] = "".join(text)
            except openai.APIError as exc:
                outcomes["stream"] = exc

        def non_streaming():
            try:
                outcomes["plain"] = client.completions.create(**long_request)
            except openai.APIError as exc:
                outcomes["plain"] = exc

        threads = [threading.Thread(target=streaming), threading.Thread(target=non_streaming)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while metric(url, "infinitehip_requests_running") < 2:
            assert time.monotonic() < deadline, "the two requests did not start"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        proc.wait(timeout=120)
        print(f"exited {time.monotonic() - sent:.1f} s after SIGTERM (drain timeout {DRAIN_S} s)")
        for t in threads:
            t.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, stderr = proc.communicate()
    assert proc.returncode == 0, stderr
    assert f"prefix cache file {directory / PREFIX_CACHE_FILE}: tensor 'k' fails its checksum" in stderr
    assert "Traceback" not in stderr and "CancelledError" not in stderr and "graceful shutdown exceeded" not in stderr
    # Each client got a complete answer or a well-formed error that says why.
    stream, plain = outcomes["stream"], outcomes["plain"]
    assert isinstance(stream, str) or (isinstance(stream, openai.APIError) and "shutting down" in stream.message)
    assert not isinstance(plain, openai.APIError) or (
        isinstance(plain, openai.InternalServerError) and plain.status_code == 503
        and plain.body["code"] == "server_shutting_down")
    assert isinstance(stream, openai.APIError) or isinstance(plain, openai.APIError)  # 1,800 tokens outlast 2 s
    # The prefix cache was saved at the end, and it is a good file for this configuration.
    fresh = _engine()
    assert fresh.load_prefix_cache(directory / PREFIX_CACHE_FILE) > 0

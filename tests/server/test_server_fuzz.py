"""Fuzzing the server with bad input: every answer must be a 4xx with the OpenAI error envelope (never 5xx),
and the server must stay healthy and idle afterwards.

Two layers, both bounded: schemathesis against /openapi.json (schema-violating bodies, plus schema-valid
bodies with odd values whose max_tokens is forced to 1 so nothing decodes for long), and a hand-written
table of malformed JSON, wrong types, negative / huge values, unknown model or route, oversize bodies.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from infinitehip.config.engine import EngineConfig
from infinitehip.config.server import ServerConfig
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.server.app import create_app
from tests.server.test_server import ServerThread

MAX_BODY = 64 * 1024
ENVELOPE_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def base_url():
    # A small context bounds the work of any request that turns out valid.
    engine = LLMEngine(EngineConfig(max_context_tokens=512, kv_cache_tokens=8192, max_num_seqs=16,
                                    prefill_chunk_size=256, show_progress=False))
    config = ServerConfig(max_waiting_requests=32, max_body_bytes=MAX_BODY, keepalive_interval_s=1.0)
    with ServerThread(create_app(engine, config)) as url:
        yield url


@pytest.fixture(scope="module")
def model(base_url):
    return httpx.get(f"{base_url}/v1/models").json()["data"][0]["id"]


def assert_envelope(status: int, text: str, what: str) -> None:
    assert 400 <= status < 500, f"{what}: got {status}: {text[:300]}"
    body = json.loads(text)
    assert set(body) == {"error"} and set(body["error"]) == ENVELOPE_KEYS, f"{what}: {text[:300]}"
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def assert_healthy_and_idle(base_url: str) -> None:
    assert httpx.get(f"{base_url}/health").json()["status"] == "ok"
    deadline = time.monotonic() + 30
    while "infinitehip_requests_running 0.0" not in httpx.get(f"{base_url}/metrics").text:
        assert time.monotonic() < deadline, "requests still running after the fuzz run"
        time.sleep(0.05)


# ---- hand-written table -----------------------------------------------------------------------------

C, CH = "/v1/completions", "/v1/chat/completions"
OK_MSG = [{"role": "user", "content": "hi"}]


def _cases():
    raw = [  # (id, path, raw body, expected status)
        ("truncated", C, b'{"prompt": "x"', 400), ("trailing-comma", C, b'{"prompt": "x",}', 400),
        ("not-utf8", C, b"\xff\xfe\x00{", 400), ("empty-body", C, b"", 422), ("null", C, b"null", 422),
        ("array", C, b"[1, 2]", 422), ("string", CH, b'"hello"', 422), ("number", CH, b"42", 422),
        ("deep-nesting", C, b"[" * 20000 + b"]" * 20000, 400),
        ("nan-temperature", C, b'{"prompt": "x", "max_tokens": 1, "temperature": NaN}', 400),
        ("inf-top-p", C, b'{"prompt": "x", "max_tokens": 1, "top_p": Infinity}', 400),
    ]
    for name, path, body, status in raw:
        yield pytest.param(path, body, status, id=f"raw-{name}")
    bodies = [  # (id, path, json body, expected status); `model` is added unless present
        ("prompt-int", C, {"prompt": 5}, 422), ("prompt-dict", C, {"prompt": {"a": 1}}, 422),
        ("prompt-mixed", C, {"prompt": [1, "a"]}, 422), ("prompt-missing", C, {"max_tokens": 1}, 422),
        ("max-tokens-str", C, {"prompt": "x", "max_tokens": "1"}, 422),
        ("max-tokens-float", C, {"prompt": "x", "max_tokens": 1.5}, 422),
        ("max-tokens-bool", C, {"prompt": "x", "max_tokens": True}, 422),
        ("temperature-str", C, {"prompt": "x", "temperature": "hot"}, 422),
        ("n-str", C, {"prompt": "x", "n": "2"}, 422), ("stop-int", C, {"prompt": "x", "stop": 5}, 422),
        ("stop-list-int", C, {"prompt": "x", "stop": [1]}, 422), ("stream-str", C, {"prompt": "x", "stream": "yes"}, 422),
        ("stream-options-str", C, {"prompt": "x", "stream_options": "x"}, 422),
        ("seed-float", C, {"prompt": "x", "seed": 1.5}, 422), ("top-k-str", C, {"prompt": "x", "top_k": "a"}, 422),
        ("model-int", C, {"prompt": "x", "model": 7}, 422),
        ("messages-str", CH, {"messages": "hi"}, 422), ("messages-missing", CH, {"max_tokens": 1}, 422),
        ("role-unknown", CH, {"messages": [{"role": "wizard", "content": "x"}]}, 422),
        ("content-int", CH, {"messages": [{"role": "user", "content": 5}]}, 422),
        ("max-tokens-negative", C, {"prompt": "x", "max_tokens": -1}, 400),
        ("max-tokens-zero", C, {"prompt": "x", "max_tokens": 0}, 400),
        ("max-tokens-huge", C, {"prompt": "x", "max_tokens": 10**30}, 400),
        ("max-completion-tokens-huge", CH, {"messages": OK_MSG, "max_completion_tokens": 2**63}, 400),
        ("temperature-negative", C, {"prompt": "x", "max_tokens": 1, "temperature": -1}, 400),
        ("temperature-huge", C, {"prompt": "x", "max_tokens": 1, "temperature": 1e308}, 400),
        ("top-p-zero", C, {"prompt": "x", "max_tokens": 1, "top_p": 0}, 400),
        ("top-p-big", CH, {"messages": OK_MSG, "max_tokens": 1, "top_p": 2}, 400),
        ("top-k-zero", C, {"prompt": "x", "max_tokens": 1, "top_k": 0}, 400),
        ("n-zero", C, {"prompt": "x", "max_tokens": 1, "n": 0}, 400),
        ("n-huge", CH, {"messages": OK_MSG, "max_tokens": 1, "n": 10**9}, 400),
        ("seed-huge", C, {"prompt": "x", "max_tokens": 1, "seed": 2**70}, 400),
        ("seed-very-negative", C, {"prompt": "x", "max_tokens": 1, "seed": -(2**70)}, 400),
        ("stop-empty", C, {"prompt": "x", "max_tokens": 1, "stop": ""}, 400),
        ("stop-too-many", C, {"prompt": "x", "max_tokens": 1, "stop": ["a"] * 100}, 400),
        ("stop-too-long", C, {"prompt": "x", "max_tokens": 1, "stop": "s" * 5000}, 400),
        ("token-negative", C, {"prompt": [-1], "max_tokens": 1}, 400),
        ("token-huge", C, {"prompt": [10**12], "max_tokens": 1}, 400),
        ("prompt-empty", C, {"prompt": "", "max_tokens": 1}, 400), ("prompt-empty-list", C, {"prompt": [], "max_tokens": 1}, 400),
        ("prompt-empty-ids", C, {"prompt": [[]], "max_tokens": 1}, 400),
        ("prompt-too-long", C, {"prompt": "hello " * 2000, "max_tokens": 1}, 400),
        ("messages-empty", CH, {"messages": [], "max_tokens": 1}, 400),
        ("image-part", CH, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400),
        ("text-part-no-text", CH, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400),
        ("presence-penalty", C, {"prompt": "x", "max_tokens": 1, "presence_penalty": 1.0}, 400),
        ("top-logprobs-without-logprobs", CH, {"messages": OK_MSG, "max_tokens": 1, "top_logprobs": 2}, 400),
        ("top-logprobs-huge", CH, {"messages": OK_MSG, "max_tokens": 1, "logprobs": True, "top_logprobs": 50}, 400),
        ("logprobs-negative", C, {"prompt": "x", "max_tokens": 1, "logprobs": -1}, 400),
        ("echo-logprobs-stream", C, {"prompt": "x", "max_tokens": 1, "echo": True, "logprobs": 1, "stream": True}, 400),
        ("suffix", C, {"prompt": "x", "max_tokens": 1, "suffix": "y"}, 400),
        ("response-format-unknown", CH, {"messages": OK_MSG, "max_tokens": 1, "response_format": {"type": "xml"}}, 422),
        ("response-format-no-schema", CH, {"messages": OK_MSG, "max_tokens": 1,
                                           "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, 400),
        ("response-format-bad-schema", C, {"prompt": "x", "max_tokens": 1, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}}, 400),
        ("min-p-big", C, {"prompt": "x", "max_tokens": 1, "min_p": 2}, 400),
        ("repetition-penalty-zero", CH, {"messages": OK_MSG, "max_tokens": 1, "repetition_penalty": 0}, 400),
        ("stop-token-ids-negative", C, {"prompt": "x", "max_tokens": 1, "stop_token_ids": [-1]}, 400),
        ("tokenize-nothing", "/tokenize", {}, 400),
        ("detokenize-bad-id", "/detokenize", {"tokens": [10**9]}, 400),
        ("tool-choice-without-tools", CH, {"messages": OK_MSG, "max_tokens": 1, "tool_choice": "auto"}, 400),
        ("stream-options-without-stream", C, {"prompt": "x", "max_tokens": 1, "stream_options": {"include_usage": True}}, 400),
        ("user-without-content", CH, {"messages": [{"role": "user"}], "max_tokens": 1}, 400),
        # JSON may escape a lone surrogate (httpx will not encode one in a str: sent as raw bytes)
        ("lone-surrogate-prompt", C, b'{"prompt": "a\\ud800b", "max_tokens": 1}', 400),
        ("lone-surrogate-message", CH, b'{"messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 1}', 400),
        ("lone-surrogate-tokenize", "/tokenize", b'{"prompt": "\\ud800"}', 400),
        ("wrong-method", C, {"prompt": "x", "max_tokens": 1, "method": "infinitehip"}, 400),
        ("wrong-preset", CH, {"messages": OK_MSG, "max_tokens": 1, "preset": "turbo"}, 400),
        ("unknown-model", C, {"prompt": "x", "max_tokens": 1, "model": "gpt-5"}, 404),
        ("unknown-model-chat", CH, {"messages": OK_MSG, "max_tokens": 1, "model": ""}, 404),
        ("unknown-model-stream", C, {"prompt": "x", "max_tokens": 1, "model": "nope", "stream": True}, 404),
        ("context-overflow-stream", C, {"prompt": "hello " * 600, "max_tokens": 1, "stream": True}, 400),
    ]
    for name, path, body, status in bodies:
        yield pytest.param(path, body, status, id=name)


@pytest.mark.parametrize("path, body, status", list(_cases()))
def test_bad_request_gets_envelope(base_url, model, path, body, status):
    if isinstance(body, bytes):
        r = httpx.post(base_url + path, content=body, headers={"Content-Type": "application/json"}, timeout=60)
    else:
        r = httpx.post(base_url + path, json=body if "model" in body else {"model": model, **body}, timeout=60)
    assert_envelope(r.status_code, r.text, f"{path} {body!r:.100}")
    assert r.status_code == status, r.text


def test_routes_sizes_and_content_types(base_url, model):
    checks = [
        httpx.get(f"{base_url}/v1/nope"), httpx.get(f"{base_url}/nope/../../etc/passwd"),
        httpx.get(f"{base_url}/v1/models/not-a-model"), httpx.get(f"{base_url}/v1/completions"),  # 405
        httpx.delete(f"{base_url}/v1/models"),
        httpx.post(f"{base_url}{C}", content=b'{"prompt": "x"}', headers={"Content-Type": "text/plain"}),
        httpx.post(f"{base_url}{C}", json={"prompt": "x" * (MAX_BODY + 1)}),  # announced length: 413
        httpx.post(f"{base_url}{C}", content=(b"x" * 4096 for _ in range(40))),  # chunked, no length: 413
    ]
    statuses = [r.status_code for r in checks]
    for r in checks:
        assert_envelope(r.status_code, r.text, str(r.request.url))
    assert statuses[:5] == [404, 404, 404, 405, 405] and statuses[6:8] == [413, 413]
    # A Content-Length that is not a number (httpx refuses to send one: use a raw socket).
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}")
        reply = sock.recv(65536).decode(errors="replace")
    assert reply.startswith("HTTP/1.1 4"), reply[:200]
    assert_healthy_and_idle(base_url)


# ---- schemathesis ------------------------------------------------------------------------------------


def test_schemathesis_fuzz(base_url, model):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {C, CH, "/v1/models", "/health"}
    seen: dict[int, int] = {}

    def bound(case):
        """Valid bodies must not decode for long: one token, streaming or not."""
        if isinstance(case.body, dict) and case.method == "POST":
            case.body["max_tokens"] = 1
            case.body.pop("max_completion_tokens", None)
        return case

    for op in operations:
        for mode, examples in ((schemathesis.GenerationMode.NEGATIVE, 80), (schemathesis.GenerationMode.POSITIVE, 40)):
            strategy = op.as_strategy(generation_mode=mode)
            if mode is schemathesis.GenerationMode.POSITIVE:
                strategy = strategy.map(bound)

            @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(case=strategy)
            def run(case):
                response = case.call(base_url=base_url, timeout=60)
                seen[response.status_code] = seen.get(response.status_code, 0) + 1
                assert response.status_code < 500, f"{case.method} {case.path} {case.body!r:.300} -> {response.text[:300]}"
                if response.status_code >= 400:
                    assert_envelope(response.status_code, response.text, f"{case.method} {case.path} {case.body!r:.200}")

            try:
                run()
            except Unsatisfiable:  # nothing to break in GET /health, /v1/models
                assert mode is schemathesis.GenerationMode.NEGATIVE and op.method.upper() == "GET"
    assert any(400 <= s < 500 for s in seen), seen
    assert_healthy_and_idle(base_url)

"""OpenAI-compatible server end to end: a real uvicorn server on 127.0.0.1 over the embedded SmolLM2 model,
driven by the official `openai` client (and httpx where the client hides the wire format)."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time

import httpx
import openai
import pytest
import uvicorn

from infinitehip.cli.main import build_parser
from infinitehip.cli.serve import configs_from_args
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.config.server import ServerConfig
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.server.app import create_app
from infinitehip.server.async_engine import stable_text

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ENGINE_CONFIG = dict(method="dense", max_context_tokens=2048, kv_cache_tokens=16384, max_num_seqs=16, prefill_chunk_size=512,
                     show_progress=False)


class ServerThread:
    """uvicorn in a daemon thread on a free port (port=0; the bound port is read back)."""

    def __init__(self, app):
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(EngineConfig(**ENGINE_CONFIG))


@pytest.fixture(scope="module")
def base_url(engine):
    config = ServerConfig(api_key=API_KEY, max_waiting_requests=32, keepalive_interval_s=0.1, max_body_bytes=1 << 20)
    with ServerThread(create_app(engine, config)) as url:
        yield url


@pytest.fixture(scope="module")
def model(base_url):
    return httpx.get(f"{base_url}/v1/models", headers=AUTH).json()["data"][0]["id"]


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def metric(base_url: str, name: str) -> float:
    text = httpx.get(f"{base_url}/metrics").text
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def wait_idle(base_url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric(base_url, "infinitehip_requests_running") == 0 and metric(base_url, "infinitehip_requests_waiting") == 0:
            return
        time.sleep(0.05)
    raise AssertionError("running/waiting gauges did not return to 0")


def sse_events(lines) -> list:
    """Parsed `data:` payloads (dicts, or the string "[DONE]") and comment lines (str starting with ':')."""
    out = []
    for line in lines:
        if line.startswith(":"):
            out.append(line)
        elif line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# ---- endpoints ----------------------------------------------------------------------------------------


def test_models_health_metrics(base_url, client, engine, model):
    (card,) = client.models.list().data
    assert card.id == model and card.max_model_len == engine.max_context_tokens == 2048
    assert client.models.retrieve(model).id == model
    assert httpx.get(f"{base_url}/health").json()["status"] == "ok"  # open without a key
    text = httpx.get(f"{base_url}/metrics").text
    for name in ("infinitehip_requests_running", "infinitehip_requests_waiting", "infinitehip_kv_cache_usage_ratio",
                 "infinitehip_time_to_first_token_seconds_bucket", "infinitehip_inter_token_latency_seconds_bucket",
                 "infinitehip_prefill_tokens_per_second", "infinitehip_http_requests_total"):
        assert name in text
    assert 'le="1800.0"' in text


def test_chat_stream_equals_non_stream_and_usage(client, engine, model):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    full = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
    choice = full.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = full.usage
    assert usage.prompt_tokens == len(engine.encode_chat(messages))
    assert 1 <= usage.completion_tokens <= 12 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    chunks = list(client.chat.completions.create(
        model=model, messages=messages, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True},
    ))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == usage.model_dump()
    assert len({c.id for c in chunks}) == 1


def test_completion_stop_strings_streaming_and_token_prompts(client, engine, model):
    prompt = "The three primary colors are"
    base = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0,
                                  extra_body={"ignore_eos": True})
    text = base.choices[0].text
    assert base.choices[0].finish_reason == "length" and base.usage.completion_tokens == 16
    assert base.usage.prompt_tokens == len(engine.encode_prompt(prompt))
    mid = len(text) // 2
    stop = text[mid : mid + 3]  # likely spans a token boundary: exercises the streamed hold-back
    expected = text[: text.find(stop)]
    kwargs = dict(model=model, max_tokens=16, temperature=0, stop=["@@never@@", stop])
    cut = client.completions.create(prompt=prompt, **kwargs)
    assert cut.choices[0].text == expected and cut.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(prompt=prompt, stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"
    # token-id prompts and a batch of prompts give the same greedy text
    ids, other = engine.encode_prompt(prompt), engine.encode_prompt("Once upon a time")
    batch = client.completions.create(prompt=[ids, other], model=model, max_tokens=16, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert [c.index for c in batch.choices] == [0, 1] and batch.choices[0].text == text
    assert batch.usage.prompt_tokens == len(ids) + len(other)


def test_seed_determinism_and_n_choices(client, model):
    kwargs = dict(model=model, prompt="My favourite animal is", max_tokens=10, temperature=1.0,
                  extra_body={"ignore_eos": True})
    a = client.completions.create(seed=1234, **kwargs).choices[0].text
    b = client.completions.create(seed=1234, **kwargs).choices[0].text
    assert a == b
    both = client.completions.create(seed=1234, n=2, **kwargs)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.choices[0].text == a
    assert both.choices[1].text == client.completions.create(seed=1235, **kwargs).choices[0].text  # seed + choice
    assert both.usage.completion_tokens == 20


# ---- errors -------------------------------------------------------------------------------------------


def _error(exc_info) -> dict:
    body = exc_info.value.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_errors(base_url, client, engine, model):
    long_messages = [{"role": "user", "content": "hello " * 2100}]
    n_prompt = len(engine.encode_chat(long_messages))
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=long_messages, max_tokens=4)
    err = _error(e)
    assert str(n_prompt) in err["message"] and "2048" in err["message"] and err["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:  # prompt fits, prompt + max_tokens does not: both counts
        client.completions.create(model=model, prompt="hello there", max_tokens=2047)
    assert re.search(r"maximum context length is 2048 tokens\. However, you requested \d+ tokens \(\d+ in the prompt, 2047 "
                     r"for the completion\)\. Nothing was truncated", _error(e)["message"])
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="hi", max_tokens=4, temperature=-1)
    assert _error(e)["message"] == "temperature must be in [0, 100], got -1.0" and _error(e)["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="hi", max_tokens=4, extra_body={"method": "infinitehip"})
    assert "runs attention method 'dense'" in _error(e)["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="hi", max_tokens=4, extra_body={"preset": "fast"})
    assert _error(e)["param"] == "preset"
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=4)
    assert _error(e)["code"] == "model_not_found"
    bad_key = openai.OpenAI(base_url=f"{base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad_key.models.list()
    assert _error(e)["type"] == "authentication_error"
    assert httpx.post(f"{base_url}/v1/completions", json={"prompt": "hi"}).status_code == 401  # no key
    r = httpx.get(f"{base_url}/v1/no-such-route", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = httpx.post(f"{base_url}/v1/completions", headers=AUTH, json={"model": model, "prompt": "hi", "max_tokens": "4"})
    assert r.status_code == 422 and r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(f"{base_url}/v1/completions", headers={**AUTH, "Content-Type": "application/json"}, content=b'{"prompt":')
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{base_url}/v1/completions", headers=AUTH, json={"prompt": "x" * (2 << 20)})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert httpx.get(f"{base_url}/health").status_code == 200


def test_logprobs_and_echo_equal_the_offline_engine(base_url, client, engine, model):
    """Chat logprobs / top_logprobs (streamed and not) and lm-eval's loglikelihood request (token-id prompt, echo,
    logprobs 1, max_tokens 1) give the offline engine's numbers for the same tokens (dense: transformers' own,
    tests/model/test_embedded_model.py)."""
    from infinitehip import LLM, SamplingParams

    offline = LLM(config=EngineConfig(**ENGINE_CONFIG))
    messages = [{"role": "user", "content": "Name a primary colour."}]
    (ref,) = offline.chat(messages, SamplingParams(temperature=0.0, max_tokens=4, logprobs=2))
    got = client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0,
                                         logprobs=True, top_logprobs=2)
    content = got.choices[0].logprobs.content
    assert [c.token for c in content] == [engine.tokenizer.decode([e.token]) for e in ref.logprobs]
    for c, e in zip(content, ref.logprobs):
        assert abs(c.logprob - e.logprob) < 1e-5 and len(c.top_logprobs) == 2
        assert c.bytes == list(c.token.encode("utf-8")) and c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0,
                                                 logprobs=True, top_logprobs=2, stream=True))
    streamed = [c for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]

    ids = engine.tokenizer("The capital of France is Paris")["input_ids"]
    (ref,) = offline.generate([ids], SamplingParams(temperature=0.0, max_tokens=1, logprobs=1, prompt_logprobs=1))
    r = httpx.post(f"{base_url}/v1/completions", headers=AUTH, json={
        "model": model, "prompt": [ids], "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}).json()
    lp = r["choices"][0]["logprobs"]
    assert r["choices"][0]["text"].startswith(engine.tokenizer.decode(ids))
    assert len(lp["tokens"]) == len(ids) + 1 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    want = [e.logprob for e in ref.prompt_logprobs + ref.logprobs]
    assert max(abs(a - b) for a, b in zip(lp["token_logprobs"][1:], want)) < 1e-5
    import torch
    import transformers

    from infinitehip.model.gguf_convert import default_cache_root
    from infinitehip.model.loading import resolve_model_dir

    model_dir, _ = resolve_model_dir(None, default_cache_root())
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # and the server's numbers are transformers' own log-softmax (dense, fp32)
        logp = torch.log_softmax(hf(torch.tensor([ids + ref.token_ids])).logits[0].float(), -1)
    hf_lp = logp[torch.arange(len(ids)), torch.tensor(ids[1:] + ref.token_ids)].tolist()
    assert max(abs(a - b) for a, b in zip(lp["token_logprobs"][1:], hf_lp)) < 1e-4
    assert lp["text_offset"] == sorted(lp["text_offset"]) and all(len(t) == 1 for t in lp["top_logprobs"][1:])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=messages, max_tokens=2, top_logprobs=2)
    assert _error(e)["param"] == "top_logprobs"


def test_vllm_sampling_extensions(client, engine, model):
    free = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True})
    ids = engine.tokenizer(free.choices[0].text, add_special_tokens=False)["input_ids"]
    stopped = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True, "stop_token_ids": [ids[2]]})
    assert stopped.choices[0].finish_reason == "stop" and len(stopped.choices[0].text) < len(free.choices[0].text)
    penalised = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0,
                                          extra_body={"repetition_penalty": 1.3, "min_p": 0.05})
    assert penalised.choices[0].text
    for field, value in (("min_p", 2.0), ("repetition_penalty", 0), ("stop_token_ids", [-3])):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=model, prompt="hi", max_tokens=2, extra_body={field: value})
        assert _error(e)["param"] == field


def test_structured_output_json_schema_and_json_object(client, model):
    """response_format through the official client: a json_schema reply parses and matches the schema; json_object
    replies parse as JSON objects (at least 20 of 24 prompts complete within the token budget); schemas that cannot
    constrain output are 400s."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Give a city and its population as JSON."}], max_tokens=64,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    value = json.loads(r.choices[0].message.content)
    assert set(value) == {"city", "population"} and isinstance(value["population"], int)
    assert r.choices[0].finish_reason == "stop"
    prompts = [f"Item {i}: describe a {thing} as a JSON object." for i, thing in enumerate(PROMPT_THINGS)]
    # A repetition penalty keeps the 135M model from looping inside a JSON string until the token budget ends (the
    # reply would then stop at "length", unparsed, as it would with any server). 128 tokens (192 before): the longest
    # reply that completes has 93 (22 of 24 complete, in 7-93 tokens); the 2 that loop ran alone to the budget.
    out = client.completions.create(model=model, prompt=prompts, max_tokens=128, temperature=0,
                                    extra_body={"response_format": {"type": "json_object"}, "repetition_penalty": 1.3})
    done = [c for c in out.choices if c.finish_reason == "stop"]  # the others used up max_tokens inside the object
    assert len(done) >= 20 and all(isinstance(json.loads(c.text), dict) for c in done)
    for fmt in ({"type": "json_schema", "json_schema": {"name": "x"}},
                {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                           response_format=fmt)
        assert _error(e)["param"] == "response_format"


PROMPT_THINGS = ["cat", "car", "book", "house", "tree", "river", "phone", "chair", "city", "song", "planet", "shoe",
                 "lamp", "bird", "cake", "boat", "clock", "garden", "movie", "train", "bridge", "apple", "storm", "key"]


def test_tokenizer_routes_in_vllms_shapes(base_url, engine, model):
    text = "The capital of France is Paris."
    for prefix in ("", "/v1"):
        r = httpx.post(f"{base_url}{prefix}/tokenize", headers=AUTH, json={"model": model, "prompt": text}).json()
        assert r["tokens"] == engine.encode_prompt(text) and r["count"] == len(r["tokens"])
        assert r["max_model_len"] == 2048 and r["token_strs"] is None
    messages = [{"role": "user", "content": text}]
    r = httpx.post(f"{base_url}/tokenize", headers=AUTH, json={"messages": messages, "return_token_strs": True}).json()
    assert r["tokens"] == engine.encode_chat(messages) and len(r["token_strs"]) == r["count"]
    ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert httpx.post(f"{base_url}/detokenize", headers=AUTH, json={"tokens": ids}).json() == {"prompt": text}
    info = httpx.get(f"{base_url}/tokenizer_info", headers=AUTH).json()
    assert info["model_max_length"] == 2048 and info["eos_token"] and info["chat_template"]
    assert httpx.get(f"{base_url}/tokenizer_info").status_code == 401  # the API key guards them too
    for path, body, status in (("/tokenize", {"prompt": "x", "messages": messages}, 400), ("/tokenize", {}, 400),
                               ("/detokenize", {"tokens": [-1]}, 400), ("/detokenize", {"tokens": "x"}, 422),
                               ("/tokenize", {"model": "nope", "prompt": "x"}, 404)):
        r = httpx.post(f"{base_url}{path}", headers=AUTH, json=body)
        assert r.status_code == status and r.json()["error"]["message"], (path, body, r.text)


# ---- concurrency, long prefill, disconnects ----------------------------------------------------------

PROMPTS = [
    "The capital of France is", "My favourite food is", "Water boils at", "The largest planet is",
    "Once upon a time, a dragon", "To make a cup of tea,", "The best way to learn Python is", "In 1969, astronauts",
    "A haiku about autumn:", "The opposite of hot is", "Dogs are popular pets because", "The speed of light is",
    "Photosynthesis is the process", "Shakespeare wrote", "The recipe for pancakes needs", "Mount Everest is",
]


def test_16_concurrent_streams_match_solo_runs(base_url, client, model):
    # 8 tokens (16 before): the 16 solo runs one after another are most of the time; 8 decode steps of all 16 streams
    # in one batch (the requests arrive within the first step) interleave their chunks as 16 did.
    kwargs = dict(model=model, max_tokens=8, temperature=0)
    solo = [client.completions.create(prompt=p, **kwargs).choices[0] for p in PROMPTS]
    results: dict[int, tuple[str, str | None, set[str]]] = {}
    errors = []
    barrier = threading.Barrier(len(PROMPTS))

    def worker(i: int) -> None:
        try:
            barrier.wait()
            chunks = list(client.completions.create(prompt=PROMPTS[i], stream=True, **kwargs))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            results[i] = (text, chunks[-1].choices[0].finish_reason, {c.id for c in chunks})
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    ids = set()
    for i, s in enumerate(solo):
        text, finish, chunk_ids = results[i]
        assert (text, finish) == (s.text, s.finish_reason), f"stream {i} differs from its solo run"
        assert len(chunk_ids) == 1  # every chunk of a stream belongs to that stream
        ids |= chunk_ids
    assert len(ids) == len(PROMPTS)
    wait_idle(base_url)
    assert httpx.get(f"{base_url}/health").json()["status"] == "ok"


def test_long_prefill_keepalive_and_progress(base_url, engine, model):
    prompt = "hello " * 1400  # ~1400 tokens: three prefill chunks of 512
    n_prompt = len(engine.encode_prompt(prompt))
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "stream": True, "prefill_progress": True,
            "stream_options": {"include_usage": True}}
    start = time.monotonic()
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, headers=AUTH, timeout=120) as r:
        headers_at = time.monotonic() - start
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    first_token = next(i for i, e in enumerate(events) if isinstance(e, dict) and e.get("choices"))
    assert any(e == ": keepalive" for e in events[:first_token]), "no keepalive during prefill"
    progress = [e["prefill_progress"] for e in events if isinstance(e, dict) and "prefill_progress" in e]
    processed = [p["processed"] for p in progress]
    assert len(progress) >= 3 and processed == sorted(processed) and processed[0] < n_prompt
    assert processed[-1] == progress[-1]["total"] == n_prompt
    assert events[-1] == "[DONE]" and events[-2]["usage"]["prompt_tokens"] == n_prompt
    assert headers_at < 5.0  # headers do not wait for the prefill


def test_queue_full_then_stream_disconnect_frees_everything(base_url, client, model):
    aborted_before = metric(base_url, 'infinitehip_sequences_finished_total{reason="abort"}')
    body = {"model": model, "prompt": "Count to one thousand:", "max_tokens": 200, "ignore_eos": True, "n": 32,
            "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{base_url}/v1/completions", json=body, headers=AUTH) as r:
            assert r.status_code == 200
            # 32 sequences accepted (16 run, 16 wait): 17 more exceed max_waiting_requests=32.
            full = httpx.post(f"{base_url}/v1/completions", headers=AUTH, timeout=30,
                              json={"model": model, "prompt": "hi", "max_tokens": 2, "n": 17})
            assert full.status_code == 503 and full.headers["retry-after"]
            assert full.json()["error"]["code"] == "queue_full"
            lines = r.iter_lines()
            assert any(line.startswith("data: {") for line in lines)  # generating; now hang up mid-stream
    wait_idle(base_url)
    assert metric(base_url, 'infinitehip_sequences_finished_total{reason="abort"}') >= aborted_before + 32
    assert metric(base_url, "infinitehip_kv_cache_usage_ratio") == 0.0
    out = client.completions.create(model=model, prompt="Hello", max_tokens=3, temperature=0)
    assert out.usage.completion_tokens >= 1


def test_non_streaming_disconnect_aborts(base_url, model):
    aborted_before = metric(base_url, 'infinitehip_sequences_finished_total{reason="abort"}')
    body = {"model": model, "prompt": "Count to one thousand:", "max_tokens": 1500, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base_url}/v1/completions", json=body, headers=AUTH, timeout=1.5)
    wait_idle(base_url)
    assert metric(base_url, 'infinitehip_sequences_finished_total{reason="abort"}') == aborted_before + 1
    assert httpx.get(f"{base_url}/health").status_code == 200


def test_client_killed_mid_prefill_frees_its_kv_within_one_chunk(base_url, engine, model):
    """A streaming client that goes away after the first prefill chunk: the engine finishes the chunk in flight at
    most, then aborts and frees the KV (prefill chunks of 512 tokens here; a ~1,900-token prompt has 4)."""
    prompt = "Goodbye " + "hello " * 1890  # a first word of its own: no prefix shared with earlier prompts (cached)
    before = metric(base_url, "infinitehip_prefill_tokens_total")
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "stream": True, "prefill_progress": True}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, headers=AUTH, timeout=60) as r:
        for line in r.iter_lines():
            if "prefill_progress" in line:
                processed = json.loads(line[len("data: "):])["prefill_progress"]["processed"]
                break
        closed = time.monotonic()
    wait_idle(base_url)
    freed_after = time.monotonic() - closed
    prefilled = metric(base_url, "infinitehip_prefill_tokens_total") - before
    total = len(engine.encode_prompt(prompt))
    assert processed == 512 and prefilled < total  # the prompt was not read to its end
    assert prefilled - processed <= 512, (prefilled, processed)  # only the chunk in flight at the disconnect
    assert metric(base_url, "infinitehip_kv_cache_usage_ratio") == 0.0
    print(f"disconnect after {processed} of {total} prompt tokens: {prefilled - processed} more prefilled, "
          f"KV freed {freed_after:.2f} s later")


def test_gauges_and_new_metrics_at_admission(base_url, engine, model):
    """A one-step prefill shows as running while it runs (the gauges update once the step is scheduled); queue time,
    prompt and generation length histograms and the preemption counter are exported."""
    wait_idle(base_url)
    seen_running = []
    body = {"model": model, "prompt": "hello " * 480, "max_tokens": 2, "ignore_eos": True}  # one 512-token chunk
    answered = threading.Event()

    def poll():  # until the request is answered (at most 400 reads of /metrics)
        for _ in range(400):
            seen_running.append(metric(base_url, "infinitehip_requests_running"))
            if answered.is_set():
                return
            time.sleep(0.005)

    watcher = threading.Thread(target=poll)
    watcher.start()
    r = httpx.post(f"{base_url}/v1/completions", json=body, headers=AUTH, timeout=60)
    answered.set()
    watcher.join()
    assert r.status_code == 200 and max(seen_running) >= 1
    text = httpx.get(f"{base_url}/metrics").text
    for name in ("infinitehip_queue_time_seconds_count", "infinitehip_prompt_tokens_count",
                 "infinitehip_generation_tokens_per_sequence_count", "infinitehip_preemptions_total"):
        assert name in text, name
    assert metric(base_url, "infinitehip_prompt_tokens_count") >= 1


def test_cors_is_off_by_default_and_opt_in(engine):
    origin = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    with ServerThread(create_app(engine, ServerConfig())) as url:
        assert "access-control-allow-origin" not in httpx.options(f"{url}/v1/completions", headers=origin).headers
    with ServerThread(create_app(engine, ServerConfig(allowed_origins=("https://app.example",), api_key="k"))) as url:
        r = httpx.options(f"{url}/v1/completions", headers=origin)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        assert httpx.get(f"{url}/v1/models").status_code == 401  # the key still guards the API
    with pytest.raises(ValueError, match="allowed_origins"):
        ServerConfig(allowed_origins=("",))


# ---- units (no server) ------------------------------------------------------------------------------


def test_stable_text_holds_back_partial_stops_and_chars():
    assert stable_text("Hello wor", ("world",)) == "Hello "
    assert stable_text("Hello w", ("wx", "world")) == "Hello "
    assert stable_text("Hello", ("xyz",)) == "Hello"
    assert stable_text("caf\ufffd", ()) == "caf"
    assert stable_text("ab\n", ("\n\n",)) == "ab"


def test_server_config_validation_and_cli_flags(tmp_path):
    for bad in (dict(port=70000), dict(max_waiting_requests=0), dict(keepalive_interval_s=0), dict(api_key=""),
                dict(max_body_bytes=10), dict(log_level="loud")):
        with pytest.raises(ValueError):
            ServerConfig(**bad)
    args = build_parser().parse_args([
        "serve", "--model", "m.gguf", "--method", "dense", "--host", "0.0.0.0", "--port", "9000", "--api-key", "k",
        "--max-waiting-requests", "8", "--keepalive-interval-s", "2.5", "--max-context-tokens", "4096",
    ])
    engine_config, server_config = configs_from_args(args)
    assert (engine_config.model, engine_config.method, engine_config.max_context_tokens) == ("m.gguf", "dense", 4096)
    assert (server_config.host, server_config.port, server_config.api_key) == ("0.0.0.0", 9000, "k")
    assert (server_config.max_waiting_requests, server_config.keepalive_interval_s) == (8, 2.5)
    assert engine_config.method_config is None and engine_config.offload == OffloadConfig()
    with pytest.raises(ValueError, match="no such settings"):
        configs_from_args(build_parser().parse_args(["serve", "--method", "dense", "--preset", "3k"]))
    args = build_parser().parse_args(["serve", "--method", "infinitehip", "--preset", "3k-fast"])
    assert configs_from_args(args)[0].method_config.refresh_intervals == (32, 16, 8)
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert configs_from_args(build_parser().parse_args(["serve", "--api-key-file", str(key_file)]))[1].api_key == "from-file"
    args = build_parser().parse_args(["serve", "--method", "infinitehip", "--preset", "5k", "--refresh-intervals", "8", "4", "2"])
    config = configs_from_args(args)[0].method_config
    assert config.chunk_sizes == (64, 32, 16) and config.refresh_intervals == (8, 4, 2)


def test_engine_failure_fails_the_request_not_the_server(base_url, client, engine, model, monkeypatch):
    real_step = engine.step

    def broken_step(on_scheduled=None):
        monkeypatch.setattr(engine, "step", real_step)  # fail once
        raise RuntimeError("simulated device error")

    monkeypatch.setattr(engine, "step", broken_step)
    with pytest.raises(openai.InternalServerError) as e:
        client.completions.create(model=model, prompt="Hello", max_tokens=3)
    assert "simulated device error" in _error(e)["message"]
    wait_idle(base_url)
    health = httpx.get(f"{base_url}/health").json()
    assert health["status"] == "ok" and "simulated device error" in health["last_engine_error"]
    assert client.completions.create(model=model, prompt="Hello", max_tokens=3, temperature=0).choices[0].text


def test_offloaded_kv_server_answers_and_reports_bank_metrics(engine):
    """The server over an engine whose KV lives in host memory behind GPU-style banks (CPU here): the official
    client gets the same greedy answer as from a resident engine, and /metrics carries the banks' counters."""
    from infinitehip import SamplingParams

    from infinitehip.attention.methods.infinitehip.config import infinitehip_preset

    # Stages refreshed within the 8-token answer: steps that refresh nothing reuse the last key list's bank rows
    # without a resolve, so only refresh steps (after the first) count attention-bank hits.
    method = dataclasses.replace(infinitehip_preset("3k-flash"), refresh_intervals=(8, 4, 2))
    config = EngineConfig(**{**ENGINE_CONFIG, "method": "infinitehip", "kv_cache_tokens": 4096, "max_num_seqs": 2},
                          method_config=method)
    offload = OffloadConfig(offload_enabled=True, mask_bank_tokens=4096, attention_bank_tokens=4096)
    # (the module engine's weights: the same embedded model, not loaded again)
    offloaded = LLMEngine(dataclasses.replace(config, offload=offload), loaded=engine.loaded)
    resident = LLMEngine(config, loaded=engine.loaded)
    messages = [{"role": "user", "content": "Name the largest planet of the solar system."}]
    server_config = ServerConfig(api_key=API_KEY, max_waiting_requests=4, keepalive_interval_s=0.1)
    with ServerThread(create_app(offloaded, server_config)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
        reply = client.chat.completions.create(model=client.models.list().data[0].id, messages=messages,
                                               max_tokens=8, temperature=0)
        text = httpx.get(f"{url}/metrics").text
    seq = resident.add_request(resident.encode_chat(messages), SamplingParams(temperature=0.0, max_tokens=8))
    while resident.has_work:
        resident.step()
    assert reply.choices[0].message.content == resident.tokenizer.decode(seq.output_ids, skip_special_tokens=True)
    counts = {m.group(1) + m.group(2): float(m.group(3))
              for m in re.finditer(r'infinitehip_kv_bank_(hits|misses)\{bank="(mask|attention)"\} (\S+)', text)}
    assert counts["missesattention"] > 0 and counts["hitsattention"] > 0
    assert re.search(r'infinitehip_kv_bank_hit_ratio\{bank="attention"\} 0\.\d+', text)


def test_prefix_cache_reports_cached_tokens_and_metrics(base_url, client, engine, model):
    """Two questions on one long document: the second prefills only its own tail; its usage reports the cached
    tokens as OpenAI does (prompt_tokens_details.cached_tokens), the metrics count the hit, and greedy answers
    equal those of a prefill from scratch."""
    document = " ".join(f"Room {i} of the archive holds box {i * 7 % 101} and the key {i * 13 % 97}." for i in range(60))
    ask = lambda q: [{"role": "user", "content": f"{document}\n\nQuestion: {q}"}]
    first = client.chat.completions.create(model=model, messages=ask("Which box is in room 5?"), max_tokens=8,
                                           temperature=0)
    hits_before = metric(base_url, "infinitehip_prefix_cache_hit_tokens")
    second = client.chat.completions.create(model=model, messages=ask("Which key is in room 9?"), max_tokens=8,
                                            temperature=0)
    page = engine.config.page_size
    assert first.usage.prompt_tokens > 600
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached % page == 0 and second.usage.prompt_tokens - 3 * page < cached < second.usage.prompt_tokens
    assert metric(base_url, "infinitehip_prefix_cache_hit_tokens") - hits_before == cached
    assert metric(base_url, "infinitehip_prefix_cache_cached_tokens") >= cached
    assert 0 < metric(base_url, "infinitehip_prefix_cache_hit_rate") <= 1
    # The same question again, streamed with usage: the same answer as the first one, computed from scratch.
    chunks = list(client.chat.completions.create(model=model, messages=ask("Which box is in room 5?"), max_tokens=8,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == first.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= cached

"""Faults against the server, on the embedded model: damaged KV (NaN logits never reach JSON), a body that never
arrives, token ids outside the vocabulary, a KV budget below the context limit, a client gone inside a prefill
chunk, and the small wire details (text_offset, content parts, max_tokens 0 with echo). A real `infinitehip serve`
process for the prefix cache file and SIGTERM (test_serve_process.py)."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest

from infinitehip.config.engine import EngineConfig
from infinitehip.config.server import ServerConfig
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.engine.logprobs import TokenLogprob
from infinitehip.server.app import create_app
from infinitehip.server.logprobs_format import NonFiniteLogprobError, TokenText, chat_logprobs, completion_logprobs
from tests.server.test_server import ServerThread, metric, sse_events, wait_idle

# The KV cache holds 1,024 tokens of an 8K context; one prefill chunk takes a whole 1,000-token prompt.
ENGINE_CONFIG = dict(method="dense", max_context_tokens=8192, kv_cache_tokens=1024, max_num_seqs=4,
                     prefill_chunk_size=1024, show_progress=False)
BODY_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(EngineConfig(**ENGINE_CONFIG))


@pytest.fixture(scope="module")
def base_url(engine):
    config = ServerConfig(keepalive_interval_s=0.1, body_read_timeout_s=BODY_TIMEOUT_S)
    with ServerThread(create_app(engine, config)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_omitted_max_tokens_fits_the_kv_budget_and_models_say_the_limit(client, engine, model):
    """What openai, LangChain and litellm send by default: no max_tokens. The answer is bounded by the 1,024 KV
    tokens instead of refused for the 8K context; /v1/models gives the real limit."""
    assert engine.max_context_tokens == 8192
    assert client.models.list().data[0].model_extra["max_model_len"] == 1024
    out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                         temperature=0)
    assert out.choices[0].message.content and out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.prompt_tokens + out.usage.completion_tokens <= 1024
    with pytest.raises(openai.BadRequestError, match="1024"):  # an explicit max_tokens past the budget: refused
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2000)


def test_body_shorter_than_its_length_gets_408_and_is_closed(base_url):
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        received = b""
        while chunk := sock.recv(4096):  # until the server closes the connection
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout" and f"within {BODY_TIMEOUT_S:g} s" in error["message"]
    assert httpx.get(f"{base_url}/health").status_code == 200


def test_out_of_vocabulary_stop_token_id_is_400(client, engine, model):
    vocab = engine.model_config.vocab_size
    for bad in (vocab, 10**9):
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model=model, prompt="Hi", max_tokens=2, extra_body={"stop_token_ids": [bad]})
        assert err.value.body["param"] == "stop_token_ids" and str(bad) in err.value.body["message"]


def test_over_length_message_counts_the_completion_asked(client, engine, model):
    prompt = [100] * 8192
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model, prompt=prompt, max_tokens=8)
    assert "8200 tokens (8192 in the prompt, 8 for the completion)" in err.value.body["message"]


def test_text_part_without_text_is_named(client, model):
    with pytest.raises(openai.BadRequestError, match="a content part of type 'text' needs a 'text' string"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": [{"type": "text"}]}])


def test_max_tokens_zero_with_echo_scores_the_prompt(client, model):
    """lm-eval's loglikelihood idiom: the prompt's log-probabilities only, no completion."""
    prompt = "The capital of France is Paris"
    scored = client.completions.create(model=model, prompt=prompt, max_tokens=0, echo=True, logprobs=1,
                                       temperature=0)
    one = client.completions.create(model=model, prompt=prompt, max_tokens=1, echo=True, logprobs=1, temperature=0)
    choice = scored.choices[0]
    assert choice.text == prompt and scored.usage.completion_tokens == 0
    n = len(choice.logprobs.tokens)
    assert n == scored.usage.prompt_tokens and choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.token_logprobs == one.choices[0].logprobs.token_logprobs[:n]
    with pytest.raises(openai.BadRequestError, match="max_tokens"):  # without echo nothing would be returned
        client.completions.create(model=model, prompt=prompt, max_tokens=0)


def test_text_offsets_skip_generated_special_tokens(engine):
    """A generated special token (the end of turn) is not in the returned text: it takes no room in text_offset."""
    tok = engine.tokenizer
    words = tok("Hello there", add_special_tokens=False)["input_ids"]
    entries = [TokenLogprob(t, -0.5) for t in [*words, tok.eos_token_id]]
    text = tok.decode([*words, tok.eos_token_id], skip_special_tokens=True)
    lp = completion_logprobs(entries, TokenText(tok))
    for token, offset in zip(lp["tokens"][:-1], lp["text_offset"]):
        assert text.startswith(token, offset)
    assert lp["text_offset"][-1] == len(text)


def test_formatters_refuse_non_finite_logprobs(engine):
    """The last guard before JSON (a step launched ahead samples on the device without the engine's check)."""
    text = TokenText(engine.tokenizer)
    for bad in (float("nan"), float("inf")):
        for entries in ([TokenLogprob(5, bad)], [TokenLogprob(5, -1.0, ((6, bad),))]):
            with pytest.raises(NonFiniteLogprobError, match="non-finite log-probability"):
                completion_logprobs(entries, text)
            with pytest.raises(NonFiniteLogprobError):
                chat_logprobs(entries, text)


def test_nan_in_the_kv_is_an_error_of_the_request_never_invalid_json(base_url, client, engine, model):
    """Damaged cached KV pages (what an unchecked prefix cache file gave): a request on them gets a stated 500 error
    (the engine checks each row's logits before sampling); a stream an error event and [DONE], every line valid
    JSON; the server keeps serving."""
    document = " ".join(f"Shelf {i} holds the jar number {i * 3}." for i in range(40))
    client.completions.create(model=model, prompt=document, max_tokens=1, temperature=0)  # its pages now cached
    allocator = engine.scheduler.allocator
    pages = [page for _, page in allocator.cached_pages()]
    assert pages
    saved = engine.cache.k[:, pages].clone()
    engine.cache.k[:, pages] = float("nan")  # between requests: the engine loop is idle
    try:
        for logprobs in (1, None):  # with logprobs NaN would not be JSON; without, the answer was silently empty
            with pytest.raises(openai.InternalServerError) as err:
                client.completions.create(model=model, prompt=document + " Shelf 7", max_tokens=3, logprobs=logprobs)
            assert err.value.body["code"] == "non_finite_logits" and "not finite" in err.value.body["message"]
        body = {"model": model, "prompt": document + " Shelf 8", "max_tokens": 3, "logprobs": 1, "stream": True}
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=60) as r:
            lines = list(r.iter_lines())
        events = sse_events(lines)

        def not_json(constant):
            raise AssertionError(f"{constant} is not JSON")

        for line in lines:  # strict JSON: NaN / Infinity refused
            if line.startswith("data: {"):
                json.loads(line[len("data: "):], parse_constant=not_json)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "non_finite_logits"
    finally:
        engine.cache.k[:, pages] = saved
        engine.reset_prefix_cache()
    wait_idle(base_url)
    assert httpx.get(f"{base_url}/health").status_code == 200


def test_client_gone_inside_a_prefill_chunk_is_freed_before_the_chunk_ends(base_url, engine, model):
    """A 1,000-token prompt is one prefill chunk here. The client goes away while the chunk runs (its first layer has
    started): the chunk stops between layers, so none of its tokens counts as prefilled, and its KV is freed."""
    prompt = "Again " + "word " * 990
    started, method = threading.Event(), engine.runner.method
    inner = method.__call__

    class Watching(type(method)):  # the engine's method itself, observed: says when the chunk's forward started
        def __call__(self, layer, q, k, v, batch):
            if batch.slices and batch.slices[0].num_queries > 900:
                started.set()
            return inner(layer, q, k, v, batch)

    before = metric(base_url, "infinitehip_prefill_tokens_total")
    aborted = metric(base_url, 'infinitehip_sequences_finished_total{reason="abort"}')
    method.__class__ = Watching
    try:
        body = {"model": model, "prompt": prompt, "max_tokens": 1, "stream": True}
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=60):
            assert started.wait(60)
        wait_idle(base_url)
    finally:
        method.__class__ = Watching.__bases__[0]
    assert metric(base_url, "infinitehip_prefill_tokens_total") == before
    assert metric(base_url, 'infinitehip_sequences_finished_total{reason="abort"}') == aborted + 1
    assert metric(base_url, "infinitehip_kv_cache_usage_ratio") == 0.0

"""Serving latency: time to first token and decode speed for 1, 4, 16 concurrent streaming clients.

    python -m bench server-latency                       # starts `infinitehip serve` (embedded model) itself
    python -m bench server-latency --url http://127.0.0.1:8000 --api-key KEY
    python -m bench server-latency --concurrency 1 4 16 --prompt-tokens 256 --max-tokens 64 -- --method dense

Each client sends `--requests-per-client` streaming /v1/completions requests, one after the other, with a
prompt of about `--prompt-tokens` tokens (distinct per client, so nothing is shared) and a fixed number of
output tokens (ignore_eos). Prints a markdown table:

- TTFT: request sent -> first text chunk (queueing + prefill), mean / p50 / max over requests;
- decode tok/s per stream: (tokens - 1) / (last chunk - first chunk), mean over requests;
- ITL: mean time between chunks of a stream;
- aggregate tok/s: all generated tokens / wall time of the whole level.

`--admit-prompt-tokens N` adds the mixed-batch check: `--admit-streams` streams decode, then one request with a prompt
of ~N tokens arrives; what the running streams wait for while its prefill is admitted (the longest gap between
their chunks from its arrival to its first token, against their median gap before it) and its TTFT. The scheduler
gives each step one token budget (`prefill_chunk_size`, shared with the decode tokens), so the bound to compare is
one step with a full prefill chunk.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


@dataclass
class Result:
    ttft: float
    decode_tps: float
    itl: float
    tokens: int


def prompt_for(client: int, request: int, n_tokens: int, words_per_token: float = 1.0) -> str:
    """~n_tokens tokens of words (each 1-2 tokens, by tokenizer: `words_per_token` from `calibrate`)."""
    n_words = max(round((n_tokens - 8) * words_per_token), 1)
    words = [WORDS[(client * 7 + request * 3 + i) % len(WORDS)] for i in range(n_words)]
    return f"Client {client} request {request}: " + " ".join(words)


def count_tokens(http: httpx.Client, url: str, headers: dict, model: str, prompt: str) -> int | None:
    """The server's token count of `prompt` (POST /tokenize, vLLM's route); None where the server has none."""
    r = http.post(f"{url}/tokenize", json={"model": model, "prompt": prompt}, headers=headers)
    return r.json()["count"] if r.status_code == 200 else None


def calibrate(http: httpx.Client, url: str, headers: dict, model: str) -> float:
    """Words per token of the server's tokenizer, so that a prompt asked for N tokens has ~N; 1.0 where the server
    cannot tokenize (prompts are then N words)."""
    count = count_tokens(http, url, headers, model, prompt_for(0, 0, 4096))
    return 1.0 if count is None else (4096 - 8) / count


def one_request(http: httpx.Client, url: str, headers: dict, model: str, prompt: str, max_tokens: int) -> Result:
    start = time.perf_counter()
    stamps, tokens = stream_stamps(http, url, headers, model, prompt, max_tokens)
    decode_time = stamps[-1] - stamps[0]
    itl = decode_time / (len(stamps) - 1) if len(stamps) > 1 else 0.0
    decode_tps = (tokens - 1) / decode_time if decode_time > 0 else float("nan")
    return Result(stamps[0] - start, decode_tps, itl, tokens)


def stream_stamps(http: httpx.Client, url: str, headers: dict, model: str, prompt: str, max_tokens: int,
                  on_chunk=None) -> tuple[list[float], int]:
    """A streaming completion -> (the arrival time of each text chunk, completion tokens); on_chunk(n) after the
    n-th chunk."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    stamps, tokens = [], 0
    with http.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("choices"):
                stamps.append(time.perf_counter())
                if on_chunk is not None:
                    on_chunk(len(stamps))
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if not stamps:
        raise RuntimeError("no tokens received")
    return stamps, tokens


def run_level(url: str, headers: dict, model: str, clients: int, per_client: int, prompt_tokens: int,
              max_tokens: int, words_per_token: float = 1.0) -> tuple[list[Result], float]:
    results: list[Result] = []
    errors: list[Exception] = []
    barrier = threading.Barrier(clients)
    lock = threading.Lock()

    def client(c: int) -> None:
        with httpx.Client(timeout=3600) as http:
            barrier.wait()
            for i in range(per_client):
                try:
                    res = one_request(http, url, headers, model, prompt_for(c, i, prompt_tokens, words_per_token),
                                      max_tokens)
                except Exception as exc:
                    errors.append(exc)
                    return
                with lock:
                    results.append(res)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return results, wall


def run_admission(url: str, headers: dict, model: str, streams: int, stream_tokens: int, prompt_tokens: int,
                  admit_tokens: int, words_per_token: float = 1.0) -> dict:
    """`streams` streams decode `stream_tokens` tokens each; once every one has sent 4 chunks, a request with a
    ~admit_tokens-token prompt arrives (one output token). -> the streams' median gap before its arrival, their longest
    gap overlapping [arrival, its first token] (ms), and its TTFT (s)."""
    decoding = [threading.Event() for _ in range(streams)]  # set at a stream's 4th chunk (or its failure)
    stamps: list[list[float]] = [[] for _ in range(streams)]
    errors: list[Exception] = []

    def stream(c: int) -> None:
        try:
            with httpx.Client(timeout=3600) as http:
                stamps[c] = stream_stamps(http, url, headers, model, prompt_for(200 + c, 0, prompt_tokens, words_per_token),
                                          stream_tokens, lambda n: n == 4 and decoding[c].set())[0]
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the other threads
            errors.append(exc)
        finally:
            decoding[c].set()

    threads = [threading.Thread(target=stream, args=(c,)) for c in range(streams)]
    for t in threads:
        t.start()
    for event in decoding:
        event.wait()
    if not errors:
        arrival = time.perf_counter()
        with httpx.Client(timeout=3600) as http:
            first = stream_stamps(http, url, headers, model, prompt_for(300, 0, admit_tokens, words_per_token), 1)[0][0]
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    before, during = [], []
    for s in stamps:
        for a, b in zip(s, s[1:]):
            if b <= arrival:
                before.append(b - a)
            elif a < first:  # the gap overlaps the admission
                during.append(b - a)
    if not during:
        raise RuntimeError("the streams ended before the admitted prompt's first token: raise --admit-stream-tokens")
    return dict(streams=streams, admit_prompt_tokens=admit_tokens, admit_ttft_s=first - arrival,
                itl_before_median_ms=1000 * statistics.median(before) if before else None,
                itl_during_max_ms=1000 * max(during))


def start_server(extra_args: list[str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "infinitehip.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning", *extra_args]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise RuntimeError("server did not become healthy")


def add_arguments(parser) -> None:
    parser.add_argument("--url", help="running server (default: start one)")
    parser.add_argument("--api-key", default=os.environ.get("INFINITEHIP_API_KEY"))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--admit-prompt-tokens", type=int, default=0,
                        help="after the levels: a prompt of ~this many tokens arrives while streams decode (0: off)")
    parser.add_argument("--admit-streams", type=int, default=4, help="streams decoding while it is admitted")
    parser.add_argument("--admit-stream-tokens", type=int, default=256, help="tokens each of those streams decodes")
    parser.add_argument("server_args", nargs="*", help="extra `infinitehip serve` flags when starting a server")


def run(args, out) -> dict:
    out.meta["args"].pop("api_key", None)  # never written to a results file
    proc = None
    url = args.url
    if url is None:
        server_args = args.server_args or ["--max-context-tokens", "2048", "--kv-cache-tokens", "32768",
                                           "--max-num-seqs", "16", "--prefill-chunk-size", "512"]
        out.record_resolved(json.loads(subprocess.run(  # the server's engine settings (serve --print-config)
            [sys.executable, "-m", "infinitehip.cli.main", "serve", *server_args, "--print-config"],
            capture_output=True, text=True, check=True).stdout))
        proc, url = start_server(server_args)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        card = httpx.get(f"{url}/v1/models", headers=headers).json()["data"][0]
        model = card["id"]
        with httpx.Client(timeout=600) as http:  # warm-up (allocations, first-call overheads)
            wpt = calibrate(http, url, headers, model)
            measured = {n: count_tokens(http, url, headers, model, prompt_for(0, 0, n, wpt))
                        for n in filter(None, (args.prompt_tokens, args.admit_prompt_tokens))}
            one_request(http, url, headers, model, prompt_for(99, 0, args.prompt_tokens, wpt), 4)
        rows = []
        for clients in args.concurrency:
            results, wall = run_level(url, headers, model, clients, args.requests_per_client, args.prompt_tokens,
                                      args.max_tokens, wpt)
            ttfts = [r.ttft for r in results]
            rows.append((
                clients, len(results), statistics.mean(ttfts), statistics.median(ttfts), max(ttfts),
                statistics.mean(r.decode_tps for r in results), 1000 * statistics.mean(r.itl for r in results),
                sum(r.tokens for r in results) / wall,
            ))
            print(f"  {clients} clients done in {wall:.1f} s", file=sys.stderr, flush=True)
        admission = None
        if args.admit_prompt_tokens:
            admission = run_admission(url, headers, model, args.admit_streams, args.admit_stream_tokens,
                                      args.prompt_tokens, args.admit_prompt_tokens, wpt)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    print(f"\nmodel `{model}` (method {card.get('method')}, max_model_len {card.get('max_model_len')}), "
          f"{measured.get(args.prompt_tokens) or f'~{args.prompt_tokens}'} prompt tokens, {args.max_tokens} output tokens, "
          f"{args.requests_per_client} requests per client\n")
    print("| clients | requests | TTFT mean (s) | TTFT p50 (s) | TTFT max (s) | decode tok/s per stream | ITL mean (ms) | aggregate tok/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, n, tm, tp, tx, dps, itl, agg in rows:
        print(f"| {c} | {n} | {tm:.3f} | {tp:.3f} | {tx:.3f} | {dps:.1f} | {itl:.1f} | {agg:.1f} |")
    if admission:
        print(f"\n{admission['streams']} streams decoding while a ~{admission['admit_prompt_tokens']}-token prompt is "
              f"admitted: its TTFT {admission['admit_ttft_s']:.3f} s; the streams' longest gap meanwhile "
              f"{admission['itl_during_max_ms']:.1f} ms (median gap before it: "
              f"{admission['itl_before_median_ms'] or float('nan'):.1f} ms)")
    names = ("clients", "requests", "ttft_mean_s", "ttft_p50_s", "ttft_max_s", "decode_tok_s_per_stream",
             "itl_mean_ms", "aggregate_tok_s")
    # the prompts' token counts as the server tokenized them (None: a server without /tokenize, prompts of N words)
    return dict(model=model, method=card.get("method"), max_model_len=card.get("max_model_len"),
                words_per_token=wpt, prompt_tokens={str(n): c for n, c in measured.items()},
                rows=[dict(zip(names, r)) for r in rows], admission=admission)

"""Baselines `streaming` (StreamingLLM) and `truncate` (Truncated FA2); what every registered method keeps is in
test_method_matrix.py."""

from __future__ import annotations


import pytest
import torch

from infinitehip import SamplingParams
from infinitehip.attention.methods.cascade.config import CascadeConfig
from infinitehip.attention.methods.streaming.config import StreamingConfig
from infinitehip.attention.methods.truncate.config import TruncateConfig
from infinitehip.attention.methods.truncate.method import head_and_tail
from infinitehip.engine.llm import LLM
from infinitehip.model.rope import RotaryEmbedding, apply_rotary
from tests.conftest import engine_for_dir, generate_greedy, random_ids

SMALL_STREAM = StreamingConfig(sink_tokens=4, window_tokens=60, eviction_batch_tokens=40)


_ids = random_ids


def _engine(path, method, config=None, tokenizer=None, **kw):
    return engine_for_dir(path, tokenizer, config, method=method, **{"max_context_tokens": 2048, **kw})


_generate = generate_greedy


# ---- streaming -------------------------------------------------------------------------------------------
def rolling_oracle_attention(sink: int, window: int, rope: RotaryEmbedding):
    """Attention fn over a whole sequence: query p sees keys sink ∪ its last `window` tokens, and those keys
    and p sit at positions 0..K-1 of that view (StreamingLLM's rolling cache), one masked-free SDPA per query."""

    def attend(layer, q, k, v):
        out = torch.empty_like(q)
        for p in range(q.shape[0]):
            view = sorted(set(range(min(sink, p + 1))) | set(range(max(sink, p - window + 1), p + 1)))
            pos = torch.arange(len(view))
            kk = apply_rotary(k[view], rope.cos[pos, None], rope.sin[pos, None])
            qq = apply_rotary(q[p : p + 1], rope.cos[pos[-1:], None], rope.sin[pos[-1:], None])
            o = torch.nn.functional.scaled_dot_product_attention(
                qq.transpose(0, 1)[None], kk.transpose(0, 1)[None], v[view].transpose(0, 1)[None], enable_gqa=True)
            out[p] = o[0, :, 0]
        return out

    return attend


def _oracle_logits(engine, ids, sink, window):
    model = engine.loaded.model
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), rolling_oracle_attention(sink, window, RotaryEmbedding(engine.model_config, 512)))
        return model.compute_logits(hidden)


def test_streaming_within_window_equals_dense(tiny_llama_dir):
    ids = _ids(SMALL_STREAM.kept_tokens, seed=1)
    dense = _engine(tiny_llama_dir, "dense", prefill_chunk_size=24).prompt_logits(ids)
    ours = _engine(tiny_llama_dir, "streaming", SMALL_STREAM, prefill_chunk_size=24).prompt_logits(ids)
    torch.testing.assert_close(ours, dense, rtol=1e-5, atol=1e-5)


def test_streaming_prompt_shorter_than_the_sinks_equals_dense(tiny_llama_dir):
    """A prompt whose every token is a sink (a two-word `generate`): no window keys yet (it used to fail building an
    empty window range)."""
    ids = _ids(SMALL_STREAM.sink_tokens - 2, seed=3)
    dense = _engine(tiny_llama_dir, "dense").prompt_logits(ids)
    ours = _engine(tiny_llama_dir, "streaming", SMALL_STREAM).prompt_logits(ids)
    torch.testing.assert_close(ours, dense, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk,rows_per_pass", [(17, 1024), (64, 16)])
def test_streaming_prefill_matches_rolling_oracle(tiny_llama_dir, chunk, rows_per_pass, monkeypatch):
    """Every query sees exactly sink + its own last window keys at rolling positions, across chunk
    boundaries, evictions (chunks capped by the cache limit, compaction after each) and SDPA passes."""
    from infinitehip.attention.methods.streaming import method as streaming

    monkeypatch.setattr(streaming, "ROWS_PER_PASS", rows_per_pass)
    ids = _ids(300, seed=2)
    engine = _engine(tiny_llama_dir, "streaming", SMALL_STREAM, prefill_chunk_size=chunk)
    ours = engine.prompt_logits(ids)
    oracle = _oracle_logits(engine, ids, SMALL_STREAM.sink_tokens, SMALL_STREAM.window_tokens)
    torch.testing.assert_close(ours, oracle, rtol=1e-4, atol=1e-4)
    dense = _engine(tiny_llama_dir, "dense").prompt_logits(ids)
    assert (ours[-50:] - dense[-50:]).abs().max() > 1e-2  # far from the start it is not dense attention


def test_streaming_cache_stays_bounded_through_prefill_and_decode(tiny_llama_dir):
    ids = _ids(400, seed=3)
    engine = _engine(tiny_llama_dir, "streaming", SMALL_STREAM, prefill_chunk_size=64)
    trace = []
    seq = _generate(engine, ids, max_tokens=100, trace=trace)
    limit = SMALL_STREAM.cache_tokens
    assert max(n for _, n in trace) <= limit
    decode = [n for in_prefill, n in trace if not in_prefill]
    evictions = sum(b < a for a, b in zip(decode, decode[1:]))
    # Decode compacts once per eviction batch, not every token (99 decode steps after a compacted prefill).
    assert evictions == (100 - 1) // SMALL_STREAM.eviction_batch_tokens == 2
    # Greedy decode agrees with the oracle run teacher-forced over prompt + output.
    full = ids + seq.output_ids
    oracle = _oracle_logits(engine, full[:-1], SMALL_STREAM.sink_tokens, SMALL_STREAM.window_tokens)
    assert oracle[len(ids) - 1 :].argmax(-1).tolist() == seq.output_ids


def test_streaming_evicting_sequences_batched_equal_alone(tiny_llama_dir):
    """Two sequences evicting in the same steps (one's prefill chunks beside the other's decode) stay independent."""
    prompts, params = [_ids(300, seed=9), _ids(130, seed=10)], SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    alone = [_generate(_engine(tiny_llama_dir, "streaming", SMALL_STREAM, prefill_chunk_size=64), ids, 50).output_ids
             for ids in prompts]
    engine = _engine(tiny_llama_dir, "streaming", SMALL_STREAM, prefill_chunk_size=64)
    seqs = [engine.add_request(ids, params) for ids in prompts]
    while engine.has_work:
        engine.step()
        assert all(s.num_cached <= SMALL_STREAM.cache_tokens for s in seqs)
    assert [s.output_ids for s in seqs] == alone


def test_streaming_peak_pages_flat_across_lengths(tiny_llama_dir):
    peaks = {}
    for method, config in (("streaming", SMALL_STREAM), ("dense", None)):
        engine = _engine(tiny_llama_dir, method, config, page_size=16, prefill_chunk_size=64)
        allocator = engine.scheduler.allocator
        for n in (200, 800):
            allocator.reset_peak()
            _generate(engine, _ids(n, seed=n), max_tokens=50)
            assert allocator.num_free == allocator.num_pages
            peaks[method, n] = allocator.peak_in_use
    assert peaks["streaming", 200] == peaks["streaming", 800] == -(-SMALL_STREAM.cache_tokens // 16)
    assert peaks["dense", 800] > peaks["dense", 200]


def test_streaming_config_names_bad_field():
    with pytest.raises(ValueError, match="window_tokens"):
        StreamingConfig(window_tokens=0)
    with pytest.raises(ValueError, match="sink_tokens"):
        StreamingConfig(sink_tokens=-1)


# ---- truncate --------------------------------------------------------------------------------------------
def test_head_and_tail_keeps_both_ends():
    ids = list(range(100))
    assert head_and_tail(ids, 10, 0.5) == [0, 1, 2, 3, 4, 95, 96, 97, 98, 99]
    assert head_and_tail(ids, 10, 0.3) == [0, 1, 2] + list(range(93, 100))
    assert head_and_tail(ids, 10, 1.0) == list(range(10))
    assert head_and_tail(ids, 100, 0.5) == ids


def test_truncate_drops_middle_reports_it_and_matches_dense_on_kept(tiny_llama_dir):
    ids = _ids(300, seed=4)
    config = TruncateConfig(window_tokens=100, head_share=0.25)
    llm = LLM.from_engine(_engine(tiny_llama_dir, "truncate", config))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    (out,) = llm.generate(ids, params)
    assert out.dropped_prompt_tokens == 200 and out.prompt_token_ids == ids  # the request as given
    kept = ids[:25] + ids[-75:]
    seq = _generate(llm.engine, ids, 6)
    assert seq.prompt_ids == kept and seq.dropped_prompt_tokens == 200
    (dense_out,) = LLM.from_engine(_engine(tiny_llama_dir, "dense")).generate(kept, params)
    assert out.token_ids == dense_out.token_ids
    (fits,) = llm.generate(ids[:90], params)  # within the window: read whole
    assert fits.dropped_prompt_tokens == 0


def test_truncate_default_window_is_trained_length_minus_max_tokens(tiny_llama_dir):
    engine = _engine(tiny_llama_dir, "truncate", max_context_tokens=None)  # trained length 4096
    ids = _ids(4200, seed=5)
    kept, budget = engine.check_request(ids, 10)
    assert len(kept) == 4086 and budget == 10
    assert kept == ids[:2043] + ids[-2043:]
    with pytest.raises(ValueError, match="max_tokens"):  # no completion budget given: the room is unknown
        engine.check_request(ids, None)
    assert engine.check_request(ids[:1000], None)[0] == ids[:1000]


def test_truncate_config_names_bad_field():
    with pytest.raises(ValueError, match="head_share"):
        TruncateConfig(head_share=1.5)
    with pytest.raises(ValueError, match="window_tokens"):
        TruncateConfig(window_tokens=1)


# ---- the real embedded model -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def embedded():
    from infinitehip.model.gguf_convert import default_cache_root
    from infinitehip.model.loading import load_model

    return load_model(None, default_cache_root(), torch.device("cpu"), torch.float32)


def _embedded_llm(loaded, method, config):
    from infinitehip import EngineConfig
    from infinitehip.engine.llm_engine import LLMEngine

    cfg = EngineConfig(device="cpu", dtype="float32", show_progress=False, method=method, max_context_tokens=2400,
                       method_config=config)
    return LLM.from_engine(LLMEngine(cfg, loaded))


@pytest.mark.slow  # a real-model sweep: make test-all
def test_embedded_model_baselines_find_needle_only_where_they_read(embedded):
    """~2K-token passkey: streaming (window 384) answers when the needle is in its window, not when it left
    it; truncate (768 kept) answers when the needle is in the kept head, not when it was in the dropped middle."""
    from infinitehip.eval.passkey import make_passkey_sample

    params = SamplingParams(temperature=0.0, max_tokens=12)
    cases = (
        ("streaming", StreamingConfig(sink_tokens=4, window_tokens=384, eviction_batch_tokens=256), 0.2, False),
        ("streaming", StreamingConfig(sink_tokens=4, window_tokens=384, eviction_batch_tokens=256), 0.97, True),
        ("truncate", TruncateConfig(window_tokens=768), 0.5, False),
        ("truncate", TruncateConfig(window_tokens=768), 0.05, True),
    )
    for method, config, depth, found in cases:
        sample = make_passkey_sample(embedded.tokenizer, 2000, depth, 7)
        (out,) = _embedded_llm(embedded, method, config).chat(sample.messages, params)
        assert sample.is_correct(out.text) == found, (method, depth, sample.answer, out.text)
        assert out.dropped_prompt_tokens == (len(out.prompt_token_ids) - 768 if method == "truncate" else 0)


# ---- eval compare ----------------------------------------------------------------------------------------
def test_compare_writes_consistent_table_json_and_plot(embedded, tmp_path):
    import io
    import json

    from rich.console import Console

    from infinitehip import EngineConfig
    from infinitehip.eval.compare import CompareConfig, MethodRun, run_compare
    from infinitehip.eval.compare_report import write_reports

    stream = StreamingConfig(sink_tokens=4, window_tokens=100, eviction_batch_tokens=64)
    cascade = CascadeConfig(sink_tokens=4, cache_tokens=100, num_subcaches=3, stride_tokens=48)
    runs = [MethodRun("dense", "dense", None), MethodRun("streaming", "streaming", stream),
            MethodRun("truncate", "truncate", TruncateConfig(window_tokens=150)), MethodRun("cascade", "cascade", cascade)]
    config = CompareConfig(methods=tuple(r.label for r in runs), tasks=("passkey",), lengths=(200, 400), depths=(0.5,))
    # Every method's context limited to 320 tokens: the 400-token prompts exceed it except for truncate.
    engine_config = EngineConfig(device="cpu", dtype="float32", show_progress=False, max_context_tokens=320, page_size=16)
    records = run_compare(config, engine_config, runs, loaded=embedded, console=Console(file=io.StringIO()))
    paths = write_reports(records, config, {"model": "embedded"}, tmp_path)

    data = json.loads(paths["json"].read_text())
    samples = data["samples"]
    assert len(samples) == len(records) == 4 * 2
    bytes_per_token = 2 * embedded.config.num_layers * embedded.config.num_kv_heads * embedded.config.head_dim * 4
    for s in samples:
        exceeded = s["method"] in ("dense", "streaming", "cascade") and s["length"] == 400
        assert (s["status"] == "exceeds_context") == exceeded, s
        if exceeded:
            assert s["prefill_seconds"] is None and s["peak_kv_pages"] == 0 and "maximum context" in s["error"]
            continue
        assert s["status"] in ("ok", "miss") and s["prefill_seconds"] > 0 and s["decode_tokens"] >= 0
        assert s["read_tokens"] + s["dropped_tokens"] == s["prompt_tokens"]
        assert s["dropped_tokens"] == (s["prompt_tokens"] - 150 if s["method"] == "truncate" else 0)
        assert s["peak_kv_bytes"] == s["peak_kv_pages"] * 16 * bytes_per_token
        cache_tokens = {"streaming": stream.cache_tokens, "cascade": cascade.limit_tokens}.get(s["method"],
                                                                                            s["read_tokens"] + 12)
        assert 0 < s["peak_kv_pages"] <= -(-cache_tokens // 16)
    cells = {(c["method"], c["length"]): c for c in data["cells"]}
    table = paths["markdown"].read_text()
    for (method, length), c in cells.items():
        ran = [s for s in samples if s["method"] == method and s["length"] == length and s["status"] != "exceeds_context"]
        assert c["ran"] == len(ran) and c["correct"] == sum(s["status"] == "ok" for s in ran)
        row = next(line for line in table.splitlines() if line.startswith(f"| {method} | {length} |"))
        assert ("exceeds context (320)" in row) == (not ran)
        if ran:
            assert f"{c['correct']}/{c['ran']}" in row and row.rstrip(" |").endswith(f"{c['dropped_tokens']:.0f}")
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths["plot"].stat().st_size > 10_000


def test_compare_config_and_cli_reject_bad_input(capsys):
    from infinitehip.cli.main import main
    from infinitehip.eval.compare import CompareConfig, parse_method

    with pytest.raises(ValueError, match="unknown attention method 'nope'"):
        CompareConfig(methods=("dense", "nope"))
    with pytest.raises(ValueError, match="preset 'huge'"):
        CompareConfig(methods=("infinitehip:huge",))
    with pytest.raises(ValueError, match="tasks"):
        CompareConfig(tasks=("summaries",))
    assert parse_method("infinitehip:3k-fast").config.refresh_intervals == (32, 16, 8)
    assert main(["eval", "compare", "--methods", "dense", "nope", "--lengths", "100"]) == 2
    assert "unknown attention method 'nope'" in capsys.readouterr().err

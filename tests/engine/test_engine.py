"""Engine behaviour on tiny random models: decode vs recomputation, determinism, sampling, bad input."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from infinitehip import ContextLengthError, EngineConfig, SamplingParams
from infinitehip.engine.runner import ModelRunner
from infinitehip.engine.sequence import Sequence
from tests.conftest import engine_for_dir


def _prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run(engine, prompts, params):
    seqs = [engine.add_request(p, params) for p in prompts]
    while engine.has_work:
        engine.step()
    return seqs


def test_decode_step_equals_full_recomputation(tiny_hf_model, tokenizer):
    _, _, path = tiny_hf_model
    engine = engine_for_dir(path, tokenizer, max_context_tokens=1024, prefill_chunk_size=64, page_size=16)
    step_logits = []
    run = engine.runner.run

    def spy(plan):
        samplers, logits = run(plan)
        if logits.shape[0]:
            step_logits.append(logits[0].clone())
        return samplers, logits

    engine.runner.run = spy
    prompt = _prompt(150)
    (seq,) = _run(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    assert len(seq.output_ids) == 12
    full = engine_for_dir(path, max_context_tokens=1024).prompt_logits(prompt + seq.output_ids[:-1])
    per_step = torch.stack(step_logits)
    torch.testing.assert_close(per_step, full[len(prompt) - 1 :], rtol=1e-4, atol=1e-4)


def test_greedy_is_deterministic_and_batch_independent(tiny_hf_model, tokenizer):
    _, _, path = tiny_hf_model
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = [_prompt(n, seed=n) for n in (5, 40, 90)]
    engine = engine_for_dir(path, tokenizer, max_context_tokens=512, prefill_chunk_size=32, page_size=16)
    together = [s.output_ids for s in _run(engine, prompts, params)]
    alone = [_run(engine, [p], params)[0].output_ids for p in prompts]
    assert together == alone
    assert engine.scheduler.allocator.num_free == engine.scheduler.allocator.num_pages  # everything freed


def test_seeded_sampling_is_reproducible(tiny_hf_model, tokenizer):
    _, _, path = tiny_hf_model
    engine = engine_for_dir(path, tokenizer, max_context_tokens=512)
    p = _prompt(20)
    draw = lambda seed: _run(engine, [p], SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=seed, max_tokens=16, ignore_eos=True))[0].output_ids
    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_top_k_one_is_greedy(tiny_hf_model, tokenizer):
    _, _, path = tiny_hf_model
    engine = engine_for_dir(path, tokenizer, max_context_tokens=512)
    p = _prompt(30)
    greedy = _run(engine, [p], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))[0].output_ids
    top1 = _run(engine, [p], SamplingParams(temperature=0.8, top_k=1, seed=3, max_tokens=6, ignore_eos=True))[0].output_ids
    assert greedy == top1


def test_over_long_prompt_is_refused_with_both_numbers(tiny_hf_model):
    _, _, path = tiny_hf_model
    engine = engine_for_dir(path, max_context_tokens=100)
    with pytest.raises(ContextLengthError, match=r"maximum context length is 100 tokens.*120 in the prompt"):
        engine.add_request(_prompt(120), SamplingParams())
    with pytest.raises(ContextLengthError, match=r"maximum context length is 100 tokens\. However, you requested 110 tokens \(90 in the prompt, 20 "):
        engine.add_request(_prompt(90), SamplingParams(max_tokens=20))
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request([], SamplingParams())
    assert not engine.has_work  # nothing was queued


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(stop=("",)), "stop"),
        (dict(min_p=1.5), "min_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(stop_token_ids=(-1,)), "stop_token_ids"),
    ],
)
def test_invalid_sampling_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_repetition_penalty_and_min_p_follow_their_definitions():
    from infinitehip.engine.sampler import apply_repetition_penalty, sample_token

    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, -4.0])
    seen = torch.tensor([True, True, False, True, False])
    got = apply_repetition_penalty(logits, seen, 2.0)
    assert got.tolist() == [1.0, -2.0, 0.5, 1.5, -4.0]  # positive / 2, negative x 2, unseen unchanged
    # greedy: penalising token 3 (3.0 -> 1.5) makes token 0 (2.0) the most likely
    only_3 = torch.tensor([False, False, False, True, False])
    assert sample_token(logits, SamplingParams(temperature=0.0, repetition_penalty=2.0), None, only_3) == 0
    # min_p: p = softmax(logits); tokens under min_p x max(p) never come out
    p = torch.softmax(logits, 0)
    allowed = set((p >= 0.3 * p.max()).nonzero().flatten().tolist())
    g = torch.Generator().manual_seed(0)
    draws = {sample_token(logits, SamplingParams(temperature=1.0, min_p=0.3), g) for _ in range(300)}
    assert draws == allowed


def test_generation_config_sampling_defaults(tiny_hf_model, tmp_path):
    """The model's generation_config.json sampling fields are the defaults of what a request leaves unset (LLM API;
    the server reads the same `sampling_defaults`), unless EngineConfig.use_generation_config is off."""
    import json
    import shutil

    from infinitehip import LLM

    _, _, path = tiny_hf_model
    model_dir = tmp_path / "model"
    shutil.copytree(path, model_dir)
    config = json.loads((model_dir / "generation_config.json").read_text())
    config.update(temperature=0.6, top_p=0.9, top_k=20, repetition_penalty=1.1, max_length=99)
    (model_dir / "generation_config.json").write_text(json.dumps(config))
    engine = engine_for_dir(model_dir, max_context_tokens=256)
    assert engine.sampling_defaults == dict(temperature=0.6, top_p=0.9, top_k=20, repetition_penalty=1.1)
    params = LLM.from_engine(engine).default_sampling_params(top_k=5)
    assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (0.6, 0.9, 5, 1.1)
    assert engine_for_dir(model_dir, max_context_tokens=256, use_generation_config=False).sampling_defaults == {}
    config["top_p"] = 7.0
    (model_dir / "generation_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="top_p"):
        engine_for_dir(model_dir, max_context_tokens=256)


def test_stop_token_ids_end_generation(tiny_hf_model):
    _, _, path = tiny_hf_model
    engine = engine_for_dir(path, max_context_tokens=256)
    free = _run(engine, [_prompt(20, seed=3)], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    stop = free.output_ids[4]
    first = free.output_ids.index(stop)
    (seq,) = _run(engine, [_prompt(20, seed=3)], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                                               stop_token_ids=(stop,)))
    assert seq.output_ids == free.output_ids[: first + 1] and seq.finish_reason == "stop"


def test_request_metrics_time_the_arrival_the_first_token_and_the_end(tiny_hf_model):
    """`RequestOutput.metrics` (vLLM's names): arrival before the first step, the first token's time within the step
    that sampled it (a 40-token prompt prefilled in 16-token chunks: three steps before it), the end within the last."""
    import time

    from infinitehip import LLM

    _, _, path = tiny_hf_model
    engine = engine_for_dir(path, max_context_tokens=256, prefill_chunk_size=16)
    steps, inner = [], engine.step

    def timed_step(*args, **kwargs):
        before = time.time()
        out = inner(*args, **kwargs)
        seq = engine.scheduler.running[0] if engine.scheduler.running else None
        steps.append((before, time.time(), None if seq is None else len(seq.output_ids)))
        return out

    engine.step = timed_step
    before = time.time()
    (out,) = LLM.from_engine(engine).generate(_prompt(40, seed=5), SamplingParams(temperature=0.0, max_tokens=3,
                                                                                    ignore_eos=True))
    m = out.metrics
    assert before <= m.arrival_time <= steps[0][0]
    first = next(i for i, (_, _, n) in enumerate(steps) if n == 1)
    assert first == 2 and steps[first][0] <= m.first_token_time <= steps[first][1]
    assert steps[-1][0] <= m.finished_time <= steps[-1][1] and m.first_token_time < m.finished_time


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(page_size=0), "page_size"), (dict(device="tpu"), "device"), (dict(dtype="int8"), "dtype"),
     (dict(max_context_tokens=-5), "max_context_tokens")],
)
def test_invalid_engine_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_unknown_method_lists_available(tiny_hf_model):
    _, _, path = tiny_hf_model
    with pytest.raises(ValueError, match=r"unknown attention method 'nope'; available: .*dense"):
        engine_for_dir(path, method="nope")


def test_llm_keeps_the_method_of_its_config(monkeypatch):
    from infinitehip.engine import llm as llm_module

    seen = []
    monkeypatch.setattr(llm_module, "LLMEngine", lambda config: seen.append(config) or _FakeEngine())
    llm_module.LLM(config=EngineConfig(method="infinitehip"))
    llm_module.LLM(config=EngineConfig(method="infinitehip"), method="dense")
    assert [c.method for c in seen] == ["infinitehip", "dense"]


class _FakeEngine:
    tokenizer = None


def test_preemption_under_kv_pressure_gives_the_same_greedy_outputs(tiny_hf_model, tokenizer):
    _, _, path = tiny_hf_model
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompts = [_prompt(40, seed=s) for s in (1, 2, 3)]
    ample = engine_for_dir(path, tokenizer, max_context_tokens=256, page_size=16, kv_cache_tokens=1024)
    expected = [s.output_ids for s in _run(ample, prompts, params)]
    # 10 pages of 16 tokens: all three start (3 pages each) but cannot all grow to 80 tokens.
    tight = engine_for_dir(path, tokenizer, max_context_tokens=256, page_size=16, kv_cache_tokens=160)
    preempted = []
    schedule = tight.scheduler.schedule

    def spy():
        plan, admitted, gone = schedule()
        preempted.extend(gone)
        return plan, admitted, gone

    tight.scheduler.schedule = spy
    assert [s.output_ids for s in _run(tight, prompts, params)] == expected
    assert preempted, "the tight cache must have forced a preemption"
    assert tight.scheduler.allocator.num_free == tight.scheduler.allocator.num_pages


def test_runner_page_table_grows_in_place_and_is_rebuilt_after_release():
    """The device page table follows the sequence's list as it grows page by page (only new entries copied),
    and a released sequence (preempted: its pages freed and re-allocated) gets a fresh table."""
    runner = ModelRunner(None, SimpleNamespace(device=torch.device("cpu")), None, None)
    seq = Sequence([1, 2, 3], SamplingParams(max_tokens=4), 4)
    for pages in (1, 2, 3, 7, 20):
        seq.page_table.extend(100 + 3 * i for i in range(len(seq.page_table), pages))
        table = runner.page_table(seq)
        assert table.dtype == torch.int32 and table.tolist() == seq.page_table
    runner.release(seq)
    seq.page_table[:] = [5, 6]
    assert runner.page_table(seq).tolist() == [5, 6]


def test_token_count_flags_take_k_and_m_suffixes():
    """`--max-context-tokens 1M` is what users type; K/M are binary (the docs' 128K = 131,072)."""
    import argparse

    from infinitehip.cli.options import add_dataclass_flags, dataclass_from_args
    from infinitehip.config.engine import EngineConfig

    parser = argparse.ArgumentParser()
    add_dataclass_flags(parser, EngineConfig)
    args = parser.parse_args(["--max-context-tokens", "1M", "--prefill-chunk-size", "32_768", "--page-size", "64"])
    config = dataclass_from_args(EngineConfig, args)
    assert (config.max_context_tokens, config.prefill_chunk_size, config.page_size) == (1 << 20, 32768, 64)
    assert dataclass_from_args(EngineConfig, parser.parse_args(["--max-context-tokens", "128k"])).max_context_tokens == 131072
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-context-tokens", "lots"])


def test_the_prefill_chunk_default_follows_the_device():
    """None resolves to 32768 on a GPU (the chunk the GPU accuracy results ran with) and 4096 on the CPU; a value given
    is kept wherever it runs, and a non-positive one is refused."""
    from infinitehip.config.engine import CPU_PREFILL_CHUNK, GPU_PREFILL_CHUNK

    config = EngineConfig()
    assert config.prefill_chunk_size is None
    assert config.prefill_chunk_for(torch.device("cuda")) == GPU_PREFILL_CHUNK == 32768
    assert config.prefill_chunk_for(torch.device("cpu")) == CPU_PREFILL_CHUNK == 4096
    assert EngineConfig(prefill_chunk_size=512).prefill_chunk_for(torch.device("cuda")) == 512
    with pytest.raises(ValueError, match="prefill_chunk_size"):
        EngineConfig(prefill_chunk_size=0)

"""A short prompt-ending chunk with static shapes (attention/methods/infinitehip/short_chunk.py, `short_chunk_graphs`): the
same selection and greedy tokens as the eager prefill, a prefix hit equal to a cold run, and (CUDA) graph replays
equal to the eager static work for a question of another length."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import transformers

from infinitehip import LLM, SamplingParams
from infinitehip.attention.methods.infinitehip import method as ih_method
from infinitehip.attention.methods.infinitehip import short_chunk
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.attention.methods.infinitehip.short_chunk_graphs import ShortChunkGraphs
from infinitehip.graph_recorders import ClosureRecorder
from tests.conftest import TINY_CONFIGS, closure_graph_decoder, engine_for_dir

# Every stage on one 32-query block; a question budget far under the candidates even for the shortest chunk. Question
# window 1: a wider window spreads one window's mean over neighbouring chunks, whose exact ties top-k breaks by the
# candidates' count (the static path ranks a bound's), so the chunks kept could differ by a tied neighbour.
CONFIG = InfiniteHiPConfig(sink_tokens=16, stream_tokens=64, query_block_sizes=(32, 32, 32), chunk_sizes=(64, 16, 4),
                           keep_tokens=(512, 128, 32), early_last_keep_tokens=64, refresh_intervals=(4, 2, 1),
                           early_layers=1, landmark_window=48, question_tokens=8, question_keep_tokens=16,
                           question_window=1, repeat_span=16, hierarchy_repeat_span=16)


# Triton kernels run on a GPU where there is one, interpreted (conftest) where not.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny")
    transformers.LlamaForCausalLM(TINY_CONFIGS["llama3"]()).save_pretrained(path)
    return path


def _prompt(length: int, seed: int) -> list[int]:
    ids = torch.randint(5, 500, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
    ids[600:700] = ids[100:200]  # a repeated passage: both repeat masks have something to leave out
    return ids


def capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _kept(starts: torch.Tensor, lens: torch.Tensor) -> list[tuple[int, int]]:
    return sorted((int(s), int(n)) for s, n in zip(starts.flatten(), lens.flatten()) if n > 0)


def _spy(monkeypatch) -> list[tuple[str, list, torch.Tensor]]:
    """Records each layer's question-time chunks and scores, from the eager prefill or the short chunk's static
    work (whose scores run to a bound, -inf past the chunk's own candidates)."""
    from infinitehip.attention.common import question_selection

    seen, scores = [], []
    inner_scores = question_selection.question_scores

    def record_scores(*a, **kw):
        out = inner_scores(*a, **kw)
        if not capturing():
            scores.append(out)
        return out

    monkeypatch.setattr(question_selection, "question_scores", record_scores)
    for module, name in ((ih_method, "eager"), (short_chunk, "static")):
        inner = module.question_chunks

        def record(*a, _inner=inner, _name=name, **kw):
            starts, lens = _inner(*a, **kw)
            if not capturing():  # a capture re-runs the work without results; reading them would end it
                seen.append((_name, _kept(starts, lens), scores[-1]))
            return starts, lens

        monkeypatch.setattr(module, "question_chunks", record)
    return seen


def _saliency(engine, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's landmark saliency sums [L, T, H] and counts [L, T] of the prompt's tokens (slots of a fresh
    engine's only sequence: 0..T-1 in page order)."""
    saliency = engine.method.saliency
    layers = sorted(saliency._sum)
    slots = torch.arange(len(ids))
    return (torch.stack([saliency._sum[layer][slots] for layer in layers]),
            torch.stack([saliency._count[layer][slots] for layer in layers]))


@pytest.mark.parametrize("tail", [8, 20, 32])
def test_short_chunk_selects_as_the_eager_prefill(tiny_dir, monkeypatch, tail):
    """The prompt's last chunk of `tail` tokens (the question's 8 up to one 32-query block): with the static path
    every layer's question scores, question-time chunks and landmark saliency are the eager prefill's, and so are
    the greedy tokens (the CPU formulations of the ops)."""
    _selects_as_eager(tiny_dir, monkeypatch, tail, "auto")


@pytest.mark.slow
@pytest.mark.parametrize("tail", [8, 20])
def test_short_chunk_selects_as_the_eager_prefill_with_the_triton_kernels(tiny_dir, monkeypatch, tail):
    """~4 min on 2 CPU cores: the same with the Triton kernels the GPU runs (interpreted), padded rows included."""
    _selects_as_eager(tiny_dir, monkeypatch, tail, "triton")


def _selects_as_eager(tiny_dir, monkeypatch, tail: int, impl: str) -> None:
    seen = _spy(monkeypatch)
    ids = _prompt(1024 + tail, seed=tail)
    runs = {}
    for flag in (False, True):
        engine = engine_for_dir(tiny_dir, method="infinitehip", prefill_chunk_size=256, max_context_tokens=2048,
                                method_config=dataclasses.replace(CONFIG, short_chunk_graphs=flag, impl=impl),
                                device=DEVICE)
        seen.clear()
        seq = engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=8))
        engine.step()
        while seq.num_computed < len(ids):  # up to the prompt's end: the saliency of the prefill alone
            engine.step()
        saliency = _saliency(engine, ids)
        while engine.has_work:
            engine.step()
        runs[flag] = seq.output_ids, list(seen), saliency
    layers = engine.model_config.num_layers
    (eager_tokens, eager_seen, eager_sal), (static_tokens, static_seen, static_sal) = runs[False], runs[True]
    assert [name for name, _, _ in static_seen] == ["static"] * layers  # the short path ran in every layer
    assert [name for name, _, _ in eager_seen] == ["eager"] * layers
    for (_, kept, ours), (_, eager_kept, theirs) in zip(static_seen, eager_seen):
        assert kept == eager_kept and kept
        torch.testing.assert_close(ours[: theirs.numel()], theirs, rtol=1e-5, atol=1e-7)
        assert ours[theirs.numel():].eq(float("-inf")).all()
    torch.testing.assert_close(static_sal, eager_sal, rtol=1e-4, atol=1e-4)
    assert static_tokens == eager_tokens


def test_chunks_that_do_not_qualify_take_the_eager_path():
    chunk = short_chunk.ShortChunk(start=1024, rows=32)
    assert short_chunk.qualifies(CONFIG, chunk, 8) and short_chunk.qualifies(CONFIG, chunk, 32)
    assert not short_chunk.qualifies(CONFIG, chunk, 7)  # fewer tokens than the question's queries
    assert not short_chunk.qualifies(CONFIG, chunk, 33)  # more than one query block
    assert not short_chunk.qualifies(dataclasses.replace(CONFIG, query_block_sizes=(32, 16, 8)), chunk, 20)
    assert not short_chunk.qualifies(dataclasses.replace(CONFIG, attention_rope="dynamic"), chunk, 20)
    # a document so short that the question's budget holds every candidate chunk
    assert not short_chunk.qualifies(CONFIG, short_chunk.ShortChunk(start=80, rows=32), 20)


def test_prefix_hit_through_the_short_chunk_equals_a_cold_run(tiny_dir):
    """A second question on a cached document: only the question is prefilled (the short path), and its greedy
    tokens are those of the same prompt with caching off."""
    config = dataclasses.replace(CONFIG, short_chunk_graphs=True)
    doc = _prompt(1024, seed=5)
    questions = [torch.randint(5, 500, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (24, 12)]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    engines = {caching: engine_for_dir(tiny_dir, method="infinitehip", prefill_chunk_size=256, max_context_tokens=2048,
                                       enable_prefix_caching=caching, method_config=config)
               for caching in (True, False)}

    def run(engine, ids):
        seq = engine.add_request(ids, params)
        while engine.has_work:
            engine.step()
        return seq

    hits = [run(engines[True], doc + q) for q in questions]
    assert hits[1].cached_prompt_tokens >= 768  # the document came from the cache
    for q, hit in zip(questions, hits):
        assert hit.output_ids == run(engines[False], doc + q).output_ids


def _replay_check(tiny_dir, device: str, recorder=None):
    """The first question on a document runs each layer eagerly and captures it; a second question of another
    length replays. Its greedy tokens equal those of a fresh engine whose first question it is (the same work,
    eagerly), and every layer was captured once, under one shape."""
    doc = _prompt(1024, seed=6)
    first, second = (torch.randint(5, 500, (n,), generator=torch.Generator().manual_seed(n)).tolist()
                     for n in (30, 10))
    params = SamplingParams(temperature=0.0, max_tokens=8)
    config = dataclasses.replace(CONFIG, short_chunk_graphs=True)

    def engine():
        built = engine_for_dir(tiny_dir, method="infinitehip", prefill_chunk_size=256, max_context_tokens=2048,
                               device=device, method_config=config)
        if recorder is not None:  # the CPU: graph semantics for the short chunk and for decode, as a GPU engine has
            built.method.short_graphs = ShortChunkGraphs(recorder=recorder)
            closure_graph_decoder(built, min_bucket=4096)
        return built

    warm = engine()
    llm = LLM.from_engine(warm)
    llm.generate([doc + first], params)
    replayed = llm.generate([doc + second], params)[0].token_ids
    shapes = warm.method.short_graphs._shapes
    assert len(shapes) == 1  # the decode after the first question did not regrow the RoPE tables under its graphs
    recorders = next(iter(shapes.values())).recorders
    assert len(recorders) == warm.model_config.num_layers and all(r is not None for r in recorders.values())
    eager = LLM.from_engine(engine()).generate([doc + second], params)[0].token_ids
    assert replayed == eager


def test_replay_semantics_on_the_cpu(tiny_dir):
    """ClosureRecorder (a replay re-runs the captured work on the static buffers): the second question's inputs
    reach every layer's replay through the buffers alone."""
    _replay_check(tiny_dir, "cpu", ClosureRecorder)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
def test_graph_replay_equals_the_eager_static_work(tiny_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed capture warns and runs eagerly: here it fails the test
        _replay_check(tiny_dir, "cuda")


class _FailingRecorder(ClosureRecorder):
    def capture(self, fn):
        raise RuntimeError("an op that cannot be captured")


def test_a_failed_capture_warns_once_and_runs_the_static_work_eagerly(tiny_dir):
    """A capture that raises: one warning, no further capture, and the questions' tokens are the eager path's."""
    doc = _prompt(1024, seed=6)
    questions = [torch.randint(5, 500, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (30, 10)]
    params = SamplingParams(temperature=0.0, max_tokens=8)

    def engine(flag: bool):
        return engine_for_dir(tiny_dir, method="infinitehip", prefill_chunk_size=256, max_context_tokens=2048,
                              method_config=dataclasses.replace(CONFIG, short_chunk_graphs=flag))

    failing = engine(True)
    failing.method.short_graphs = ShortChunkGraphs(recorder=_FailingRecorder)
    with pytest.warns(UserWarning, match="not captured") as caught:
        outs = [o.token_ids for o in LLM.from_engine(failing).generate([doc + q for q in questions], params)]
    assert len([w for w in caught if "not captured" in str(w.message)]) == 1
    assert failing.method.short_graphs.failed and not failing.method.short_graphs._shapes
    eager = [o.token_ids for o in LLM.from_engine(engine(False)).generate([doc + q for q in questions], params)]
    assert outs == eager

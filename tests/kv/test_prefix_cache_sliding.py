"""Prefix caching on a model with sliding-window layers (tiny Gemma 3: sliding, sliding, full, x2; a 16-token
window): a boundary keeps the layers' rings, a hit restores them, and its logits are those of a run with caching off.
Boundaries are reused only where the rings were kept (a prefill chunk's end, or the last page boundary inside it);
on disk the rings travel too."""

from __future__ import annotations

import pytest
import torch
import transformers

from infinitehip import SamplingParams
from infinitehip.config.methods import method_spec
from infinitehip.engine import prefix_pages
from tests.conftest import TINY_CONFIGS, engine_for_dir, random_ids, record_step_logits

METHODS = {
    "dense": None,
    "infinitehip": method_spec("infinitehip").config(
        sink_tokens=16, stream_tokens=48, query_block_sizes=(32, 16, 8), chunk_sizes=(64, 16, 4),
        keep_tokens=(128, 64, 32), early_last_keep_tokens=32, refresh_intervals=(4, 2, 1), early_layers=1,
        landmark_window=48, question_tokens=8, question_keep_tokens=32, question_window=3),
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
DOC = random_ids(192, 1)  # three prefill chunks of 64
Q1, Q2 = DOC + random_ids(20, 2), DOC + random_ids(21, 3)
Q3 = DOC[:180] + random_ids(30, 5)  # shares 180 tokens: its boundary steps back to the chunk end at 128
Q4 = Q1[:208] + random_ids(12, 7)  # Q1's last full page ends inside its last chunk: rings kept there (dense)
# A question shorter than infinitehip's 8 question tokens: they are computed in one last chunk (the scheduler's
# prompt_end_tokens), whose boundary lies inside DOC's last chunk, so a hit stops at the grid point before it (128).
Q5 = DOC + random_ids(5, 6)


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(TINY_CONFIGS["gemma3"](), attn_implementation="eager")
    path = tmp_path_factory.mktemp("gemma3_prefix")
    model.save_pretrained(path)
    return path


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # on a GPU: its kernels and decode graphs too


def _engine(path, method: str, device: str = "cpu", **config):
    config = {"max_context_tokens": 1024, "page_size": 16, "prefill_chunk_size": 64, **config}
    return engine_for_dir(path, method=method, method_config=METHODS[method], device=device, **config)


def _ask(engine, prompt) -> tuple[list[int], list[torch.Tensor], int]:
    """Greedy tokens, the logits of every sampled token, and the prompt tokens served from the cache."""
    logits = record_step_logits(engine)
    seq = engine.add_request(prompt, GREEDY)
    while engine.has_work:
        engine.step()
    engine.runner.run = type(engine.runner).run.__get__(engine.runner)  # stop recording
    return seq.output_ids, [x for x in logits if x.shape[0]], seq.cached_prompt_tokens


def _same(hit, plain) -> None:
    assert hit[0] == plain[0]
    for ours, theirs in zip(hit[1], plain[1], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_hit_restores_the_rings_and_equals_caching_off(gemma_dir, method, device):
    on = _engine(gemma_dir, method, device)
    assert on.prefix is not None and on.prefix.rings and on.sliding is not None
    assert _ask(on, Q1)[2] == 0
    # Q3: 176 tokens match, the last boundary with rings is 128; Q4: 208, the page boundary inside Q1's last chunk
    # (infinitehip reuses the prefill-chunk grid only: 192)
    for prompt, cached in ((Q2, 192), (Q3, 128), (Q4, 208 if method == "dense" else 192),
                           (Q5, 192 if method == "dense" else 128)):
        hit = _ask(on, prompt)
        assert hit[2] == cached
        _same(hit, _ask(_engine(gemma_dir, method, device, enable_prefix_caching=False), prompt))


def test_without_the_rings_restored_the_hit_differs(gemma_dir, monkeypatch):
    """The check above can fail: the same hit with the ring restore skipped (the row keeps what it held)."""
    on = _engine(gemma_dir, "dense")
    _ask(on, Q1)
    monkeypatch.setattr(type(on.sliding), "restore", lambda self, seq_id, rings: None)
    hit = _ask(on, Q2)
    assert hit[2] == 192
    plain = _ask(_engine(gemma_dir, "dense", enable_prefix_caching=False), Q2)
    assert not torch.allclose(hit[1][0], plain[1][0], rtol=1e-4, atol=1e-4)


def test_rings_travel_through_the_disk_file(gemma_dir, tmp_path):
    first = _engine(gemma_dir, "infinitehip")
    _ask(first, Q1)
    assert first.save_prefix_cache(tmp_path / "cache.safetensors") > 0
    loaded = _engine(gemma_dir, "infinitehip")
    loaded.load_prefix_cache(tmp_path / "cache.safetensors")
    states = [s for s in loaded.scheduler.allocator._payload.values() if isinstance(s, prefix_pages.BoundaryState)]
    assert states and all(s.rings is not None and s.method for s in states)
    hit = _ask(loaded, Q2)
    assert hit[2] == 192
    _same(hit, _ask(_engine(gemma_dir, "infinitehip", enable_prefix_caching=False), Q2))


def test_rings_kept_inside_a_chunk_span_the_chunk_start(gemma_dir):
    """8-token pages: a first prompt of 202 tokens keeps rings at its last page boundary, 200, 8 tokens into its last
    chunk (from 192), so the 16-token window kept there takes 8 keys from the ring before the chunk and 8 from it."""
    on = _engine(gemma_dir, "dense", page_size=8)
    first = DOC + random_ids(10, 8)
    _ask(on, first)
    prompt = first[:200] + random_ids(14, 9)
    hit = _ask(on, prompt)
    assert hit[2] == 200
    _same(hit, _ask(_engine(gemma_dir, "dense", page_size=8, enable_prefix_caching=False), prompt))

"""The product's phase timers (infinitehip/profiling.py): off by default, and when recording a real infinitehip
prefill on the tiny model fills its phases without changing what the engine computes."""

from __future__ import annotations

import pytest

from infinitehip import profiling
from infinitehip.attention.infinitehip.config import InfiniteHiPConfig
from tests.conftest import engine_for_dir, generate_greedy, random_ids

# Budgets below the 1,200-token prompt, so the pruning stages and the block-sparse attention run.
CONFIG = InfiniteHiPConfig(sink_tokens=16, stream_tokens=64, chunk_sizes=(64, 16, 4), keep_tokens=(512, 128, 32),
                           early_last_keep_tokens=64, early_layers=1, landmark_window=48, question_tokens=0)


@pytest.fixture
def recording():
    seconds = profiling.record_phases("cpu")
    yield seconds
    profiling.stop_recording()


def test_a_marked_function_is_timed_only_while_recording():
    @profiling.phase("double")
    def double(x):
        return 2 * x

    assert double(3) == 6  # not recording: nothing to sum into
    seconds = profiling.record_phases("cpu", {"double": 1.0})
    try:
        assert double(4) == 8
        assert seconds["double"] > 1.0
    finally:
        profiling.stop_recording()
    assert double(5) == 10 and seconds["double"] < 2.0


def test_failing_phase_is_still_timed_and_raises(recording):
    @profiling.phase("broken")
    def broken():
        raise KeyError("x")

    with pytest.raises(KeyError):
        broken()
    assert "broken" in recording


def test_infinitehip_prefill_phases_are_recorded_and_change_nothing(tiny_llama_dir, recording):
    ids = random_ids(1200, seed=3)

    def greedy() -> list[int]:
        engine = engine_for_dir(tiny_llama_dir, method="infinitehip", method_config=CONFIG, max_context_tokens=2048)
        return generate_greedy(engine, ids, 4).output_ids

    timed = greedy()
    for name in ("prefill attention (all)", "pruning stages", "block-sparse attention", "landmark saliency"):
        assert recording.get(name, 0.0) > 0.0, (name, recording)
    assert recording["pruning stages"] <= recording["prefill attention (all)"]  # nested inside it
    profiling.stop_recording()
    assert greedy() == timed

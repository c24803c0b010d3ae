"""The product's phase timers (infinitehip/profiling.py): off by default, and when recording a real infinitehip
prefill on the tiny model fills its phases without changing what the engine computes; graph replays are logged one
per replay of the graph decoder, with their graph keys."""

from __future__ import annotations

import pytest

from infinitehip import profiling
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from tests.conftest import closure_graph_decoder, engine_for_dir, generate_greedy, random_ids

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
    calls: dict[str, int] = {}
    seconds = profiling.record_phases("cpu", {"double": 1.0}, calls)
    try:
        assert double(4) == 8 and double(6) == 12
        assert seconds["double"] > 1.0 and calls == {"double": 2}
    finally:
        profiling.stop_recording()
    assert double(5) == 10 and seconds["double"] < 2.0 and calls == {"double": 2}


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


def test_graph_replays_are_logged_one_per_replay_with_their_keys(tiny_llama_dir):
    """The graph decoder with CUDA-graph semantics on the CPU (ClosureRecorder): every replay while recording is one
    Replay (host clock on the CPU), keyed by its graph key; nothing is logged once stopped; tokens unchanged."""
    ids = random_ids(700, seed=5)

    def greedy(record: bool):
        engine = engine_for_dir(tiny_llama_dir, method="infinitehip", method_config=CONFIG, max_context_tokens=2048)
        decoder = closure_graph_decoder(engine)
        replays = profiling.record_graph_replays() if record else None
        try:
            out = generate_greedy(engine, ids, 12).output_ids
        finally:
            profiling.stop_recording_graph_replays()
        return out, decoder, replays

    out, decoder, replays = greedy(record=True)
    assert decoder.replays > 0 and len(replays) == decoder.replays
    assert all(r.ms >= 0.0 for r in replays)
    keys = {r.key for r in replays}  # (capacity bucket, method key): a replay replays a graph captured before
    assert 0 < len(keys) <= decoder.captures and all(isinstance(bucket, int) for bucket, _ in keys)
    plain, decoder, none = greedy(record=False)
    assert plain == out and none is None

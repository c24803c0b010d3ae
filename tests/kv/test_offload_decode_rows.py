"""Decode steps that refresh no stage reuse the attention-bank rows of the last refresh (decode_rows.py): the
offloaded engine must still give the resident engine's tokens and logits, with graphs (replays that run no
Python, as on CUDA) and without, across refresh patterns, with banks small enough that every refresh evicts; a
resolve by anyone else between two steps must make the next step resolve its whole list again, and the steps
between refreshes must resolve nothing. A refresh step reads its landmark-saliency window from the kept rows
(or the store) without a resolve: the saliency sums must equal resident ones (test_offload_saliency_window.py)."""

from __future__ import annotations

import pytest
import torch

from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.engine.graph_decode import ClosureRecorder, GraphDecoder
from infinitehip.kv.offload.offloaded import OffloadedKV
from infinitehip.kv.offload.resolve import resolve
from tests.attention.test_infinitehip_method import SMALL
from tests.conftest import after_each_decode_step, random_ids
from tests.engine.test_offload_engine import FEW_GROUPS, HEADS, _assert_same, _generate, _smallest_banks

REFRESH = (6, 3, 2)  # steps 1, 5, 7, 11, 13 refresh no stage


class HostFreeReplay(ClosureRecorder):
    """A replay whose host-side effects on the attention bank's holder are undone, as a CUDA graph replay runs no
    Python: what the engine knows afterwards comes from `advance_host_counters` only."""

    kv = None

    def replay(self):
        holder = self.kv.attention_holder
        out = super().replay()
        self.kv.attention_holder = holder
        return out


def _count_calls(monkeypatch):
    """Per engine step: [resolve_attention calls, copy_to_spare calls] (appended by `on_step`)."""
    calls = [0, 0]
    for i, name in enumerate(("resolve_attention", "copy_to_spare")):
        inner = getattr(OffloadedKV, name)

        def spy(self, *args, _inner=inner, _i=i):
            calls[_i] += 1
            return _inner(self, *args)

        monkeypatch.setattr(OffloadedKV, name, spy)
    return calls


def _run(path, config, steps, graphs, on_step=None, prompt_seed=31):
    """Offloaded greedy decode of one sequence; on_step(engine, decode steps done) after every engine step."""
    offload = _smallest_banks(config, HEADS, mask_bank=FEW_GROUPS)

    def setup(engine):
        if graphs:
            from tests.conftest import closure_graph_decoder

            HostFreeReplay.kv = engine.cache.kv
            closure_graph_decoder(engine).recorder = HostFreeReplay
        if on_step is not None:
            after_each_decode_step(engine, on_step)

    return _generate(path, config, offload, [random_ids(700, seed=prompt_seed)], steps, on_engine=setup)


@pytest.mark.parametrize("graphs", [False, True])
def test_steps_between_refreshes_resolve_nothing_and_equal_resident(tiny_llama_dir, monkeypatch, graphs):
    config = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": REFRESH})
    steps = 16
    resident = _generate(tiny_llama_dir, config, None, [random_ids(700, seed=31)], steps)
    calls, per_step, keys = _count_calls(monkeypatch), [], []
    inner_step = GraphDecoder.step
    monkeypatch.setattr(GraphDecoder, "step", lambda self, *args: keys.append(args[-1]) or inner_step(self, *args))
    ours = _run(tiny_llama_dir, config, steps, graphs,
                on_step=lambda engine, done: per_step.append((done, list(calls))))
    _assert_same(ours, resident)
    layers = ours[3].model_config.num_layers
    # Decode step s: from the entry with s steps done to the one with s + 1.
    delta = [(b[0] - a[0], b[1] - a[1]) for (s, a), (t, b) in zip(per_step, per_step[1:]) if t == s + 1]
    assert len(delta) == steps - 2  # the first token comes from the prefill, the last step is not recorded
    refreshes = [any(s % r == 0 for r in REFRESH) for s in range(len(delta))]
    assert not all(refreshes)
    for s, ((resolves, copies), refresh) in enumerate(zip(delta, refreshes)):
        if refresh:  # one resolve per layer (the key list): the saliency window is read from the kept rows (the
            # new token copied into a spare row) or, at the first step (nothing kept yet), from the store
            assert resolves == layers and copies == (layers if s > 0 else 0)
        else:  # only the new token's row, into a spare row, per layer
            assert resolves == 0 and copies == layers
    if graphs:
        # every decode step but the first (it allocates the stage caches) from a graph; the kept flag of the key
        # says whether this sequence held the bank from its last step on (always, decoding alone)
        assert len(keys) == steps - 2 and ours[3].runner.graph_decoder.replays > 0
        assert [key[1][2] for key in keys] == [True] * len(keys)


def _evict_everything(engine):
    """A foreign reader: read every prompt key of every layer through the attention bank (evicts every row)."""
    cache = engine.cache
    seq = next(iter(engine.scheduler.running))
    slots = cache.slots(engine.runner.page_table(seq), 0, 700)
    for layer in range(cache.num_layers):
        cache.read_k(layer, slots.flip(0))


@pytest.mark.parametrize("graphs", [False, True])
def test_a_resolve_between_two_steps_makes_the_next_one_resolve_again(tiny_llama_dir, monkeypatch, graphs):
    """After a foreign resolve evicted the kept rows, the next step resolves its whole list: tokens equal resident.
    Control: if the holder survived that resolve (the kept rows trusted), the output would differ."""
    config = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": REFRESH})
    steps = 10
    resident = _generate(tiny_llama_dir, config, None, [random_ids(700, seed=31)], steps)

    keys = []
    inner_step = GraphDecoder.step
    monkeypatch.setattr(GraphDecoder, "step", lambda self, *args: keys.append(args[-1]) or inner_step(self, *args))

    # Before decode step 1 (refreshes no stage: must resolve, not reuse) and step 4 (refreshes the last stage, a
    # replay with graphs: the replay must leave the bank held, so that step 5 reuses again).
    def evict_before_reuse(engine, done):
        if done in (1, 4):
            _evict_everything(engine)

    ours = _run(tiny_llama_dir, config, steps, graphs, on_step=evict_before_reuse)
    _assert_same(ours, resident)
    if graphs:  # decode steps 1 .. steps - 2 from graphs; the steps after an eviction hold nothing
        kept = [s not in (1, 4) for s in range(1, steps - 1)]
        assert [key[1][2] for key in keys] == kept and kept[4]

    monkeypatch.setattr(OffloadedKV, "resolve_attention",
                        lambda self, layer, slots: resolve(self.attention_bank, self.store, layer, slots,
                                                                          impl=self.impl))
    stale = _run(tiny_llama_dir, config, steps, graphs, on_step=evict_before_reuse)
    assert stale[0] != resident[0] or any(not torch.equal(a, b) for a, b in zip(stale[1], resident[1]))


@pytest.mark.parametrize("graphs", [False, True])
def test_repeated_text_left_out_offloaded_equals_resident(tiny_llama_dir, graphs):
    """hierarchy_repeat_span on a prompt that repeats itself (most stage-1 chunks left out: empty chunks in the mask
    bank's static groups): the offloaded decode, eager or from graphs, gives the resident tokens and logits."""
    from infinitehip.attention.methods.infinitehip.repeated_chunks import novel_chunks
    from infinitehip.attention.common.repeated_text import repeated_tokens
    from tests.conftest import closure_graph_decoder

    config = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": REFRESH, "hierarchy_repeat_span": 16})
    ids = random_ids(233, seed=7) * 3
    chunks = novel_chunks(repeated_tokens(torch.tensor(ids), 16)[16:], 64)
    assert chunks.any() and not chunks.all()  # the mask is active and leaves the first copy in
    resident = _generate(tiny_llama_dir, config, None, [ids], 12)
    offload = _smallest_banks(config, HEADS, mask_bank=FEW_GROUPS)

    def setup(engine):
        if graphs:
            HostFreeReplay.kv = engine.cache.kv
            closure_graph_decoder(engine).recorder = HostFreeReplay

    ours = _generate(tiny_llama_dir, config, offload, [ids], 12, on_engine=setup)
    _assert_same(ours, resident)
    if graphs:
        assert ours[3].runner.graph_decoder.replays > 0

"""A decode step that refreshes only the last pruning stage reuses the mask-bank rows of its representatives kept by
the last stage's previous refresh (mask_rows.py) instead of resolving them again: the tokens, logits and saliency
sums must equal bit for bit those of the former path (every refresh resolves) and the resident engine's tokens, with
graphs (replays that run no Python, as on CUDA) and without; such steps must make no mask-bank resolve when every
layer holds its rows, and resolve again after a refresh of another stage alone or a foreign mask-bank resolve
(control: trusting the evicted rows changes the output). A last stage scored in several groups keeps nothing."""

from __future__ import annotations

import pytest
import torch

from infinitehip.attention.methods.infinitehip import mask_rows, method
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.kv.offload.offloaded import OffloadedKV
from infinitehip.kv.offload.resolve import resolve
from tests.attention.test_infinitehip_method import SMALL
from tests.conftest import after_each_decode_step, random_ids
from tests.engine.test_offload_engine import FEW_GROUPS, HEADS, _assert_same, _generate, _smallest_banks
from tests.kv.test_offload_decode_rows import HostFreeReplay
from tests.kv.test_offload_saliency_window import _sums

REFRESH = (6, 3, 2)  # last stage only: steps 2, 8, 14 (kept rows held) and 4, 10 (stage 1 alone refreshed before)
ONE_GROUP = 32 * HEADS  # the last stage's 128 / 4 = 32 candidate chunks' representatives: scored in one group
CONFIG = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": REFRESH})


class MaskHostFreeReplay(HostFreeReplay):
    """A replay that also undoes its host-side effects on the mask holders (a CUDA graph runs no Python)."""

    def replay(self):
        holders = list(self.kv.mask_holders)
        out = super().replay()
        self.kv.mask_holders[:] = holders
        return out


def _run(path, steps, graphs, mask_bank=ONE_GROUP, on_step=None, keys=None):
    """Offloaded greedy decode; on_step(engine, decode steps done) after every engine step; keys: the graph keys."""
    offload = _smallest_banks(CONFIG, HEADS, mask_bank=mask_bank)

    def setup(engine):
        if graphs:
            from tests.conftest import closure_graph_decoder

            MaskHostFreeReplay.kv = engine.cache.kv
            decoder = closure_graph_decoder(engine)
            decoder.recorder = MaskHostFreeReplay
            if keys is not None:
                inner_key = decoder.key
                decoder.key = lambda seq: (lambda k: keys.append(k) or k)(inner_key(seq))
        if on_step is not None:
            after_each_decode_step(engine, on_step)

    return _generate(path, CONFIG, offload, [random_ids(700, seed=31)], steps, on_engine=setup)


def _former(path, steps, graphs, on_step=None):
    """The former path: the last stage's representatives resolved at every refresh (nothing kept)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(method, "stage_keys", lambda kept, rep_keys, cache, layer, table, pattern, step:
                      [rep_keys] * len(pattern))
        return _run(path, steps, graphs, on_step=on_step)


def _assert_exact(ours, former):
    assert ours[0] == former[0]
    for x, y in zip(ours[1], former[1]):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    a, b = _sums(ours[3]), _sums(former[3])
    assert a.keys() == b.keys()
    for layer in a:
        for x, y in zip(a[layer], b[layer]):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


def _mask_calls(monkeypatch):
    calls = [0]
    inner = OffloadedKV.resolve_mask

    def spy(self, layer, slots):
        calls[0] += 1
        return inner(self, layer, slots)

    monkeypatch.setattr(OffloadedKV, "resolve_mask", spy)
    return calls


def _per_step(calls):
    """on_step recording the mask-bank resolve calls so far -> (callback, {decode step: calls in it})."""
    seen, delta = [], {}

    def on_step(engine, done):
        if seen and done == seen[-1][0] + 1:
            delta[seen[-1][0]] = calls[0] - seen[-1][1]
        seen.append((done, calls[0]))

    return on_step, delta


@pytest.mark.parametrize("graphs", [False, True])
def test_last_stage_refresh_reuses_the_mask_rows_and_equals_the_former_path(tiny_llama_dir, monkeypatch, graphs):
    steps = 17
    resident = _generate(tiny_llama_dir, CONFIG, None, [random_ids(700, seed=31)], steps)
    former = _former(tiny_llama_dir, steps, graphs)
    calls, keys = _mask_calls(monkeypatch), []
    on_step, delta = _per_step(calls)
    ours = _run(tiny_llama_dir, steps, graphs, on_step=on_step, keys=keys)
    _assert_same(ours, resident)
    _assert_exact(ours, former)
    layers = ours[3].model_config.num_layers
    for s in (2, 8, 14):  # the last stage alone, its rows held since its last refresh: no mask-bank resolve
        assert delta[s] == 0, (s, delta)
    for s in (4, 10):  # stage 1 alone refreshed at 3, 9 (its resolve dropped the holders): the last stage resolves
        assert delta[s] == layers, (s, delta)
    for s, stages in ((3, 1), (6, 3), (9, 1), (12, 3)):  # stage 1 alone, or all three: one group each
        assert delta[s] == layers * stages, (s, delta)
    if graphs:  # the decode steps after the first from graphs; the key's last part: the mask rows reused
        reused = [key[1][3] for key in keys if key is not None]
        assert ours[3].runner.graph_decoder.replays > 0 and reused.count(True) == 3


def _evict_mask(engine):
    """A foreign reader: resolve every prompt key of every layer through the mask bank (evicts every kept row)."""
    kv, cache = engine.cache.kv, engine.cache
    seq = next(iter(engine.scheduler.running))
    slots = cache.slots(engine.runner.page_table(seq), 0, 700)
    for layer in range(cache.num_layers):
        for a in range(0, slots.numel(), kv.mask_bank.bank_tokens):
            kv.resolve_mask(layer, slots[a : a + kv.mask_bank.bank_tokens])


@pytest.mark.parametrize("graphs", [False, True])
def test_a_foreign_mask_resolve_makes_the_last_stage_resolve_again(tiny_llama_dir, monkeypatch, graphs):
    """Evict before decode step 8 (the last stage alone, rows kept at 6): it resolves, the output equals the former
    path. Control: with the holder surviving the foreign resolve, the stale rows are read and the output differs."""
    steps = 12

    def evict(engine, done):
        if done == 8:
            _evict_mask(engine)

    former = _former(tiny_llama_dir, steps, graphs, on_step=evict)
    ours = _run(tiny_llama_dir, steps, graphs, on_step=evict)
    _assert_exact(ours, former)

    monkeypatch.setattr(OffloadedKV, "resolve_mask",
                        lambda self, layer, slots: resolve(self.mask_bank, self.store, layer, slots, impl=self.impl))
    stale = _run(tiny_llama_dir, steps, graphs, on_step=evict)
    assert stale[0] != former[0] or any(not torch.equal(a, b) for a, b in zip(stale[1], former[1]))


def test_several_groups_keep_nothing(tiny_llama_dir, monkeypatch):
    """A mask bank of 5 chunks' representatives: the last stage in 7 groups, every refresh resolves; exact."""
    steps = 10
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(method, "stage_keys", lambda kept, rep_keys, *args: [rep_keys] * len(args[-2]))
        former = _run(tiny_llama_dir, steps, False, mask_bank=FEW_GROUPS)
    calls, kept = _mask_calls(monkeypatch), []
    monkeypatch.setattr(mask_rows.MaskRows, "keep", lambda self, *args: kept.append(args))
    on_step, delta = _per_step(calls)
    ours = _run(tiny_llama_dir, steps, False, mask_bank=FEW_GROUPS, on_step=on_step)
    _assert_exact(ours, former)
    assert delta[2] == delta[4] == 7 * ours[3].model_config.num_layers and not kept

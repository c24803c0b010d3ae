"""A decode step that refreshes a stage applies the landmark saliency of its pending queries, reading the keys of its
window without an attention-bank resolve (decode_rows.py): from the rows kept for the last key list (the bank
held; the new token copied into a spare row) or, when nothing is held, straight from the store. The keys read must
be the store's, and the saliency sums and logits after decoding must equal those of the former path (`read_k`, a
resolve through the attention bank) bit for bit and the resident engine's tokens, with graphs and without, at the
boundary stream_tokens = landmark_window + P - 2 and past it (store reads); a foreign resolve between two steps
must make the next refresh read the store (control: trusting the evicted rows changes the sums). Resident sums
differ from offloaded ones in the last bits from the prefill on (layer 0's attention output), hence the former
offloaded path as the exact reference."""

from __future__ import annotations

import pytest
import torch

from infinitehip.attention.methods.infinitehip import decode_rows, method
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.kv.offload.offloaded import OffloadedKV
from infinitehip.kv.offload.resolve import resolve
from tests.attention.test_infinitehip_method import SMALL
from tests.conftest import random_ids
from tests.kv.test_offload_decode_rows import REFRESH, _evict_everything, _run
from tests.engine.test_offload_engine import _assert_same, _generate


def _sums(engine) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    saliency = engine.runner.method.saliency
    return {layer: (saliency._sum[layer], saliency._count[layer]) for layer in saliency._sum}


def _former_path(path, config, steps, graphs=False, on_step=None):
    """The offloaded run with the saliency window read by `cache.read_k` (a resolve that drops the holder)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(method, "window_reader", lambda *args: None)
        return _run(path, config, steps, graphs, on_step=on_step)


def _assert_exact(ours, former):
    assert ours[0] == former[0]
    for x, y in zip(ours[1], former[1]):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    _assert_same_sums(_sums(ours[3]), _sums(former[3]))


def _assert_same_sums(a, b):
    assert a.keys() == b.keys()
    for layer in a:
        for x, y in zip(a[layer], b[layer]):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


def _spy_readers(monkeypatch):
    """Counts [window_keys reads, store reads]; every window_keys read is checked against the store's keys."""
    calls = [0, 0]
    inner_rows, inner_store = decode_rows.DecodeRows.window_keys, decode_rows.store_key_reader

    def rows(self, cache, layer, limits):
        read = inner_rows(self, cache, layer, limits)

        def checked(slots, key_pos):
            calls[0] += 1
            keys = read(slots, key_pos)
            torch.testing.assert_close(keys, cache.read_k_store(layer, slots), rtol=0, atol=0)
            return keys

        return checked

    def store(cache, layer):
        read = inner_store(cache, layer)
        if read is None:
            return None

        def counted(slots, key_pos):
            calls[1] += 1
            return read(slots, key_pos)

        return counted

    monkeypatch.setattr(decode_rows.DecodeRows, "window_keys", rows)
    monkeypatch.setattr(decode_rows, "store_key_reader", store)
    return calls


@pytest.mark.parametrize("window,refresh,from_rows", [(48, REFRESH, True), (64, REFRESH, True), (64, (6, 3, 3), False)])
def test_refresh_reads_the_window_without_a_resolve(tiny_llama_dir, monkeypatch, window, refresh, from_rows):
    """stream 64 >= window + P - 2: kept rows from the second step on (64, P = 2: the boundary); 64 < 64 + 3 - 2:
    the store. Keys equal the store's, sums and tokens equal resident."""
    config = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": refresh, "landmark_window": window})
    steps = 12
    resident = _generate(tiny_llama_dir, config, None, [random_ids(700, seed=31)], steps)
    former = _former_path(tiny_llama_dir, config, steps)
    calls = _spy_readers(monkeypatch)
    ours = _run(tiny_llama_dir, config, steps, graphs=False)
    _assert_same(ours, resident)
    _assert_exact(ours, former)
    layers = ours[3].model_config.num_layers
    refreshes = sum(any(s % r == 0 for r in refresh) for s in range(steps - 1))
    if from_rows:  # the first decode step has nothing kept: the store
        assert calls == [(refreshes - 1) * layers, layers]
    else:
        assert calls == [0, refreshes * layers]


def test_graphs_give_the_same_saliency(tiny_llama_dir):
    config = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": REFRESH})
    steps = 12
    resident = _generate(tiny_llama_dir, config, None, [random_ids(700, seed=31)], steps)
    former = _former_path(tiny_llama_dir, config, steps, graphs=True)
    ours = _run(tiny_llama_dir, config, steps, graphs=True)
    assert ours[3].runner.graph_decoder.replays > 0
    _assert_same(ours, resident)
    _assert_exact(ours, former)


def test_an_eviction_before_a_refresh_reads_the_store(tiny_llama_dir, monkeypatch):
    """Evict every row before decode step 4 (refreshes the last stage): it reads the store; sums equal resident.
    Control: with the holder surviving that resolve, the kept rows are trusted and the sums differ."""
    config = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": REFRESH})
    steps = 8
    resident = _generate(tiny_llama_dir, config, None, [random_ids(700, seed=31)], steps)

    def evict(engine, done):
        if done == 4:
            _evict_everything(engine)

    former = _former_path(tiny_llama_dir, config, steps, on_step=evict)
    calls = _spy_readers(monkeypatch)
    ours = _run(tiny_llama_dir, config, steps, graphs=False, on_step=evict)
    _assert_same(ours, resident)
    _assert_exact(ours, former)
    layers = ours[3].model_config.num_layers
    assert calls[1] == 2 * layers  # steps 0 and 4

    # the control: resolve_attention no longer drops the holder (and window_keys is no longer checked)
    monkeypatch.undo()
    monkeypatch.setattr(OffloadedKV, "resolve_attention",
                        lambda self, layer, slots: resolve(self.attention_bank, self.store, layer, slots, impl=self.impl))
    stale = _run(tiny_llama_dir, config, steps, graphs=False, on_step=evict)
    sums, want = _sums(stale[3]), _sums(former[3])
    assert any(not torch.equal(x, y) for layer in want for x, y in zip(sums[layer], want[layer]))

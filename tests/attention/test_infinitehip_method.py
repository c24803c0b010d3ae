"""The `infinitehip` method inside the engine (tiny random Llama-3 model): equivalences and invariants."""

from __future__ import annotations


import pytest
import torch

from infinitehip import SamplingParams
from infinitehip.attention.methods.infinitehip.config import PRESETS, InfiniteHiPConfig, infinitehip_preset
from tests.conftest import engine_for_dir, random_ids

# The hierarchy alone (question_tokens=0, as the paper): question-time selection has its own tests
# (test_question_selection.py).
SMALL = dict(sink_tokens=16, stream_tokens=64, query_block_sizes=(32, 16, 8), chunk_sizes=(64, 16, 4),
             keep_tokens=(512, 128, 32), early_last_keep_tokens=64, refresh_intervals=(4, 2, 1), early_layers=1,
             landmark_window=48, question_tokens=0)


def _engine(path, method="infinitehip", config=None, **kw):
    return engine_for_dir(path, None, config, method=method, **{"max_context_tokens": 2048, **kw})


@pytest.mark.parametrize("dense_when_unpruned", [False, True])
def test_equals_dense_when_everything_fits_in_sink_and_window(tiny_llama_dir, dense_when_unpruned):
    """The sparse path with every key kept, and its dense shortcut, both equal dense attention."""
    ids = random_ids(700)
    dense = _engine(tiny_llama_dir, "dense", prefill_chunk_size=256).prompt_logits(ids)
    wide = InfiniteHiPConfig(**{**SMALL, "stream_tokens": 1024, "dense_when_unpruned": dense_when_unpruned})
    ours = _engine(tiny_llama_dir, config=wide, prefill_chunk_size=256).prompt_logits(ids)
    torch.testing.assert_close(ours, dense, rtol=1e-5, atol=1e-5)


def test_dense_shortcut_only_while_nothing_is_pruned(tiny_llama_dir):
    """With the shortcut on, a prompt longer than sink + stream + keep still prunes (logits differ from dense)."""
    ids = random_ids(600, seed=3)
    dense = _engine(tiny_llama_dir, "dense", prefill_chunk_size=128).prompt_logits(ids)
    ours = _engine(tiny_llama_dir, config=InfiniteHiPConfig(**SMALL), prefill_chunk_size=128).prompt_logits(ids)
    short = 16 + 64 + 32  # sink + stream + last stage keep in late layers: identical up to here
    torch.testing.assert_close(ours[:short], dense[:short], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours[-64:], dense[-64:], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("representative", ["bisection", "landmark"])
@pytest.mark.parametrize("impl", [pytest.param("triton", marks=pytest.mark.slow), "auto"])  # interpreter: ~1 min each
def test_kernels_match_reference_in_the_engine(tiny_llama_dir, impl, representative):
    """Pruning + sparse attention through Triton (interpreted on CPU) or SDPA == the eager oracles, with both
    representative modes (SelectRep's bisection kernel; landmark's salient-token and representative-score kernels)."""
    ids = random_ids(300, seed=1)  # stages 2 and 3 still score (more chunks than they keep)
    ref = _engine(tiny_llama_dir, config=InfiniteHiPConfig(**SMALL, impl="reference", representative=representative), prefill_chunk_size=128)
    if impl == "triton":
        other = _engine(tiny_llama_dir, config=InfiniteHiPConfig(**SMALL, impl="triton", representative=representative), prefill_chunk_size=128)
        torch.testing.assert_close(other.prompt_logits(ids), ref.prompt_logits(ids), rtol=1e-3, atol=1e-3)
    else:  # "auto" on CPU: reference pruning + SDPA attention
        other = _engine(tiny_llama_dir, config=InfiniteHiPConfig(**SMALL, representative=representative), prefill_chunk_size=128)
        torch.testing.assert_close(other.prompt_logits(ids), ref.prompt_logits(ids), rtol=1e-4, atol=1e-4)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    outs = []
    for engine in (ref, other):
        seq = engine.add_request(ids, params)
        while engine.has_work:
            engine.step()
        outs.append(seq.output_ids)
    assert outs[0] == outs[1]


@pytest.mark.parametrize("representative", ["bisection", "landmark"])
def test_sparse_selection_really_prunes_and_stays_causal(tiny_llama_dir, representative):
    """Logits before the query block holding the first changed token never change, while pruning does
    change the result vs dense. (Within one stage-1 query block the selection is shared, as in the
    paper: it is scored with all the block's queries; keys after a query are never read.)"""
    a, b = random_ids(900, seed=2), random_ids(900, seed=2)
    b[600:] = random_ids(300, seed=3)
    config = InfiniteHiPConfig(**SMALL, representative=representative)
    engine = _engine(tiny_llama_dir, config=config, prefill_chunk_size=128)
    la, lb = engine.prompt_logits(a), engine.prompt_logits(b)
    block_start = 512 + (600 - 512) // 32 * 32  # chunk starts at 512, stage-1 blocks of 32 queries
    torch.testing.assert_close(la[:block_start], lb[:block_start], rtol=0, atol=0)
    assert not torch.equal(la[block_start:600], lb[block_start:600])  # the shared block does see the change
    dense = _engine(tiny_llama_dir, "dense", prefill_chunk_size=128).prompt_logits(a)
    assert (la[-100:] - dense[-100:]).abs().max() > 1e-3  # 900 tokens >> 16 + 64 + 64 attended: sparse


@pytest.mark.parametrize("representative", ["bisection", "landmark"])
def test_mask_cache_refreshes_each_stage_on_its_interval(tiny_llama_dir, representative):
    engine = _engine(tiny_llama_dir, config=InfiniteHiPConfig(**SMALL, representative=representative))
    seq = engine.add_request(random_ids(500), SamplingParams(temperature=0.0, max_tokens=17, ignore_eos=True))
    state = None
    while engine.has_work:
        engine.step()
        state = seq.method_state
    layers, decode_steps = 2, 16  # the first token comes from prefill
    expected = [layers * len(range(0, decode_steps, r)) for r in SMALL["refresh_intervals"]]
    assert state.refreshes == expected


def test_presets_match_the_paper():
    assert PRESETS["3k"].chunk_sizes == (256, 32, 8) and PRESETS["3k"].keep_tokens == (32768, 8192, 2048)
    assert PRESETS["3k"].keep_tokens_for(0, 2) == 4096 and PRESETS["3k"].keep_tokens_for(3, 2) == 2048
    assert PRESETS["3k-fast"].refresh_intervals == (32, 16, 8) and PRESETS["3k-flash"].refresh_intervals == (96, 24, 8)
    assert PRESETS["5k"].chunk_sizes == (64, 32, 16) and PRESETS["5k"].keep_tokens == (32768, 16384, 4096)
    assert infinitehip_preset("3k", stream_tokens=512).stream_tokens == 512


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(keep_tokens=(32768, 65536, 2048)), "keep_tokens\\[1\\]"),
        (dict(chunk_sizes=(256, 48, 8)), "chunk_sizes\\[1\\]"),
        (dict(keep_tokens=(32768, 8192, 2050)), "keep_tokens\\[2\\]"),
        (dict(early_pruning_rope="yarn"), "early_pruning_rope"),
        (dict(attention_rope="relative"), "attention_rope"),
        (dict(refresh_intervals=(16, 8)), "refresh_intervals"),
        (dict(sink_tokens=-1), "sink_tokens"),
    ],
)
def test_config_errors_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        infinitehip_preset("3k", **overrides)


def test_unknown_preset_lists_available():
    with pytest.raises(ValueError, match="3k-fast"):
        infinitehip_preset("7k")

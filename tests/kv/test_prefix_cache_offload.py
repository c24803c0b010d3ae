"""Prefix caching with the KV offloaded (host store + GPU banks): the store is the page pool, so cached pages live
in host memory; a hit reads them through the banks, and InfiniteHiP's private tail is copied store to store."""

from __future__ import annotations

from infinitehip import SamplingParams
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from tests.conftest import engine_for_dir, random_ids
from tests.attention.test_infinitehip_method import SMALL
from tests.engine.test_offload_engine import FEW_GROUPS, HEADS, _smallest_banks

CONFIG = InfiniteHiPConfig(**{**SMALL, "question_tokens": 8, "question_keep_tokens": 32, "question_window": 3})


def _run(engine, prompt):
    seq = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    while engine.has_work:
        engine.step()
    return seq


def test_offloaded_prefix_hit_equals_a_resident_run_without_caching(tiny_llama_dir):
    doc = random_ids(384, seed=31)
    q1, q2 = doc + random_ids(40, seed=32), doc + random_ids(50, seed=33)
    make = lambda offload, **kw: engine_for_dir(tiny_llama_dir, None, CONFIG, offload, method="infinitehip",
                                                max_context_tokens=800, prefill_chunk_size=128, page_size=16, max_num_seqs=1, **kw)
    expected = _run(make(None, enable_prefix_caching=False), q2).output_ids
    engine = make(_smallest_banks(CONFIG, HEADS, mask_bank=FEW_GROUPS))  # (the mask bank is not the subject)
    assert engine.kv_plan is not None and engine.prefix is not None
    _run(engine, q1)
    seq = _run(engine, q2)
    assert seq.cached_prompt_tokens == 384 and seq.output_ids == expected

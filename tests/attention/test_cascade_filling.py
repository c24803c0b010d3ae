"""The cascade while its sub-caches fill, through the engine (tiny random Llama-3 model, fp32, CPU): the slots of a
sub-cache past its count hold no token of it (what the first prefill chunk wrote there before the push), and the
method attends only the held ones (schedule.held_slots). Poisoning every other slot of the sequence with large
random keys and values must leave each decode step's logits exactly as they were; with `held_slots` answering
"every slot" (the bug it fixed) the same poison changes them, which is what makes the first check mean something."""

from __future__ import annotations

import pytest
import torch

from infinitehip import SamplingParams
from infinitehip.attention.methods.cascade.config import CascadeConfig
from infinitehip.attention.methods.cascade.schedule import CascadeSchedule
from tests.cascade_helpers import slots_receiving_a_token
from tests.conftest import engine_for_dir, random_ids, record_step_logits

# 2 sinks + 5 sub-caches of 6 + a 6-token stride: 38 slots; the first push (36 tokens) leaves sub-cache 3 with 3
# tokens and sub-cache 4 empty (the cache fills after 2^4 * 6 - 2^3 + 1 = 89 pushes); a 41-token prompt is 38 + 3.
CONFIG = CascadeConfig(sink_tokens=2, cache_tokens=32, num_subcaches=5, stride_tokens=6, impl="auto")
PROMPT, STEPS = 41, 9  # decode crosses the second push (the stride fills at 38 tokens) and stays filling


def _decode_logits(model_dir, impl: str, poison: bool) -> tuple[list[torch.Tensor], list[int], int]:
    """Prefill the prompt, optionally poison every slot of the sequence that is not attended, decode STEPS tokens
    -> (each decode step's logits, output ids, slots poisoned)."""
    config = CascadeConfig(**{**CONFIG.__dict__, "impl": impl})
    engine = engine_for_dir(model_dir, None, config, method="cascade", max_context_tokens=2048)
    seq = engine.add_request(random_ids(PROMPT, seed=3),
                             SamplingParams(temperature=0.0, max_tokens=STEPS + 1, ignore_eos=True))
    while seq.in_prefill:
        engine.step()
    schedule: CascadeSchedule = seq.method_state.schedule
    assert schedule.pushed == CONFIG.limit_tokens - CONFIG.sink_tokens and not schedule.full
    assert seq.num_cached == CONFIG.kept_tokens + PROMPT - CONFIG.limit_tokens
    poisoned = 0
    if poison:
        # the slots holding a token, by the paper's rule on plain lists (not the method's own held_slots)
        held = set(slots_receiving_a_token(CONFIG.sink_tokens, CONFIG.num_subcaches, CONFIG.subcache_tokens,
                                           schedule.pushed)[-1])
        held |= set(range(schedule.kept, seq.num_cached))  # the stride's tokens so far
        cache, runner = engine.runner.cache, engine.runner
        table = runner.page_table(seq)
        free = [s for s in range(table.numel() * cache.page_size) if s not in held]
        slots = cache.slots(table, 0, table.numel() * cache.page_size)[torch.tensor(free)]
        g = torch.Generator().manual_seed(7)
        for layer in range(cache.num_layers):
            for flat in (cache.flat_k(layer), cache.flat_v(layer)):
                flat[slots] = 1e3 * torch.randn(flat[slots].shape, generator=g)
        poisoned = len(free)
    logits = record_step_logits(engine)
    while engine.has_work:
        engine.step()
    assert len(logits) == STEPS and seq.method_state.schedule.pushed > CONFIG.limit_tokens - CONFIG.sink_tokens
    return logits, seq.output_ids, poisoned


@pytest.mark.parametrize("impl", ["auto", "reference"])
def test_decode_never_reads_the_slots_a_filling_cascade_does_not_hold(tiny_llama_dir, impl, monkeypatch):
    """After the first push the cache is still filling; every slot of the sequence's pages not held (the empty
    sub-cache's and the partial one's rest, the stride's slots ahead) gets 1e3-scale random k/v: the decode steps'
    logits (across the next push, which fills some of those slots with real tokens) are the unpoisoned run's,
    bit for bit. With held_slots patched to "every kept slot" the same poison changes them."""
    clean, clean_ids, _ = _decode_logits(tiny_llama_dir, impl, poison=False)
    dirty, dirty_ids, poisoned = _decode_logits(tiny_llama_dir, impl, poison=True)
    # kept slots without a token: sub-cache 3's last 3 and sub-cache 4's 6; then the pages' slots past the stride's 3
    assert poisoned >= 9 + CONFIG.stride_tokens - 3
    assert dirty_ids == clean_ids
    for step, (a, b) in enumerate(zip(clean, dirty)):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=lambda m: f"decode step {step}: {m}")

    monkeypatch.setattr(CascadeSchedule, "held_slots", lambda self: None)  # the bug: every kept slot attended
    clean, _, _ = _decode_logits(tiny_llama_dir, impl, poison=False)
    dirty, _, _ = _decode_logits(tiny_llama_dir, impl, poison=True)
    assert (dirty[0] - clean[0]).abs().max() > 1e-2

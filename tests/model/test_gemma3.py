"""Gemma 3 (hybrid sliding-window / full-attention layers) on a tiny random model: every method governs only the
full-attention layers, sliding layers keep a fixed ring buffer. Logits against transformers, chunked prefill,
decode and preemption run over this model through the `tiny_hf_model` fixture (conftest.TINY_CONFIGS["gemma3"])."""

from __future__ import annotations


import pytest
import torch

from infinitehip import SamplingParams
from infinitehip.attention.methods.infinipot.config import InfiniPotConfig
from infinitehip.attention.registry import create_method
from infinitehip.attention.methods.streaming.config import StreamingConfig
from infinitehip.config.methods import METHODS, method_spec
from infinitehip.config.model import ModelConfig
from tests.conftest import TINY_CONFIGS, closure_graph_decoder, engine_for_dir, random_ids, record_step_logits
from tests.attention.test_infinitehip_method import SMALL as SMALL_IH

# Settings whose budgets a 600-token prompt exceeds, so each method really selects / evicts / distils.
SMALL = {
    "infinitehip": method_spec("infinitehip").config(**SMALL_IH),
    "tokenselect": method_spec("tokenselect").config(select_tokens=64, sink_tokens=8, local_tokens=32,
                                                     query_block_size=32, question_tokens=8, question_select_tokens=32),
    "infinipot": InfiniPotConfig(pot_tokens=160, compressed_tokens=48, novelty_fraction=0.5,
                                 catalyst_prompt="in the re on at"),
    "streaming": StreamingConfig(sink_tokens=4, window_tokens=60, eviction_batch_tokens=40),
    "truncate": method_spec("truncate").config(window_tokens=300),
}


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(TINY_CONFIGS["gemma3"](), attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("gemma3")
    model.save_pretrained(path)
    return path


def _generate(engine, prompts, max_tokens):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    seqs = [engine.add_request(ids, params) for ids in prompts]
    while engine.has_work:
        engine.step()
    return [s.output_ids for s in seqs]


def test_config_reads_layer_types_thetas_and_views(gemma_dir):
    mc = ModelConfig.from_dir(gemma_dir)
    assert mc.is_gemma and mc.full_layers == (2, 5) and mc.sliding_layers == (0, 1, 3, 4)
    assert (mc.rope_theta, mc.sliding_rope_theta, mc.sliding_window) == (1e6, 1e4, 16)
    view = mc.method_view()
    assert view.num_layers == 2 and view.full_layers == (0, 1) and view.rope_theta == 1e6
    assert mc.sliding_view().rope_theta == 1e4
    # Older configs give only the pattern: every 6th layer is global.
    old_dict = {"model_type": "gemma3_text", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
                "num_hidden_layers": 12, "num_attention_heads": 1, "head_dim": 8, "sliding_window": 4}
    old = ModelConfig.from_hf_dict(old_dict)
    assert old.full_layers == (5, 11) and old.tie_word_embeddings
    # Attention soft-capping (Gemma 2's; issue 22) is read: dense and the sliding layers apply it, other methods refuse.
    capped = ModelConfig.from_hf_dict({**old_dict, "attn_logit_softcapping": 50.0})
    assert capped.attn_logit_softcapping == 50.0
    with pytest.raises(ValueError, match="soft-capping"):
        create_method("infinitehip", capped.method_view())


def test_kv_cache_holds_only_full_layers_and_ring_memory_is_fixed(gemma_dir):
    small = engine_for_dir(gemma_dir, method="dense", max_context_tokens=512)
    big = engine_for_dir(gemma_dir, method="dense", max_context_tokens=4096)
    for engine in (small, big):
        assert engine.cache.k.shape[0] == 2  # the two full-attention layers
    a, b = small.kv_memory(), big.kv_memory()
    assert b["full_attention"]["bytes"] > 7 * a["full_attention"]["bytes"]
    assert a["sliding_attention"] == b["sliding_attention"]
    assert a["sliding_attention"]["bytes_per_sequence"] == 2 * 4 * 16 * 1 * 32 * 4  # k+v, layers, window, Hkv, d, fp32


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_short_input_equals_dense_and_frees_rows(gemma_dir, tokenizer, method):
    """Within every method's budgets a hybrid model's greedy output is dense's; pages and ring rows are freed."""
    ids = random_ids(120, seed=6)
    (dense,) = _generate(engine_for_dir(gemma_dir, method="dense", max_context_tokens=2048), [ids], 8)
    engine = engine_for_dir(gemma_dir, tokenizer, method=method, max_context_tokens=2048)
    assert _generate(engine, [ids], 8) == [dense]
    assert engine.scheduler.allocator.num_free == engine.scheduler.allocator.num_pages
    assert not engine.sliding._rows and len(engine.sliding._free) == engine.sliding.k.shape[1]


@pytest.mark.parametrize("method", sorted(SMALL))
def test_every_method_past_its_budget_batched_equals_alone(gemma_dir, tokenizer, method):
    """Prompts past the budgets (the method selects on the full layers): sequences sharing steps get what each
    gets alone, so the ring rows of different sequences never mix. Both prompts fit one step's prefill budget, so
    each is prefilled in one chunk, together or alone (block-wise selection depends on chunk boundaries)."""
    prompts = [random_ids(600, seed=7), random_ids(350, seed=8)]
    make = lambda: engine_for_dir(gemma_dir, tokenizer, SMALL[method], method=method, max_context_tokens=2048,
                                  prefill_chunk_size=1024, page_size=16)
    alone = [_generate(make(), [ids], 6)[0] for ids in prompts]
    assert _generate(make(), prompts, 6) == alone


def test_extra_forward_tokens_never_enter_the_ring(gemma_dir, tokenizer):
    """InfiniPot runs its catalyst prompt after each pot (ChunkHooks.extra_forward); those tokens' keys must not
    overwrite the window the sequence's next chunk reads."""
    engine = engine_for_dir(gemma_dir, tokenizer, SMALL["infinipot"], method="infinipot", max_context_tokens=2048,
                            prefill_chunk_size=64, page_size=16)
    runner, calls = engine.runner, []
    inner = runner._extra_forward

    def checked(seq, ids):
        before = engine.sliding.k.clone(), engine.sliding.v.clone()
        out = inner(seq, ids)
        assert torch.equal(engine.sliding.k, before[0]) and torch.equal(engine.sliding.v, before[1])
        calls.append(ids.numel())
        return out

    runner._extra_forward = checked
    _generate(engine, [random_ids(500, seed=9)], 4)
    assert calls, "the pot must have been distilled at least once"


def test_graph_decode_equals_eager(gemma_dir):
    """The CUDA-graph decode path (graph semantics on CPU; infinitehip is the method with graph decode) reads the
    ring's positions from the static buffers."""
    method, config = "infinitehip", SMALL["infinitehip"]

    def run(graphs: bool):
        engine = engine_for_dir(gemma_dir, None, config, method=method, max_context_tokens=2048, prefill_chunk_size=128)
        decoder = closure_graph_decoder(engine) if graphs else None
        logits = record_step_logits(engine)
        out = _generate(engine, [random_ids(300, seed=10)], 24)
        return out, logits, decoder

    eager, eager_logits, _ = run(False)
    ours, logits, decoder = run(True)
    assert ours == eager and decoder.replays > 0
    for a, b in zip(logits, eager_logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_offloaded_kv_holds_the_full_layers_and_equals_resident(gemma_dir):
    """KV offloading (host store + GPU banks) covers the method's layers of a hybrid model: the store holds the two
    full-attention layers, the sliding layers keep their rings on the device; tokens and logits equal resident."""
    from tests.engine.test_offload_engine import CONTEXT, _smallest_banks

    config = SMALL["infinitehip"]
    heads = TINY_CONFIGS["gemma3"]().num_attention_heads
    # a mask bank of 5 chunks' representatives (stages still scored in several groups; the smallest one, 1 chunk,
    # made the offloaded prefill ~6,000 resolve calls): the subject is which layers the store holds
    offload = _smallest_banks(config, heads, mask_bank=5 * heads)

    def run(offload):
        engine = engine_for_dir(gemma_dir, None, config, offload, method="infinitehip",
                                max_context_tokens=CONTEXT, prefill_chunk_size=128, max_num_seqs=1)
        logits = record_step_logits(engine)
        return _generate(engine, [random_ids(700, seed=11)], 8), logits, engine

    resident, resident_logits, _ = run(None)
    ours, logits, engine = run(offload)
    assert engine.kv_plan is not None and engine.cache.bytes_per_token == engine.kv_memory()["full_attention"]["bytes_per_token"]
    assert ours == resident
    for a, b in zip(logits, resident_logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["dense", "infinitehip"])
def test_a_batch_graph_reads_each_sequences_own_sliding_window_ring(gemma_dir, method):
    """Several sequences in one decode graph of a hybrid model (engine/graph_decode.py): the sliding layers read each
    one's ring row (a device tensor the graph keeps), so every sequence decodes the greedy tokens it decodes alone."""
    from tests.engine.test_batch_graphs import _decode

    config = SMALL.get(method)
    requests = [(random_ids(400, seed=41), 10, 0), (random_ids(250, seed=42), 8, 2)]

    def engine(graphs: bool):
        e = engine_for_dir(gemma_dir, None, config, method=method, max_context_tokens=2048, prefill_chunk_size=2048,
                           max_num_seqs=4)
        return e, closure_graph_decoder(e) if graphs else None

    alone = [_decode(engine(False)[0], [(p, n, 0)])[0] for p, n, _ in requests]
    e, decoder = engine(True)
    assert _decode(e, requests) == alone
    assert decoder.batch_replays >= 1

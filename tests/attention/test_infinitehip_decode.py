"""The sync-free, fixed-shape decode step of `infinitehip` (attention/methods/infinitehip/decode.py) against an oracle.

The oracle is the straightforward algorithm with data-dependent shapes: each refreshing stage runs the prefill
machinery (`run_stage`: candidates only up to the limit, top-k only when there are more chunks than kept) on a
one-query block, keys are assembled by `assemble_keys`, positions by `attention_positions`, and the eager
reference sparse attention reads them. Every layer's attention output of every decode step must match.
"""

from __future__ import annotations


import pytest
import torch

from infinitehip import SamplingParams
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.attention.methods.infinitehip.method import InfiniteHiPAttention
from infinitehip.attention.methods.infinitehip.positions import attention_positions
from infinitehip.attention.methods.infinitehip.pruning import assemble_keys, query_blocks
from infinitehip.attention.ops.sparse.op import sparse_attention_decode
from tests.conftest import closure_graph_decoder, engine_for_dir, random_ids, record_step_logits
from tests.attention.test_infinitehip_method import SMALL


class OracleDecode(InfiniteHiPAttention):
    """Decode with data-dependent shapes, one sequence at a time (the algorithm as written in the paper)."""

    def decode(self, layer, q, seqs, batch):
        c = self.config
        outs = []
        for i, seq in enumerate(seqs):
            caches = seq.state.__dict__.setdefault("oracle_cache", {})
            step = seq.state.decode_steps[layer]
            if self.saliency is not None:
                self.saliency.update(layer, q[i : i + 1], seq.start_pos, seq.page_table, seq.cache, batch.rope)
            blocks = query_blocks(q[i : i + 1], seq.start_pos, 1)
            parent = None
            for s, spec in enumerate(self._specs(layer, decode=True)):
                if (layer, s) not in caches or step % c.refresh_intervals[s] == 0:
                    caches[layer, s] = self._stage(spec, blocks, parent, layer, seq, batch)
                parent = caches[layer, s]
            seq.state.decode_steps[layer] += 1
            window_start = torch.stack([caches[layer, s].limit for s in range(c.num_stages)]).amin(0)
            width = max(0, int((blocks.last_position + 1 - window_start).max()))  # cached stages: wider than stream
            tokens, count = assemble_keys(parent, blocks.last_position, window_start, c.sink_tokens, width)
            key_rope, query_rope = attention_positions(c.attention_rope, tokens, count, window_start, blocks.positions[0],
                                                       torch.zeros(1, dtype=torch.long), seq.context_len, self.trained_len)
            batch.rope.ensure(int(key_rope.max()) + 1)
            outs.append(sparse_attention_decode(
                q[i : i + 1], seq.cache.flat_k(layer), seq.cache.flat_v(layer), seq.page_table[None], seq.cache.page_size,
                tokens.int(), count.int(), key_rope, query_rope, batch.rope.cos, batch.rope.sin, self.sm_scale,
                impl="reference"))
        return torch.cat(outs)


def _run(path, method_cls, config, prompts, steps):
    """Greedy decode of `prompts` together; returns (outputs per sequence, {(step, layer): decode attention output})."""
    engine = engine_for_dir(path, None, config, method="infinitehip", max_context_tokens=2048, prefill_chunk_size=128)
    method = method_cls(engine.model_config, config)
    engine.method = engine.runner.method = method
    recorded, calls = {}, {"n": 0}
    inner = method.decode

    def recording(layer, q, seqs, batch):
        out = inner(layer, q, seqs, batch)
        recorded[calls["n"] // engine.model_config.num_layers, layer] = out.clone()
        calls["n"] += 1
        return out

    method.decode = recording
    seqs = [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)) for p in prompts]
    while engine.has_work:
        engine.step()
    return [s.output_ids for s in seqs], recorded


@pytest.mark.parametrize("representative,refresh,aggregation", [
    ("landmark", (4, 2, 1), "max"), ("landmark", (8, 4, 2), "max"), ("landmark", (6, 3, 3), "softmax"),
    ("bisection", (4, 2, 1), "zscore")])
@pytest.mark.parametrize("attention_rope", ["streaming", "infllm", "dynamic"])
def test_static_decode_equals_oracle(tiny_llama_dir, representative, refresh, aggregation, attention_rope):
    """Prompt past every stage's keep (stage 1 prunes), 12 steps: every stage refreshes and is reused. With
    min(refresh) > 1 the landmark saliency of decode queries is applied late (at refreshes), which must not
    change anything: the oracle applies it at every step."""
    config = InfiniteHiPConfig(**{**SMALL, "representative": representative, "attention_rope": attention_rope,
                                  "refresh_intervals": refresh, "head_aggregation": aggregation,
                                  "impl": "reference", "late_pruning_rope": "dynamic" if attention_rope == "dynamic" else "relative"})
    prompt = random_ids(700, seed=11)
    ours, rec = _run(tiny_llama_dir, InfiniteHiPAttention, config, [prompt], 12)
    ref, rec_ref = _run(tiny_llama_dir, OracleDecode, config, [prompt], 12)
    assert ours == ref
    assert rec.keys() == rec_ref.keys() and len(rec) == 11 * 2  # the first token comes from prefill
    for key in rec:
        torch.testing.assert_close(rec[key], rec_ref[key], rtol=1e-5, atol=1e-5, msg=lambda m: f"step/layer {key}: {m}")


def test_static_decode_batched_equals_oracle(tiny_llama_dir):
    """Two sequences of different lengths decoding in the same steps (padded page tables, one BSA launch)."""
    config = InfiniteHiPConfig(**SMALL, impl="reference")
    prompts = [random_ids(700, seed=12), random_ids(300, seed=13)]
    ours, rec = _run(tiny_llama_dir, InfiniteHiPAttention, config, prompts, 6)
    ref, rec_ref = _run(tiny_llama_dir, OracleDecode, config, prompts, 6)
    assert ours == ref
    for key in rec_ref:
        torch.testing.assert_close(rec[key], rec_ref[key], rtol=1e-5, atol=1e-5)


def test_static_decode_shapes_do_not_depend_on_position(tiny_llama_dir):
    """What makes the step capturable: the key list has the same width at every step, and the stage caches
    are the same tensors (updated in place) for the whole decode."""
    config = InfiniteHiPConfig(**SMALL, impl="reference")
    engine = engine_for_dir(tiny_llama_dir, None, config, method="infinitehip", max_context_tokens=2048, prefill_chunk_size=128)
    widths, ptrs = set(), []
    import infinitehip.attention.methods.infinitehip.method as method_module

    inner = method_module.decode_key_list  # the key list op: (tokens, counts, key rope, query rope)

    def spy(*args, **kw):
        out = inner(*args, **kw)
        widths.add(out[0].shape[1])
        return out

    method_module.decode_key_list = spy
    try:
        seq = engine.add_request(random_ids(500, seed=14),
                                 SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True))
        while engine.has_work:
            engine.step()
            if seq.method_state.stage_cache[1] is not None:
                ptrs.append([c.starts.data_ptr() for c in seq.method_state.stage_cache[1]])
    finally:
        method_module.decode_key_list = inner
    c = config
    assert widths == {c.sink_tokens + c.keep_tokens_for(layer, c.num_stages - 1) + c.stream_tokens + max(c.refresh_intervals)
                      for layer in range(2)}
    assert len(ptrs) >= 8 and all(p == ptrs[0] for p in ptrs)


@pytest.mark.parametrize("overrides", [{}, {"refresh_intervals": (4, 2, 2), "question_tokens": 16,
                                          "question_keep_tokens": 32}])
def test_graph_decoder_replays_equal_eager_decode(tiny_llama_dir, overrides):
    """The engine's graph decode path with graph semantics on CPU (ClosureRecorder re-runs the Python of the
    capture with the host values of that moment): same tokens and logits as eager decode, a graph per refresh
    pattern, everything else replayed, and the mask-cache refresh counts unchanged. With question-time selection
    the question's chunks are joined to the last stage's when it refreshes (every other step here) and replayed
    from the joined buffers in between."""
    config = InfiniteHiPConfig(**{**SMALL, **overrides})
    prompt, steps = random_ids(700, seed=15), 20

    def run(graphs: bool):
        engine = engine_for_dir(tiny_llama_dir, None, config, method="infinitehip", max_context_tokens=2048,
                                prefill_chunk_size=128)
        if graphs:
            closure_graph_decoder(engine)
        logits = record_step_logits(engine)
        seq = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True))
        state = None
        while engine.has_work:
            engine.step()
            state = seq.method_state
        return seq.output_ids, logits, list(state.refreshes), engine.runner.graph_decoder

    eager_ids, eager_logits, eager_refreshes, _ = run(False)
    ids, logits, refreshes, decoder = run(True)
    assert ids == eager_ids and refreshes == eager_refreshes
    assert len(logits) == len(eager_logits)
    for a, b in zip(logits, eager_logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # Refresh intervals (4, 2, 1): patterns (T,T,T), (F,F,T), (F,T,T) -> three graphs in one 1024 bucket (700 + 20
    # tokens); (4, 2, 2): (T,T,T), (F,F,F), (F,T,T). The first decode step allocates the stage caches eagerly.
    assert decoder.captures == 3 and decoder.replays == steps - 1 - 1 - 3


def test_static_decode_triton_kernels_equal_oracle(tiny_llama_dir):
    """The same step through the Triton kernels (interpreted on CPU: salient tokens, representative scores,
    top chunks, key list, sparse decode) against the oracle with the eager references."""
    # 250 tokens (interpreted prefill kernels dominate the time, ~quadratic in the prompt; 450 before): stage 0 keeps
    # its ~170 candidates (3 chunks of 64), stages 1-2 prune (11 chunks of 16 -> 8, 32 of 4 -> 8), as at 450.
    config = InfiniteHiPConfig(**{**SMALL, "refresh_intervals": (8, 4, 2)})
    prompt = random_ids(250, seed=16)
    ours, rec = _run(tiny_llama_dir, InfiniteHiPAttention, InfiniteHiPConfig(**{**config.__dict__, "impl": "triton"}), [prompt], 6)
    ref, rec_ref = _run(tiny_llama_dir, OracleDecode, InfiniteHiPConfig(**{**config.__dict__, "impl": "reference"}), [prompt], 6)
    assert ours == ref
    for key in rec_ref:
        torch.testing.assert_close(rec[key], rec_ref[key], rtol=1e-4, atol=1e-4)


def test_graph_decoder_drops_graphs_of_outgrown_buckets(tiny_llama_dir):
    """Crossing a capacity bucket captures the new bucket's graphs and frees the smaller bucket's (a sequence only
    grows, so they would never replay again); tokens stay equal to eager decode across the crossing."""
    config = InfiniteHiPConfig(**SMALL)
    prompt, steps = random_ids(500, seed=17), 20  # 500 + 20 tokens cross the 512 bucket

    def run(graphs: bool):
        engine = engine_for_dir(tiny_llama_dir, None, config, method="infinitehip", max_context_tokens=2048,
                                prefill_chunk_size=128)
        decoder = closure_graph_decoder(engine, min_bucket=256) if graphs else None
        seq = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True))
        held = []
        while engine.has_work:
            engine.step()
            if decoder is not None and decoder.graphs_of(seq.seq_id):
                held.append({k[0] for k in decoder.graphs_of(seq.seq_id)})
        return seq.output_ids, held

    eager, _ = run(False)
    ids, held = run(True)
    assert ids == eager
    assert {512} in held and held[-1] == {1024}  # the 512 graphs were captured, then dropped for the 1024 ones

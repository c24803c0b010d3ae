"""Tensor parallelism on CPU (gloo, 2 ranks): greedy tokens and their log-probabilities with tensor_parallel_size 2
equal the single-process run's for every registered attention method, on tiny random models (Llama with 4 KV heads
split 2 + 2; Gemma 3 with 1 KV head, replicated on both ranks), with budgets small enough that every sparse
method selects. The row/column-parallel layers and the vocab-parallel logits are checked against unsharded ones.

The spawned ranks are started once for the module (the engine keeps them between engines)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from infinitehip.attention.methods.cascade.config import CascadeConfig
from infinitehip.attention.methods.hip.config import HiPConfig
from infinitehip.attention.methods.infinipot.config import InfiniPotConfig
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.config.methods import METHODS
from infinitehip.attention.methods.streaming.config import StreamingConfig
from infinitehip.attention.methods.tokenselect.config import TokenSelectConfig
from infinitehip.attention.methods.truncate.config import TruncateConfig
from infinitehip.config.engine import EngineConfig
from infinitehip.config.model import ModelConfig
from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.model.loading import LoadedModel, random_model
from tests.tp_helpers import CharTokenizer, sharded_mlp_rank

LLAMA = ModelConfig(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                    num_heads=8, num_kv_heads=4, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                    max_position_embeddings=4096)
# Small budgets: a 300-token prompt is pruned, voted, distilled, evicted or truncated by every sparse method.
METHOD_CONFIGS = {
    "dense": None,
    "infinitehip": InfiniteHiPConfig(sink_tokens=8, stream_tokens=32, query_block_sizes=(32, 16, 8),
                                     chunk_sizes=(32, 8, 4), keep_tokens=(128, 64, 32), early_last_keep_tokens=64,
                                     refresh_intervals=(4, 2, 1), early_layers=1, landmark_window=24),
    # Pooled votes (vote_pool_size, question_window > 1) make runs of exactly equal scores, and torch.topk picks
    # among ties in no specified order: rounding elsewhere in the vote (the ranks' partial sums) can then pick
    # other, equally scored tokens. Without pooling the selection is a function of the scores.
    "tokenselect": TokenSelectConfig(select_tokens=24, sink_tokens=8, local_tokens=16, query_block_size=32,
                                     question_tokens=8, question_select_tokens=32, vote_pool_size=1,
                                     question_window=1),
    "infinipot": InfiniPotConfig(pot_tokens=160, compressed_tokens=48, catalyst_prompt="Summarise the text above."),
    "streaming": StreamingConfig(sink_tokens=4, window_tokens=60, eviction_batch_tokens=40),
    "truncate": TruncateConfig(window_tokens=120),
    # the hierarchy's segment scores combined over the ranks' heads (max): the one selection of a single process
    # within the tiny model's trained length (4096): exact, as dense; its pruned path is infinitehip's above
    "auto": InfiniteHiPConfig(sink_tokens=8, stream_tokens=32, query_block_sizes=(32, 16, 8), chunk_sizes=(32, 8, 4),
                              keep_tokens=(128, 64, 32), early_last_keep_tokens=64, refresh_intervals=(4, 2, 1),
                              early_layers=1, landmark_window=24, dense_within_trained=True),
    "cascade": CascadeConfig(sink_tokens=4, cache_tokens=52, num_subcaches=3, stride_tokens=24),
    "hip": HiPConfig(top_k_tokens=32, key_block_size=2, query_block_size=32, sink_tokens=8, window_tokens=32,
                     refresh_interval=4, dense_layers=1),
}
PROMPT = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(1)).tolist()


def loaded_model(config: ModelConfig) -> LoadedModel:
    model = random_model(config, torch.device("cpu"), torch.float32, seed=3)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():  # larger weights than random_model's: clear greedy margins, and norms that matter
        for name, p in model.named_parameters():
            p.mul_(4.0) if "norm" not in name else p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return LoadedModel(config, model, CharTokenizer(config.vocab_size), "tiny random", Path("."))


def generate(loaded: LoadedModel, method: str, size: int, max_tokens: int = 6) -> tuple[list[int], list[float]]:
    config = EngineConfig(device="cpu", dtype="float32", show_progress=False, method=method, max_context_tokens=512,
                          page_size=16, prefill_chunk_size=128, use_generation_config=False, tensor_parallel_size=size,
                          method_config=METHOD_CONFIGS.get(method))
    engine = LLMEngine(config, loaded)
    try:
        seq = engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                                        logprobs=0))
        while engine.has_work:
            engine.step()
        return seq.output_ids, [lp.logprob for lp in seq.output_logprobs]
    finally:
        engine.close()


@pytest.fixture(scope="module")
def llama():
    return loaded_model(LLAMA)


_DENSE: dict = {}


def dense_run(loaded: LoadedModel):
    if "tokens" not in _DENSE:
        _DENSE["tokens"] = generate(loaded, "dense", 1)
    return _DENSE["tokens"]


def test_every_method_is_tested():
    assert set(METHOD_CONFIGS) == set(METHODS)


@pytest.mark.parametrize("method", sorted(METHOD_CONFIGS))
def test_tp2_tokens_equal_single_process(llama, method):
    tokens, logprobs = generate(llama, method, 1)
    tp_tokens, tp_logprobs = generate(llama, method, 2)
    assert tp_tokens == tokens
    assert tp_logprobs == pytest.approx(logprobs, abs=1e-4)
    if method == "auto":  # within the trained length: dense attention's tokens and log-probabilities
        assert (tokens, pytest.approx(logprobs, abs=1e-4)) == dense_run(llama)
    elif method != "dense":  # the method selected: its tokens or log-probabilities are not dense attention's
        assert (tokens, pytest.approx(logprobs, abs=1e-4)) != dense_run(llama)


GEMMA3 = dataclasses.replace(LLAMA, model_type="gemma3_text", num_layers=3, num_kv_heads=1, qk_norm=True,
                             tie_word_embeddings=True, layer_types=("sliding_attention", "sliding_attention",
                                                                    "full_attention"),
                             sliding_window=16, sliding_rope_theta=10000.0, query_pre_attn_scalar=24.0,
                             final_logit_softcapping=30.0)


def test_tp2_replicated_kv_head_gemma3():
    """Gemma 3 (sliding-window + full layers, sandwich norms, tied embeddings) with one KV head: both ranks hold it."""
    loaded = loaded_model(GEMMA3)
    for method in ("dense", "infinitehip"):
        tokens, logprobs = generate(loaded, method, 1)
        tp_tokens, tp_logprobs = generate(loaded, method, 2)
        assert tp_tokens == tokens, method
        assert tp_logprobs == pytest.approx(logprobs, abs=1e-4), method


def test_unsupported_head_split_is_refused():
    smol_like = dataclasses.replace(LLAMA, num_heads=9, num_kv_heads=3)
    with pytest.raises(ValueError, match="attention heads"):
        LLMEngine(EngineConfig(device="cpu", dtype="float32", tensor_parallel_size=2), loaded_model(smol_like))
    with pytest.raises(ValueError, match="tensor_parallel_size must be positive"):
        EngineConfig(tensor_parallel_size=0)


def test_row_and_column_parallel_layers_equal_unsharded():
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    port = __import__("infinitehip.engine.parallel.launch", fromlist=["_free_port"])._free_port()
    procs = [context.Process(target=sharded_mlp_rank, args=(rank, 2, f"tcp://127.0.0.1:{port}", results))
             for rank in range(2)]
    for p in procs:
        p.start()
    out = sorted(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    for rank, mlp_err, logits_err, shape in out:
        assert shape == (5, 101)  # 101 rows split 51 + 50, the short block padded then cut
        assert mlp_err < 1e-5 and logits_err < 1e-5, (rank, mlp_err, logits_err)


DOC = PROMPT[:256]  # two prefill chunks of 128: the second question reuses both (dense) or the first (infinitehip)
QUESTIONS = [DOC + torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (20, 23)]


def ask_twice(loaded: LoadedModel, method: str, size: int, caching: bool) -> list[tuple[list[int], list[float], int]]:
    """Both questions on one engine: (greedy tokens, their log-probabilities, prompt tokens from the cache) each."""
    config = EngineConfig(device="cpu", dtype="float32", show_progress=False, method=method, max_context_tokens=512,
                          page_size=16, prefill_chunk_size=128, use_generation_config=False, tensor_parallel_size=size,
                          method_config=METHOD_CONFIGS.get(method), enable_prefix_caching=caching)
    engine = LLMEngine(config, loaded)
    try:
        out = []
        for prompt in QUESTIONS:
            seq = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0))
            while engine.has_work:
                engine.step()
            out.append((seq.output_ids, [lp.logprob for lp in seq.output_logprobs], seq.cached_prompt_tokens))
        return out
    finally:
        engine.close()


@pytest.mark.parametrize("model", ["llama", "gemma3"])
@pytest.mark.parametrize("method", ["dense", "infinitehip"])
def test_tp2_prefix_hit_equals_single_process_without_caching(llama, model, method):
    """Prefix caching with 2 ranks: every rank copies its shard of the hit's private pages and keeps its heads'
    boundary state (InfiniteHiP's landmark saliency, Gemma 3's sliding rings); the second question reuses the
    document and answers as one process with caching off."""
    loaded = llama if model == "llama" else loaded_model(GEMMA3)
    tp = ask_twice(loaded, method, 2, caching=True)
    plain = ask_twice(loaded, method, 1, caching=False)
    # the questions are shorter than infinitehip's 32 question tokens, which the scheduler computes in one last
    # chunk: its hit stops at the grid point before them
    assert [c for _, _, c in tp] == [0, 256 if method == "dense" else 128]
    for (tokens, logprobs, _), (plain_tokens, plain_logprobs, _) in zip(tp, plain):
        assert tokens == plain_tokens
        assert logprobs == pytest.approx(plain_logprobs, abs=1e-4)


def test_tp2_refuses_prefix_cache_files(llama, tmp_path):
    config = EngineConfig(device="cpu", dtype="float32", show_progress=False, max_context_tokens=512, page_size=16,
                          tensor_parallel_size=2)
    engine = LLMEngine(config, llama)
    try:
        with pytest.raises(ValueError, match="tensor_parallel_size > 1"):
            engine.save_prefix_cache(tmp_path / "cache.safetensors")
    finally:
        engine.close()


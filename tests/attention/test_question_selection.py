"""Question-time selection (attention/common/question_selection.py) and the needle probe (attention/common/needle_probe.py):
ops against plain-Python references, the question read across a prefill chunk boundary, presets, the offloaded
scan, and the oracle on the real embedded model."""

from __future__ import annotations


import pytest
import torch

from infinitehip import LLM, SamplingParams
from infinitehip.attention.common import question_selection as qs
from infinitehip.attention.methods.infinitehip import method as ih_method
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.attention.methods.infinitehip.config import PRESETS as IH_PRESETS
from infinitehip.attention.common.needle_probe import NeedleProbe
from infinitehip.attention.methods.tokenselect import method as ts_method
from infinitehip.attention.methods.tokenselect.config import PRESETS as TS_PRESETS
from infinitehip.attention.methods.tokenselect.config import TokenSelectConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.eval.niah import make_niah_sample, needle_for_seed
from infinitehip.eval.ruler.positions import needle_token_positions
from tests.conftest import engine_for_dir


# ---- ops ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [1, 3, 9])
def test_window_scores_match_plain_python(window):
    votes = torch.rand(50, generator=torch.Generator().manual_seed(window))
    half = window // 2
    padded = [0.0] * half + votes.tolist() + [0.0] * half
    mean = [sum(padded[i : i + window]) / window for i in range(50)]
    expected = [max(mean[max(0, i - half) : i + half + 1]) for i in range(50)]
    torch.testing.assert_close(qs.window_scores(votes, window), torch.tensor(expected))


def _cache(n_tokens: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    k_flat = torch.randn(n_tokens, 2, 16, generator=gen)
    return k_flat, torch.arange(n_tokens // 16, dtype=torch.int32)  # page size 16, pages in order


def _rope():
    from infinitehip.config.model import ModelConfig
    from infinitehip.model.rope import RotaryEmbedding

    mc = ModelConfig(model_type="llama", vocab_size=16, hidden_size=64, intermediate_size=64, num_layers=1,
                     num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                     max_position_embeddings=512)
    return RotaryEmbedding(mc, 64)


def test_question_chunks_keep_the_best_window_and_the_forced_tokens():

    k_flat, table = _cache(512, 0)
    q = torch.randn(4, 4, 16, generator=torch.Generator().manual_seed(1))
    rope = _rope()
    args = (q, k_flat, table, 16, 8, 400)
    scores = qs.question_scores(*args, 3, 32, rope, "reference")
    starts, lens = qs.question_chunks(*args, 4, 8, 3, 32, rope, "reference")
    assert starts.tolist() == sorted(starts.tolist()) and (lens == 8).all()
    best = 8 + int(scores.argmax())
    assert any(s <= best < s + 8 for s in starts.tolist())  # the chunk of the best window centre is kept
    forced = torch.tensor([300, 301])
    f_starts, _ = qs.question_chunks(*args, 4, 8, 3, 32, rope, "reference", forced)
    assert 296 in f_starts.tolist()  # the grid chunk [296, 304) holds the forced tokens
    few_s, few_l = qs.question_chunks(q, k_flat, table, 16, 8, 30, 4, 8, 3, 32, rope, "reference")
    assert few_s[:3].tolist() == [8, 16, 24] and few_l.tolist() == [8, 8, 6, 0]  # everything fits: all, padded


def test_chunk_rank_is_the_budget_that_would_keep_the_watched_tokens():
    scores = torch.tensor([0.1, 0.9, 0.2, 0.3, 0.5, 0.4, 0.8, 0.0, 0.7, 0.6])  # candidates [8, 18), chunks of 4
    repeated = torch.zeros(10, dtype=torch.bool)
    repeated[8:] = True  # the last (short) chunk repeats earlier text: never kept, never ranked above
    best = qs.chunk_scores(scores, 4, repeated)
    assert best.tolist()[:2] == pytest.approx([0.9, 0.8]) and best[2] == float("-inf")
    assert qs.chunk_rank(best, torch.tensor([9]), 8, 4) == 0  # chunk 0 holds the best token
    assert qs.chunk_rank(best, torch.tensor([13, 14]), 8, 4) == 1  # chunk 1: one chunk scores above it
    assert qs.chunk_rank(best, torch.tensor([3, 40]), 8, 4) is None  # in the sink / past the candidates
    k_flat, table = _cache(512, 0)  # the same grid as question_chunks: a budget of rank + 1 chunks keeps the token
    q = torch.randn(4, 4, 16, generator=torch.Generator().manual_seed(2))
    rope = _rope()
    args = (q, k_flat, table, 16, 8, 400)
    rank = qs.chunk_rank(qs.chunk_scores(qs.question_scores(*args, 3, 32, rope, "reference"), 8), torch.tensor([203]),
                         8, 8)
    for budget, kept in ((rank, False), (rank + 1, True)):
        starts, lens = qs.question_chunks(*args, max(budget, 1), 8, 3, 32, rope, "reference")
        assert any(s <= 203 < s + n for s, n in zip(starts.tolist(), lens.tolist())) == kept or budget == 0


def test_tokenselect_union_below_keeps_sorted_unique_tokens_under_the_window():
    got = ts_method.union_below(torch.tensor([3, 9, 20]), torch.tensor([9, 12, 40]), 30)
    assert got.tolist() == [3, 9, 12, 20]


# ---- the question near a prefill chunk boundary ---------------------------------------------------------------
@pytest.mark.parametrize("method, config", [
    ("tokenselect", TokenSelectConfig(select_tokens=16, sink_tokens=4, local_tokens=16, query_block_size=16,
                                      question_tokens=24, question_select_tokens=16, question_window=3)),
    ("infinitehip", InfiniteHiPConfig(sink_tokens=4, stream_tokens=16, chunk_sizes=(16, 8, 4), keep_tokens=(64, 32, 16),
                                      query_block_sizes=(16, 16, 16), early_last_keep_tokens=16, landmark_window=16,
                                      early_layers=0, question_tokens=24, question_keep_tokens=16, question_window=3,
                                      dense_when_unpruned=False)),
])
def test_the_question_is_read_whole_in_the_chunk_that_ends_the_prompt(method, config, monkeypatch, tmp_path_factory):
    import transformers

    from tests.conftest import TINY_CONFIGS

    path = tmp_path_factory.mktemp("tiny")
    transformers.LlamaForCausalLM(TINY_CONFIGS["llama3"]()).save_pretrained(path)
    module = ts_method if method == "tokenselect" else ih_method
    name = "question_tokens" if method == "tokenselect" else "question_chunks"
    seen, selections, inner = [], [], getattr(module, name)

    def select(q, *a, **kw):
        seen.append(q.shape[0])
        selections.append(inner(q, *a, **kw))
        return selections[-1]

    monkeypatch.setattr(module, name, select)
    joined = []  # per decode step and layer: whether the step's keys hold the question's selection
    if method == "tokenselect":  # decode's union of the step's selection and the question's (decode_lists.py)
        inner_join = module.decode_union

        def union(selected, num_selected, extra, num_extra, limit):
            joined.append(bool((num_extra > 0).all()))
            return inner_join(selected, num_selected, extra, num_extra, limit)

        monkeypatch.setattr(module, "decode_union", union)
    else:  # every chunk of the layer's question selection is in the key list (joined at the last stage's refresh)
        inner_join = module.decode_key_list

        def key_list(starts, lens, *a, **kw):
            q_starts, q_lens = selections[len(joined) % len(selections)]
            listed = set(starts[0][lens[0] > 0].tolist())
            joined.append(set(q_starts[q_lens > 0].tolist()) <= listed)
            return inner_join(starts, lens, *a, **kw)

        monkeypatch.setattr(module, "decode_key_list", key_list)
    engine = engine_for_dir(path, method=method, method_config=config, prefill_chunk_size=100, max_context_tokens=512)
    chunks, run = [], engine.runner.run

    def spy(plan):
        chunks.extend(n for _, n in plan.prefill)
        return run(plan)

    engine.runner.run = spy
    llm = LLM.from_engine(engine)
    (out,) = llm.generate([list(range(5, 215))], SamplingParams(temperature=0.0, max_tokens=4))
    assert len(out.token_ids) == 4
    # On the grid of 100 the last chunk would hold 10 of the 24 question queries, the others never attending the
    # question's selection: the chunk before stops short so that the last one holds all of them.
    assert engine.method.prompt_end_tokens(210) == 24 and chunks == [100, 86, 24]
    layers = engine.model_config.num_layers
    assert seen == [24] * layers  # once per layer, with all 24 question queries
    assert len(joined) >= 3 * layers and all(joined)  # every decode step (the first token comes from the prefill)


def test_presets_keep_the_papers_settings_by_name():
    paper = IH_PRESETS["paper-3k"]
    assert paper.question_tokens == 0 and paper.chunk_sizes == (256, 32, 8) and paper.refresh_intervals == (16, 8, 4)
    assert IH_PRESETS["3k"] == paper and IH_PRESETS["3k-question"].keep_tokens == paper.keep_tokens
    assert IH_PRESETS["paper-5k"].question_tokens == 0 and IH_PRESETS["paper-5k"].chunk_sizes == (64, 32, 16)
    assert IH_PRESETS["3k-flash"].question_tokens == 0 and IH_PRESETS["3k-fast"].chunk_sizes == (256, 32, 8)
    # The default (best on the real-text suite): question-time selection, 16-token final chunks, the paper's budgets
    # but the last stage's, which `wide-final` keeps (as the paper's 3k does).
    default = IH_PRESETS["default"]
    assert default == InfiniteHiPConfig() and default.question_tokens > 0 and default.chunk_sizes[-1] == 16
    assert default.keep_tokens[:-1] == paper.keep_tokens[:-1] and default.sink_tokens == paper.sink_tokens
    assert default == IH_PRESETS["question-chunks"] and default.keep_tokens[-1] == default.early_last_keep_tokens == 256
    wide = IH_PRESETS["wide-final"]
    assert (wide.keep_tokens, wide.early_last_keep_tokens) == (paper.keep_tokens, paper.early_last_keep_tokens)
    assert TS_PRESETS["paper"].question_tokens == 0 and TS_PRESETS["paper"].vote_pool_size == 1
    assert TS_PRESETS["default"] == TokenSelectConfig()
    with pytest.raises(ValueError, match="question_window"):
        TokenSelectConfig(question_window=4)
    with pytest.raises(ValueError, match="question_keep_tokens"):
        InfiniteHiPConfig(question_keep_tokens=100)


@pytest.mark.parametrize("segment_logits", [4 * 4 * 37, 1 << 26])  # segments of 37 tokens (ragged); one segment
def test_streamed_votes_equal_the_soft_vote_over_every_candidate(segment_logits):
    """The offloaded scan (two passes over key segments) gives the one-shot soft vote's sums."""
    from infinitehip.attention.methods.tokenselect.soft_vote.op import soft_vote

    k_flat, table = _cache(512, 3)
    q = torch.randn(4, 4, 16, generator=torch.Generator().manual_seed(4)) * 2
    start, count = 8, 390
    n = q.shape[0]
    expected = soft_vote(q, k_flat, table[None].expand(n, -1), 16, torch.full((n,), start), torch.full((n,), count),
                         count, 1.0, impl="reference").sum(0)
    got = qs.streamed_votes(q, lambda a, b: k_flat[a:b], start, count, segment_logits)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_offloading_sizes_the_attention_bank_for_the_question_chunks():
    from infinitehip.attention.methods.infinitehip.offload_access import check_offload

    big = OffloadConfig(offload_enabled=True, mask_bank_tokens=1 << 30, attention_bank_tokens=1 << 30)
    plain = check_offload(IH_PRESETS["3k"], big, 1 << 17, 9, 2)
    question = check_offload(IH_PRESETS["3k-question"], big, 1 << 17, 9, 2)
    assert question.attention_tokens == plain.attention_tokens + 2 * IH_PRESETS["3k-question"].question_keep_tokens


# ---- needle probe -------------------------------------------------------------------------------------------
def test_probe_validates_positions():
    with pytest.raises(ValueError, match="at least one"):
        NeedleProbe(())
    with pytest.raises(ValueError, match=">= 0"):
        NeedleProbe((-1, 3))


@pytest.fixture(scope="module")
def embedded_llm():
    from infinitehip.model.builtin import embedded_model_path

    try:
        embedded_model_path()
    except Exception:
        pytest.skip("embedded model not installed")
    # A small TokenSelect budget without question-time selection: a real-prose needle is then easy to miss.
    # Pool width 5 (the default until the real-text suite chose 15): the prompt below is a miss at this width.
    config = TokenSelectConfig(select_tokens=64, sink_tokens=16, local_tokens=64, query_block_size=64, question_tokens=0,
                               vote_pool_size=5)
    return LLM(method="tokenselect", method_config=config, max_context_tokens=4200, show_progress=False, device="cpu")


@pytest.mark.slow  # a real-model retrieval (10-16 s of CPU): CI's slow pass (make test-slow)
def test_oracle_answers_a_real_prompt_the_method_misses(embedded_llm):
    """The oracle separates a selection miss from a reading miss: same prompt, same method, needle forced in."""
    llm = embedded_llm
    # 1,500 tokens (4,000 before: 34 s of CPU, 12 s now): the method misses the needle (it attends 29% of it while
    # decoding) and the oracle answers, as at 4,000 (15%). (At 2,000 this sample's oracle misses too: a reading
    # miss, the other case the oracle tells apart.)
    sample = make_niah_sample(llm.tokenizer, 1500, 0.5, 0)
    needle = needle_for_seed(0).needle
    positions = needle_token_positions(llm.tokenizer, sample.messages, (needle,))
    params = SamplingParams(temperature=0.0, max_tokens=24)
    (plain,) = llm.chat(sample.messages, params, needle_tokens=positions)
    (oracle,) = llm.chat(sample.messages, params, needle_tokens=positions, oracle=True)
    assert not sample.is_correct(plain.text) and sample.is_correct(oracle.text), (plain.text, oracle.text)
    assert plain.needle_trace["decode_mean"] < 0.5  # the miss is a selection miss: the needle was not attended
    assert oracle.needle_trace["decode_mean"] == 1.0 and oracle.needle_trace["prefill_mean"]["attended"] == 1.0
    layers = llm.engine.model_config.num_layers
    assert len(oracle.needle_trace["prefill"]["attended"]) == layers
    with pytest.raises(ValueError, match="needle_tokens"):
        llm.chat(sample.messages, params, oracle=True)


def test_probe_ranks_the_needle_in_the_question_vote():
    """The trace's question_rank is the budget (in chunks) that would keep the needle: the question's selection
    holds the needle exactly in the layers where its rank is below the budget."""
    from infinitehip.model.builtin import embedded_model_path

    try:
        embedded_model_path()
    except Exception:
        pytest.skip("embedded model not installed")
    config = InfiniteHiPConfig(sink_tokens=16, stream_tokens=64, query_block_sizes=(32, 32, 32),
                               chunk_sizes=(64, 32, 16), keep_tokens=(512, 256, 64), early_last_keep_tokens=64,
                               question_keep_tokens=64, landmark_window=64)
    llm = LLM(method="infinitehip", method_config=config, max_context_tokens=2200, show_progress=False, device="cpu")
    sample = make_niah_sample(llm.tokenizer, 1500, 0.5, 1)
    positions = needle_token_positions(llm.tokenizer, sample.messages, (needle_for_seed(1).needle,))
    (out,) = llm.chat(sample.messages, SamplingParams(temperature=0.0, max_tokens=4), needle_tokens=positions)
    ranks, shares = out.needle_trace["prefill"]["question_rank"], out.needle_trace["prefill"]["question"]
    assert len(ranks) == llm.engine.model_config.num_layers and all(isinstance(r, int) for r in ranks)
    budget = config.question_keep_tokens // config.chunk_sizes[-1]
    assert [r < budget for r in ranks] == [s > 0 for s in shares], (ranks, shares)
    assert len(set(ranks)) > 1  # layers differ: a rank, not a constant

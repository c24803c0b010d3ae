"""Repeated prompt text (attention/common/repeated_text.py): the repeat mask against a plain-Python reference, the question's
vote leaving out later copies (question_selection.py), and the engine handing the prompt to both methods."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from infinitehip import LLM, SamplingParams
from infinitehip.attention.common import question_selection as qs
from infinitehip.attention.methods.infinitehip import method as ih_method
from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.attention.common.repeated_text import PromptText, repeated_candidates, repeated_tokens
from infinitehip.attention.methods.tokenselect import method as ts_method
from infinitehip.attention.methods.tokenselect.config import TokenSelectConfig
from tests.conftest import engine_for_dir


def plain_repeated(ids: list[int], span: int) -> list[bool]:
    """Reference: token t is repeated when some window [s, s + span) holding t equals a window starting before s."""
    seen, out = set(), [False] * len(ids)
    for s in range(len(ids) - span + 1):
        window = tuple(ids[s : s + span])
        if window in seen:
            out[s : s + span] = [True] * span
        seen.add(window)
    return out


def _text_with_copies(seed: int) -> list[int]:
    """Random ids with a passage copied three times at offsets that fit no grid, and a short repeat inside."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 500, 900).tolist()  # the tiny test model has 512 ids
    passage = ids[37:171]
    ids[400:534] = passage  # whole copy
    ids[611:680] = passage[20:89]  # a misaligned part of it
    ids[800:806] = ids[10:16]  # 6 tokens: under the spans below
    return ids


def test_repeat_mask_of_a_corpus_cycled_to_fill_a_context():
    """A long prompt made of one text cycled (RULER's essays at 1M): every token after the first cycle is marked, at
    any cycle length (copies are misaligned to any grid), ids over the whole vocabulary range."""
    gen = torch.Generator().manual_seed(3)
    for cycle in (1000, 1337):
        ids = torch.randint(0, 262144, (cycle,), generator=gen).repeat(5)[:4321]
        got = repeated_tokens(ids, 32)
        assert got.tolist() == plain_repeated(ids.tolist(), 32)
        assert not got[:cycle].any() and got[cycle:].all()


@pytest.mark.parametrize("span", [8, 16, 33])
@pytest.mark.parametrize("seed", [0, 1])
def test_repeat_mask_matches_plain_python(span, seed):
    ids = _text_with_copies(seed)
    got = repeated_tokens(torch.tensor(ids), span)
    assert got.tolist() == plain_repeated(ids, span)
    assert not got[:400].any()  # the first copy is never marked
    assert got[400:534].all() and got[611:680].all()  # every later copy is, to its ends
    assert not got[800:806].any()  # a repeat shorter than the span is not


def test_repeat_mask_of_text_that_does_not_repeat_is_empty():
    ids = torch.from_numpy(np.random.default_rng(2).permutation(5000))
    assert not repeated_tokens(ids, 8).any() and not repeated_tokens(ids[:5], 8).any()
    assert repeated_tokens(ids[:5], 8).shape == (5,)
    with pytest.raises(ValueError, match="span"):
        repeated_tokens(ids, 0)
    with pytest.raises(ValueError, match="repeat_span"):
        InfiniteHiPConfig(repeat_span=4)
    with pytest.raises(ValueError, match="repeat_span"):
        TokenSelectConfig(repeat_span=5000)


def test_candidates_are_a_window_of_the_mask_or_none():
    text = PromptText(_text_with_copies(0))
    assert repeated_candidates(text, 0, 4, 600, torch.device("cpu")) is None
    assert repeated_candidates(None, 32, 4, 600, torch.device("cpu")) is None
    got = repeated_candidates(text, 32, 4, 600, torch.device("cpu"))
    assert got.tolist() == plain_repeated(text.ids, 32)[4:600]
    with pytest.raises(ValueError, match="past the prompt"):
        repeated_candidates(text, 32, 4, 901, torch.device("cpu"))


def test_question_vote_keeps_the_first_copy_only():
    """Keys copied at two places score alike; with the copy marked, the budget goes to the first and to new text."""
    from infinitehip.config.model import ModelConfig
    from infinitehip.model.rope import RotaryEmbedding

    gen = torch.Generator().manual_seed(0)
    k_flat = torch.randn(512, 2, 16, generator=gen) * 0.1
    q = torch.randn(4, 4, 16, generator=gen)
    hot = q.view(4, 2, 2, 16).mean((0, 2))  # [2, 16]: keys every question query likes
    k_flat[104:136] = hot[None] * 3  # a passage the question matches (grid chunks 104, 120: sink 8, chunk 16) ...
    k_flat[328:360] = hot[None] * 3  # ... and its copy (chunks 328, 344)
    mc = ModelConfig(model_type="llama", vocab_size=16, hidden_size=64, intermediate_size=64, num_layers=1,
                     num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                     max_position_embeddings=512)
    rope = RotaryEmbedding(mc, 64)
    args = (q, k_flat, torch.arange(32, dtype=torch.int32), 16, 8, 480, 4, 16, 1, 0, rope, "reference")
    plain, _ = qs.question_chunks(*args)
    assert set(plain.tolist()) == {104, 120, 328, 344}  # the budget of 4 chunks goes to the two copies
    repeated = torch.zeros(472, dtype=torch.bool)
    repeated[328 - 8 : 360 - 8] = True
    starts, _ = qs.question_chunks(*args, repeated=repeated)
    assert {104, 120} <= set(starts.tolist()) and not {328, 344} & set(starts.tolist())
    # Filler that repeats everywhere but in two chunks (a passkey): the budget is left unused, not filled with copies.
    filler = torch.ones(472, dtype=torch.bool)
    filler[104 - 8 : 136 - 8] = False
    starts, lens = qs.question_chunks(*args, repeated=filler)
    assert starts.tolist() == [104, 120, 0, 0] and lens.tolist() == [16, 16, 0, 0]


CONFIGS = {
    "tokenselect": TokenSelectConfig(select_tokens=16, sink_tokens=4, local_tokens=16, query_block_size=16,
                                     question_tokens=8, question_select_tokens=32, question_window=3, repeat_span=16),
    "infinitehip": InfiniteHiPConfig(sink_tokens=4, stream_tokens=16, chunk_sizes=(16, 8, 4), keep_tokens=(64, 32, 16),
                                     query_block_sizes=(16, 16, 16), early_last_keep_tokens=16, landmark_window=16,
                                     early_layers=0, question_tokens=8, question_keep_tokens=32, question_window=3,
                                     dense_when_unpruned=False, repeat_span=16),
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    import transformers

    from tests.conftest import TINY_CONFIGS

    path = tmp_path_factory.mktemp("tiny")
    transformers.LlamaForCausalLM(TINY_CONFIGS["llama3"]()).save_pretrained(path)
    return path


@pytest.mark.parametrize("method", ["tokenselect", "infinitehip"])
def test_engine_hands_the_prompt_to_the_question_vote(method, tiny_dir, monkeypatch):
    """Both methods get the repeat mask of their candidates at the prompt's last chunk; a prompt that does not repeat
    decodes the same greedy tokens with repeat_span on as off."""
    module = ts_method if method == "tokenselect" else ih_method
    name = "question_tokens" if method == "tokenselect" else "question_chunks"
    inner, masks = getattr(module, name), []

    def select(*a, repeated=None, **kw):
        masks.append(repeated)
        return inner(*a, repeated=repeated, **kw)

    monkeypatch.setattr(module, name, select)
    config = CONFIGS[method]
    copies = _text_with_copies(3)[:300]
    copies[200:260] = copies[50:110]
    runs = {}
    for span in (16, 0):
        engine = engine_for_dir(tiny_dir, method=method, method_config=type(config)(**{**config.__dict__,
                                "repeat_span": span}), prefill_chunk_size=128, max_context_tokens=512)
        llm = LLM.from_engine(engine)
        params = SamplingParams(temperature=0.0, max_tokens=6)
        masks.clear()
        (plain,) = llm.generate([list(range(5, 305))], params)  # ids 5..304: no window repeats
        plain_masks = list(masks)
        masks.clear()
        llm.generate([copies], params)
        (short,) = llm.generate([[5, 6, 7]], params)  # ends inside the sink: no candidates
        runs[span] = (plain.token_ids, plain_masks, list(masks), short.token_ids)
    layers = engine.model_config.num_layers
    on_tokens, on_plain, on_copies, on_short = runs[16]
    assert len(on_plain) == layers and all(m is not None and not m.any() for m in on_plain)
    assert on_tokens == runs[0][0] and on_short == runs[0][3]  # nothing repeats: the same answers
    expected = torch.tensor(plain_repeated(copies, 16))
    on_copies = on_copies[:layers]  # the short prompt's masks (empty or none) follow
    for m in on_copies:  # candidates [sink, limit): the copy at 200..259 is marked, its source is not
        assert m.tolist() == expected[4 : 4 + m.numel()].tolist() and m[200 - 4 : 260 - 4].all()
    assert all(m is None for m in runs[0][1] + runs[0][2])  # off: no mask
    assert all(m is None or m.numel() == 0 for m in runs[16][2][layers:])


def test_novel_chunks_are_the_chunks_with_text_seen_first():
    """A stage-1 chunk is left out exactly when every one of its tokens is marked (the last chunk may be short)."""
    from infinitehip.attention.methods.infinitehip.repeated_chunks import novel_chunks

    ids = _text_with_copies(5)
    repeated = repeated_tokens(torch.tensor(ids), 16)[4:]  # candidates from a sink of 4
    chunks = novel_chunks(repeated, 16)
    marks = repeated.tolist()
    expected = [not all(marks[j : j + 16]) for j in range(0, len(marks), 16)]
    assert chunks.tolist() == expected and not all(expected) and any(expected)


def test_hierarchy_keeps_no_chunk_of_repeated_text(tiny_dir, monkeypatch):
    """hierarchy_repeat_span: the prompt's last chunk and every decode refresh keep no stage-1 chunk whose text all
    repeats; a prompt that does not repeat decodes the same greedy tokens as with the setting off."""
    from infinitehip.attention.methods.infinitehip import decode as ih_decode
    from infinitehip.attention.methods.infinitehip import pruning as ih_pruning
    from infinitehip.attention.methods.infinitehip import short_chunk

    config = InfiniteHiPConfig(**{**CONFIGS["infinitehip"].__dict__, "repeat_span": 0})
    kept = []  # (stage-1 starts, lens) of every prefill stage 1 of the prompt's last chunk and decode refresh
    run_stage, refresh = ih_pruning.run_stage, ih_decode.refresh_stage

    def stage(spec, blocks, parent, *a, **kw):
        out = run_stage(spec, blocks, parent, *a, **kw)
        if parent is None and kw.get("novel") is not None:
            kept.append((out.chunk_starts, out.chunk_lens))
        return out

    def refresh_stage(spec, q, position, parent, out, *a, **kw):
        refresh(spec, q, position, parent, out, *a, **kw)
        if parent is None and kw.get("novel") is not None:
            kept.append((out.starts, out.lens))

    monkeypatch.setattr(ih_method, "run_stage", stage)
    monkeypatch.setattr(short_chunk, "run_stage", stage)  # the prompt's last chunk (16 tokens) takes the short path
    monkeypatch.setattr(ih_method, "refresh_stage", refresh_stage)
    copies = _text_with_copies(3)[:400]
    copies[200:300] = copies[50:150]
    copies[300:400] = copies[50:150]
    runs = {}
    for span in (16, 0):
        engine = engine_for_dir(tiny_dir, method="infinitehip", prefill_chunk_size=128, max_context_tokens=1024,
                                method_config=InfiniteHiPConfig(**{**config.__dict__, "hierarchy_repeat_span": span}))
        llm = LLM.from_engine(engine)
        params = SamplingParams(temperature=0.0, max_tokens=6)
        (plain,) = llm.generate([list(range(5, 405))], params)  # ids 5..404: no window repeats
        kept.clear()
        (repeats,) = llm.generate([copies], params)
        runs[span] = plain.token_ids, list(kept)
    assert runs[16][0] == runs[0][0] and not runs[0][1]
    marks = repeated_tokens(torch.tensor(copies), 16)
    repeated_chunk = lambda start: bool(marks[start : start + 16].all())
    assert any(repeated_chunk(s) for s in range(4, 380, 16))  # the copies fill whole chunks
    layers = engine.model_config.num_layers
    assert len(runs[16][1]) > layers  # the prompt's last chunk and decode refreshes
    for starts, lens in runs[16][1]:
        chosen = starts[lens > 0].tolist()
        assert chosen and not any(repeated_chunk(s) for s in chosen)

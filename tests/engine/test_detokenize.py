"""Incremental detokenization (engine/detokenize.py): the running text equals the whole output decoded at every step,
for the embedded model's byte-level BPE and a SentencePiece-style tokenizer (word starts as U+2581, byte fallback for
characters outside the vocabulary, as Gemma's and Llama 2's), over real text, characters split across tokens and
special tokens; the engine's final text is the whole decode cut at a stop string."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from infinitehip.engine.detokenize import IncrementalText, full_text
from tests.conftest import engine_for_dir

TEXT = ("Prefix caching keeps the pages of a long document — naïve façades, 東京, emoji 🙂🚀 — so the second question "
        "prefills only itself.\n\tTabs, ``quotes'' and   spaces stay as they are.")


def _sentencepiece_style() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<eos>": 1, "<sep>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ["\u2581the", "\u2581cat", "\u2581sat", "s", "\u2581on", "\u2581", "at", "\u2581mat", ".", ","]:
        vocab[piece] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", additional_special_tokens=["<sep>"])


def _check_every_step(tok, ids: list[int]) -> None:
    """At every step the text only grows, is a prefix of the final decode, and is the step's whole decode unless
    that ends in an incomplete character (U+FFFD: a byte run decodes to replacement characters until complete)."""
    final = tok.decode(ids, skip_special_tokens=True)
    inc = IncrementalText()
    for n in range(1, len(ids) + 1):
        text = inc.update(tok, ids[:n])
        full = tok.decode(ids[:n], skip_special_tokens=True)
        assert final.startswith(text) or "\ufffd" in final
        if "\ufffd" not in full:
            assert text == full
    if not final.endswith("\ufffd"):  # (a trailing incomplete character is held back: the engine's final text is
        assert inc.text == final       # the whole decode, engine test below)


def test_byte_level_bpe_text_grows_as_the_whole_decode(tokenizer):
    ids = tokenizer.encode(TEXT)
    _check_every_step(tokenizer, ids)
    rng = random.Random(0)  # any token sequence, special tokens included
    _check_every_step(tokenizer, [rng.randrange(len(tokenizer)) for _ in range(300)])


def test_sentencepiece_style_word_starts_and_byte_fallback():
    tok = _sentencepiece_style()
    pieces = ["\u2581the", "\u2581cat", "s", "\u2581sat", "\u2581on", "\u2581the", "\u2581mat", ",", "\u2581"]
    ids = [tok.convert_tokens_to_ids(p) for p in pieces]
    ids += [3 + b for b in "東🙂".encode()]  # characters as byte tokens: incomplete until their last byte
    ids += [tok.convert_tokens_to_ids(p) for p in ["\u2581the", "."]]
    _check_every_step(tok, ids)
    assert tok.decode(ids) == "the cats sat on the mat, 東🙂 the."
    rng = random.Random(1)
    _check_every_step(tok, [rng.randrange(len(tok)) for _ in range(400)])


def test_full_text_cuts_at_the_first_listed_stop(tokenizer):
    ids = tokenizer.encode("alpha beta gamma delta")
    assert full_text(tokenizer, ids, ["gamma", "beta"]) == "alpha beta "
    assert full_text(tokenizer, ids, ["omega"]) == "alpha beta gamma delta"


@pytest.mark.parametrize("stop", [[], ["e"]])
def test_engine_outputs_equal_the_whole_decode(tiny_llama_dir, tokenizer, stop):
    from infinitehip.config.sampling import SamplingParams

    engine = engine_for_dir(tiny_llama_dir, tokenizer, method="dense")
    seq = engine.add_request(list(range(5, 40)), SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True,
                                                                stop=stop))
    while not seq.is_finished:
        engine.step()
    assert seq.output_text == full_text(tokenizer, seq.output_ids, stop)
    if stop:
        assert seq.finish_reason == "stop" and "e" not in seq.output_text

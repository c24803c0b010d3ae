"""The on-disk cache of a corpus's token ids (eval/ruler/token_cache.py): a second process reads what the first
tokenized, keyed by text and tokenizer; a damaged or foreign file is recomputed, never used."""

from __future__ import annotations

from infinitehip.eval.ruler.token_cache import cached_token_ids, tokenizer_digest

TEXT = "The secret code word for the amber workshop is amber-4721.\n" * 40


def encoder(tokenizer, calls):
    def encode(text):
        calls.append(len(text))
        return list(tokenizer.encode(text, add_special_tokens=False))
    return encode


def test_second_read_comes_from_disk_and_equals_the_tokenizer(tokenizer, tmp_path):
    assert tokenizer_digest(tokenizer) is not None  # the fixture was loaded from a directory with tokenizer.json
    calls = []
    first = cached_token_ids(TEXT, tokenizer, encoder(tokenizer, calls), tmp_path)
    again = cached_token_ids(TEXT, tokenizer, encoder(tokenizer, calls), tmp_path)
    assert first == again == list(tokenizer.encode(TEXT, add_special_tokens=False))
    assert len(calls) == 1 and len(list(tmp_path.glob("*.ids"))) == 1
    other = cached_token_ids(TEXT + "x", tokenizer, encoder(tokenizer, calls), tmp_path)  # another text: its own key
    assert len(calls) == 2 and other != first


def test_a_damaged_file_is_recomputed_and_rewritten(tokenizer, tmp_path):
    calls = []
    expect = cached_token_ids(TEXT, tokenizer, encoder(tokenizer, calls), tmp_path)
    (path,) = tmp_path.glob("*.ids")
    data = bytearray(path.read_bytes())
    for damage in (bytes(data[:-4]), bytes(data[:40]), bytes(data[:31]), b""):  # cut short, to the digest, to nothing
        path.write_bytes(damage)
        assert cached_token_ids(TEXT, tokenizer, encoder(tokenizer, calls), tmp_path) == expect
    data[-1] ^= 0x01  # one id changed: the digest no longer matches
    path.write_bytes(bytes(data))
    assert cached_token_ids(TEXT, tokenizer, encoder(tokenizer, calls), tmp_path) == expect
    assert len(calls) == 6 and path.read_bytes()[-1] != data[-1]  # recomputed each time, the file rewritten


def test_a_tokenizer_without_its_file_is_not_cached(tmp_path):
    class Chars:
        name_or_path = str(tmp_path / "nowhere")

        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    calls = []
    assert cached_token_ids("abc", Chars(), encoder(Chars(), calls), tmp_path) == [97, 98, 99]
    assert not list(tmp_path.glob("*.ids"))

"""Incremental detokenization: a sequence's text grows by its new tokens' text, decoded from a short window
instead of the whole output at every step (which costs O(n) a step, O(n^2) an answer: ~1 ms a step at 2,000 output
tokens on a CPU core, more than a tenth of a 1M-token decode step).

The window is tokens [prefix, end): its text minus the text of [prefix, read) is what the tokens since `read` add.
Its first tokens give the new ones their context (a SentencePiece word start keeps its space, a byte-level character
split over tokens is whole), as vLLM's and TGI's incremental detokenizers do. A window whose text ends in U+FFFD
(a character still incomplete) waits for the next token. The running text is for stop strings and streaming; the
engine decodes the whole output once when a sequence finishes (`full_text`), so the final text is always the
tokenizer's own.
"""

from __future__ import annotations


class IncrementalText:
    """The detokenized text of one growing token list (skip_special_tokens, as the engine decodes)."""

    def __init__(self) -> None:
        self.text = ""
        self.prefix = 0  # first token of the window
        self.read = 0  # tokens [prefix, read) are already in `text`

    def update(self, tokenizer, ids: list[int]) -> str:
        """ids: the whole output so far (it only grows) -> the text of it."""
        if len(ids) <= self.read:
            return self.text
        before = tokenizer.decode(ids[self.prefix : self.read], skip_special_tokens=True) if self.read > self.prefix else ""
        after = tokenizer.decode(ids[self.prefix :], skip_special_tokens=True)
        if after.endswith("\ufffd"):  # a character still incomplete (its bytes may make earlier ones invalid too)
            return self.text
        if len(after) > len(before) and after.startswith(before):
            self.text += after[len(before) :]
            self.prefix, self.read = self.read, len(ids)
        elif not after.startswith(before):  # the window's text is not an extension (a tokenizer's clean-up): resync
            self.text = tokenizer.decode(ids, skip_special_tokens=True)
            self.prefix = self.read = len(ids)
        return self.text


def full_text(tokenizer, ids: list[int], stops) -> str:
    """The whole output decoded once, cut at the first of `stops` (in their order) it contains."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    for stop in stops:
        idx = text.find(stop)
        if idx >= 0:
            return text[:idx]
    return text


def stable_text(text: str, stops: tuple[str, ...]) -> str:
    """The part of an unfinished sequence's text that can be sent: no partial stop string, no partial char."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":
        end -= 1
    cut = end
    for stop in stops:
        # Longest proper prefix of `stop` that ends the text: hold it back.
        for i in range(max(0, end - len(stop) + 1), end):
            if stop.startswith(text[i:end]):
                cut = min(cut, i)
                break
    return text[:cut]

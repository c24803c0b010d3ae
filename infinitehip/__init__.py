"""infinitehip: million-token inference for off-the-shelf RoPE transformers."""

from infinitehip.config.engine import EngineConfig
from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.llm import LLM, RequestOutput
from infinitehip.engine.llm_engine import ContextLengthError

__all__ = ["LLM", "EngineConfig", "SamplingParams", "RequestOutput", "ContextLengthError"]

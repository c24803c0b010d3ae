"""Our attention methods inside a plain transformers causal LM: `patch(model, method=..., preset=...)`.

A model to try it on without the network: `AutoModelForCausalLM.from_pretrained(infinitehip.model_dir())`, the
embedded SmolLM2-135M-Instruct as a Hugging Face directory (the README's example)."""

from infinitehip.integrations.transformers.cache import MethodCache
from infinitehip.integrations.transformers.patch import Patch, patch

__all__ = ["patch", "Patch", "MethodCache"]

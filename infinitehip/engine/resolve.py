"""`EngineConfig` + the model -> `ResolvedConfig`: every value the engine runs with, settled once before anything
is built. The engine and each tensor-parallel rank size themselves from it (engine/rank.py); `--print-config`
prints it and results files keep it.

The method's sizes come from its class (`AttentionMethod.kv_sizing`: model, config and tokenizer), not from a
built method; the model's config.json and tokenizer are enough, no weights are read (`resolve_for_model`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from infinitehip.attention.registry import effective_method, method_class
from infinitehip.config.engine import EngineConfig
from infinitehip.config.model import ModelConfig
from infinitehip.config.resolved import ResolvedConfig

ROPE_TABLE_TOKENS = 1 << 16  # RoPE angles precomputed up to here; longer positions are computed per call


def resolve_config(config: EngineConfig, model_config: ModelConfig, tokenizer=None, model: str = "",
                   device: torch.device | None = None) -> ResolvedConfig:
    """The effective values of an engine of `config` over a model of `model_config` (its tokenizer: for methods
    that encode text of their own, InfiniPot's catalyst). device: rank 0's (default config.torch_device())."""
    device = device or config.torch_device()
    dtype = config.torch_dtype()
    runs = effective_method(config.method, model_config)  # auto on a soft-capped model: dense, sized as dense
    sizing = method_class(runs).kv_sizing(model_config.method_view(), config.method_config if runs == config.method
                                          else None, tokenizer)
    max_context = config.max_context_tokens or sizing.default_max_context_tokens
    # A method that compacts its cache needs at most kv_token_limit slots per sequence (+ its scratch slots).
    limit, scratch = sizing.kv_token_limit, sizing.kv_scratch_tokens
    kv_tokens = config.kv_cache_tokens or ((max_context if limit is None else min(max_context, limit)) + scratch)
    num_pages = -(-kv_tokens // config.page_size)
    offload = config.offload
    offloaded = offload.offload_enabled
    return ResolvedConfig(
        model=model or (config.model or "embedded default"), method=config.method,
        method_config=config.method_config if sizing.method_config is None else sizing.method_config,
        device=str(device), dtype=str(dtype).removeprefix("torch."), tensor_parallel_size=config.tensor_parallel_size,
        max_context_tokens=max_context, max_context_from="config" if config.max_context_tokens else "method default",
        kv_token_limit=limit, kv_scratch_tokens=scratch, kv_cache_tokens=num_pages * config.page_size,
        page_size=config.page_size, num_pages=num_pages, prefill_chunk_size=config.prefill_chunk_for(device),
        max_num_seqs=config.max_num_seqs, rope_table_tokens=min(max_context, ROPE_TABLE_TOKENS),
        cuda_graphs=config.cuda_graphs and device.type == "cuda",
        overlap_decode=config.overlap_decode and config.tensor_parallel_size == 1,
        enable_prefix_caching=config.enable_prefix_caching, offload_enabled=offloaded,
        kv_dtype=str(offload.torch_kv_dtype(dtype)).removeprefix("torch."),
        mask_bank_tokens=offload.mask_bank_tokens if offloaded else None,
        attention_bank_tokens=offload.attention_bank_tokens if offloaded else None,
        offload_impl=offload.copy_impl(device) if offloaded else None,
    )


def resolve_for_model(config: EngineConfig) -> ResolvedConfig:
    """The values an engine of `config` would run with, from the model's config.json and tokenizer (a GGUF is
    converted once, as loading does); no weights are read and nothing is allocated."""
    from infinitehip.model.gguf_convert import default_cache_root
    from infinitehip.model.loading import load_tokenizer, resolve_model_dir

    cache_root = Path(config.model_cache_dir) if config.model_cache_dir else default_cache_root()
    model_dir, source = resolve_model_dir(config.model, cache_root)
    return resolve_config(config, ModelConfig.from_dir(model_dir), load_tokenizer(model_dir), source)

"""Dense baselines measured in the same run as the method, where a dense KV of the context cannot fit the GPU: the
model without attention + the model's layers x one layer's SDPA-flash at the context (the paper's layer-wise way).

    decode_layerwise(loaded, contexts, device)          one decode step (graph-replayed), ms
    prefill_layerwise(loaded, contexts, chunk, device)  a whole prefill, s
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.nn.functional as F

from bench.common.timing import Timer, sync
from infinitehip.model.loading import LoadedModel


def backend_ctx(device: torch.device):
    if device.type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    return contextlib.nullcontext()


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """q [n, H, d], k/v [L, Hkv, d] (NHD views, no copies) -> [1, H, n, d]; GQA inside the kernel."""
    return F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                          is_causal=causal, enable_gqa=True)


def decode_layerwise(loaded: LoadedModel, contexts: list[int], device: torch.device) -> list[dict]:
    """The paper's dense decode comparison, measured in this run: a graph-replayed decode step of the same model
    with attention replaced by the identity (weights, norms, MLP, logits: what every method pays) + num_layers x
    one layer's SDPA-flash decode over the context (cold L2; a dense KV of 1M tokens would not fit, one layer does)."""
    mc, model = loaded.config, loaded.model
    ids = torch.zeros(1, dtype=torch.long, device=device)
    timer = Timer(device, warmup=3, min_reps=20, max_reps=200, budget_s=2.0)
    with torch.inference_mode():
        def step():
            return model.compute_logits(model(ids, lambda layer, q, k, v: q))

        for _ in range(2):
            step()
        replay, graph = step, None
        if device.type == "cuda":
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            replay = graph.replay
        rest_ms = timer(replay)["ms"]

        def layer_ms(context: int) -> float:
            q = torch.randn(1, mc.num_heads, mc.head_dim, dtype=torch.bfloat16, device=device)
            k = torch.randn(context, mc.num_kv_heads, mc.head_dim, dtype=torch.bfloat16, device=device)
            v = torch.randn_like(k)
            with backend_ctx(device):
                return timer(lambda: sdpa(q, k, v, causal=False))["ms"]

        rows = []
        for context in contexts:
            ms = layer_ms(context)
            rows.append(dict(context=context, rest_ms=rest_ms, layer_ms=ms, dense_ms=rest_ms + mc.num_layers * ms))
    del graph
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def prefill_layerwise(loaded: LoadedModel, contexts: list[int], chunk: int, device: torch.device) -> list[dict]:
    """Dense prefill estimate: (the model without attention over one chunk) x chunks + layers x causal flash at L."""
    mc, model = loaded.config, loaded.model
    backend = torch.nn.attention.SDPBackend.FLASH_ATTENTION if device.type == "cuda" else torch.nn.attention.SDPBackend.MATH
    flash = lambda: torch.nn.attention.sdpa_kernel(backend)  # noqa: E731 (a fresh context manager per use)

    def timed(fn, reps: int = 2, warmup: bool = True) -> float:
        if warmup:
            fn()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync(device)
        return (time.perf_counter() - t0) / reps

    rows = []
    with torch.inference_mode():
        ids = torch.zeros(chunk, dtype=torch.long, device=device)
        rest_chunk_s = timed(lambda: model(ids, lambda layer, q, k, v: q))
        small = torch.randn(1, mc.num_heads, chunk, mc.head_dim, dtype=loaded_dtype(loaded), device=device)
        with flash():  # compiles / warms the flash kernel at a small length; each context is then timed once
            F.scaled_dot_product_attention(small, small[:, : mc.num_kv_heads], small[:, : mc.num_kv_heads],
                                           is_causal=True, enable_gqa=True)
        for context in contexts:
            q = torch.randn(1, mc.num_heads, context, mc.head_dim, dtype=loaded_dtype(loaded), device=device)
            k = torch.randn(1, mc.num_kv_heads, context, mc.head_dim, dtype=q.dtype, device=device)
            v = torch.randn_like(k)
            with flash():
                layer_s = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), reps=1,
                                warmup=False)
            del q, k, v
            if device.type == "cuda":
                torch.cuda.empty_cache()
            rest_s = rest_chunk_s * context / chunk
            rows.append(dict(context=context, rest_s=rest_s, layer_attention_s=layer_s,
                             dense_ttft_s=rest_s + mc.num_layers * layer_s))
    return rows


def loaded_dtype(loaded: LoadedModel) -> torch.dtype:
    return next(loaded.model.parameters()).dtype

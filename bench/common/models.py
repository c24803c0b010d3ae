"""The models the suites run: random weights of a shape (speed: every FLOP and byte is real, tokens are noise) or a
model the product loads (answers checked), behind one --model flag.

    --model random8b     Llama-3.1-8B shape, random weights (default of the GPU speed suites)
    --model tiny         a tiny random Llama (CPU smoke runs)
    --model embedded     the package's embedded model; or a .gguf file, an HF directory, a builtin name (gemma3-270m)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from infinitehip.attention.methods.infinitehip.config import InfiniteHiPConfig
from infinitehip.config.model import ModelConfig, RopeScaling
from infinitehip.model.loading import LoadedModel, random_model

LLAMA_31_8B = ModelConfig(
    model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
    num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
    max_position_embeddings=131072, rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
)
TINY = ModelConfig(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=4096)
# InfiniteHiP sized for TINY and prompts of a few hundred tokens: every stage, refresh and bank path runs.
TINY_METHOD = InfiniteHiPConfig(sink_tokens=16, stream_tokens=64, query_block_sizes=(32, 16, 8), chunk_sizes=(64, 16, 4),
                                keep_tokens=(512, 128, 32), early_last_keep_tokens=64, refresh_intervals=(4, 2, 1),
                                early_layers=1, landmark_window=48)
RANDOM = {"random8b": (LLAMA_31_8B, "random Llama-3.1-8B-shaped weights"), "tiny": (TINY, "tiny random")}


def add_model_flags(parser: argparse.ArgumentParser, default: str = "random8b", random_only: bool = False) -> None:
    group = parser.add_argument_group("model")
    if random_only:
        group.add_argument("--model", choices=tuple(RANDOM), default=default,
                           help=f"random8b: Llama-3.1-8B shape, random weights; tiny: CPU-sized (default: {default})")
        return
    group.add_argument("--model", default=default,
                       help="random8b (Llama-3.1-8B shape, random weights), tiny, embedded, or a model the package "
                            f"loads: a .gguf file, an HF directory, gemma3-270m (default: {default})")
    group.add_argument("--model-cache-dir", default=None, help="GGUF conversion cache (default: the user cache dir)")


def is_random(name: str) -> bool:
    return name in RANDOM


def load(name: str, device: torch.device, dtype: torch.dtype, cache_dir: str | None = None) -> LoadedModel:
    """`name` on `device` in `dtype`: random weights of a shape (RANDOM) or the model the package loads."""
    if name in RANDOM:
        config, source = RANDOM[name]
        return LoadedModel(config, random_model(config, device, dtype), None, source, Path("."))
    from infinitehip.config.engine import EngineConfig
    from infinitehip.engine.llm_engine import load_engine_model

    return load_engine_model(EngineConfig(model=None if name == "embedded" else name, model_cache_dir=cache_dir,
                                          device=str(device), dtype=str(dtype).removeprefix("torch.")))


def weights_gb(loaded: LoadedModel) -> float:
    return sum(t.numel() * t.element_size() for t in loaded.model.parameters()) / 1e9


def random_ids(vocab_size: int, n: int, seed: int) -> list[int]:
    """n token ids drawn uniformly from the vocabulary with a seeded generator (the same ids on every run)."""
    return torch.randint(0, vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()

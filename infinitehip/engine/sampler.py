"""Token sampling: repetition penalty, greedy, temperature, top-k, top-p, min-p, per-request seeds."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from infinitehip.config.sampling import SamplingParams

# generation_config.json fields that are sampling defaults, under SamplingParams' names.
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def generation_defaults(model_dir: Path | None) -> dict:
    """The sampling defaults a model ships in generation_config.json (the fields vLLM reads; `do_sample` is not one:
    a request that wants greedy decoding says temperature 0)."""
    path = None if model_dir is None else Path(model_dir) / "generation_config.json"
    if path is None or not path.is_file():
        return {}
    config = json.loads(path.read_text())
    defaults = {k: config[k] for k in GENERATION_DEFAULTS if config.get(k) is not None}
    SamplingParams(**defaults)  # a model's defaults must be valid sampling settings
    return defaults


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits [vocab], seen [vocab] bool (the tokens of the prompt and output) -> logits with those tokens made less
    likely: divided by the penalty where positive, multiplied where not (HF's and vLLM's rule)."""
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
                 seen: torch.Tensor | None = None) -> int:
    """logits [vocab] float32 -> one token id. seen [vocab] bool: the tokens so far (with a repetition penalty)."""
    if params.repetition_penalty != 1.0 and seen is not None:
        logits = apply_repetition_penalty(logits, seen.to(logits.device), params.repetition_penalty)
    if params.greedy:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    if params.min_p > 0.0:  # relative to the most likely token left (the most likely one always stays)
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    # Sample on the CPU so a seed gives the same tokens on every device.
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))

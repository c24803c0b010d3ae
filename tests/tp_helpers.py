"""Helpers of test_tensor_parallel.py that spawned ranks import (a test module would drag pytest into them)."""

from __future__ import annotations

import torch


class CharTokenizer:
    """A picklable stand-in tokenizer for random-weight models: InfiniPot's catalyst prompt needs ids."""

    eos_token_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(ch) % self.vocab_size for ch in text]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ""


def sharded_mlp_rank(rank: int, size: int, init_method: str, results) -> None:
    """One rank of the row/column-parallel check: a gated MLP split over `size` gloo ranks (gate/up column-parallel,
    down row-parallel with its all-reduce) and the vocab-parallel logits, against the unsharded layers."""
    torch.set_num_threads(1)
    from infinitehip.config.model import ModelConfig
    from infinitehip.model.llama import MLP
    from infinitehip.distributed.linear import VocabParallelLogits
    from infinitehip.distributed.shard import hf_tensors, shard_hf_tensor, shard_of
    from infinitehip.distributed.state import init_parallel, shutdown_parallel

    config = ModelConfig(model_type="llama", vocab_size=101, hidden_size=32, intermediate_size=64, num_layers=1,
                         num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5, rope_theta=1e4,
                         max_position_embeddings=256)
    parallel = init_parallel(rank, size, torch.device("cpu"), init_method)
    try:
        torch.manual_seed(0)  # the same full layers and input on every rank
        full = MLP(config)
        x = torch.randn(5, config.hidden_size)
        lm_head = torch.randn(config.vocab_size, config.hidden_size)
        shard = shard_of(config, rank, size)
        local_config = config.__class__(**{**config.__dict__, "intermediate_size": config.intermediate_size // size})
        local = MLP(local_config, parallel=parallel)
        wrapper = torch.nn.Module()
        wrapper.add_module("mlp", full)  # HF names: "model.mlp.gate_proj.weight", ...
        params = dict(local.named_parameters())
        with torch.no_grad():
            for name, t in hf_tensors(wrapper, config):
                part = shard_hf_tensor(name, t, config, shard)
                ours = name.removeprefix("model.mlp.").replace("gate_proj", "gate_up_proj").replace("up_proj", "gate_up_proj")
                ours = ours.replace("gate_gate_up_proj", "gate_up_proj")
                rows = part.shape[0]
                offset = rows if "up_proj" in name and "gate_proj" not in name else 0
                params[ours][offset : offset + rows].copy_(part) if "gate_up" in ours else params[ours].copy_(part)
            mlp_err = (local(x) - full(x)).abs().max().item()
            logits = VocabParallelLogits(shard, config.vocab_size, parallel)(x, lm_head[shard.vocab[0] : shard.vocab[1]])
            logits_err = (logits - x @ lm_head.T).abs().max().item()
        results.put((rank, mlp_err, logits_err, tuple(logits.shape)))
    finally:
        shutdown_parallel()

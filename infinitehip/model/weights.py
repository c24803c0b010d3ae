"""Copy Hugging Face-named checkpoint tensors into our decoders, fusing q/k/v and gate/up on the way (Phi-3
checkpoints arrive fused already: `qkv_proj`, `gate_up_proj`)."""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from infinitehip.config.model import ModelConfig


@torch.no_grad()
def load_hf_weights(model: nn.Module, config: ModelConfig, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Every parameter of `model` must be filled exactly once; unknown or missing tensors raise."""
    params = dict(model.named_parameters())
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    fused = {  # HF name fragment -> (our fragment, row offset, rows)
        "q_proj": ("qkv_proj", 0, q), "k_proj": ("qkv_proj", q, kv), "v_proj": ("qkv_proj", q + kv, kv),
        "gate_proj": ("gate_up_proj", 0, config.intermediate_size),
        "up_proj": ("gate_up_proj", config.intermediate_size, config.intermediate_size),
    }
    tied = config.tie_word_embeddings
    loaded: set[str] = set()
    for name, tensor in tensors:
        name = name.removeprefix("model.")
        if name.startswith("rotary_emb") or (name == "lm_head.weight" and tied):
            continue
        target, offset, rows = name, 0, None
        for hf_part, (ours, off, n) in fused.items():
            if f".{hf_part}." in name:
                target, offset, rows = name.replace(hf_part, ours), off, n
        if target not in params:
            if name.endswith((".qweight", ".qzeros", ".g_idx", ".scales")):  # a quantized checkpoint without its config
                raise KeyError(f"checkpoint tensor {name!r} is a GPTQ/AWQ-style quantized weight, which the "
                               f"{config.model_type} decoder cannot use; load the unquantized model")
            raise KeyError(f"checkpoint tensor {name!r} has no place in the {config.model_type} decoder")
        dest = params[target] if rows is None else params[target][offset : offset + rows]
        if dest.shape != tensor.shape:
            raise ValueError(f"shape mismatch for {name}: checkpoint {tuple(tensor.shape)} vs model {tuple(dest.shape)}")
        dest.copy_(tensor)
        if rows is None and target.endswith(("qkv_proj.weight", "qkv_proj.bias")):  # a fused checkpoint tensor
            loaded.update(f"{target}:{off}" for off in (0, q, q + kv))
        elif rows is None and "gate_up_proj" in target:
            loaded.update(f"{target}:{off}" for off in (0, config.intermediate_size))
        else:
            loaded.add(f"{target}:{offset}")
    expected = sum(
        3 if p.endswith("qkv_proj.weight") or p.endswith("qkv_proj.bias") else 2 if "gate_up_proj" in p else 1
        for p in params
    )
    if len(loaded) != expected:
        raise ValueError(f"checkpoint is incomplete: loaded {len(loaded)} of {expected} tensors")

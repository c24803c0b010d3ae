"""Gemma 3 text decoder (transformers' `Gemma3ForCausalLM`) over a flat batch of tokens; Gemma 2 is the same
decoder without the q/k norms (qk_norm False), with alternating local/global layers and attention soft-capping
(attn_logit_softcapping, applied by the sliding-window layers and the dense method: attention/common/softcap.py).

Same contract as `model/llama.py`: every layer hands pre-RoPE q/k/v to the engine's `AttentionFn` with its
own layer index; the engine routes sliding-window layers to exact local attention and full-attention
layers to the chosen method (`attention/common/hybrid.py`). What differs from Llama, as transformers defines it:
- RMSNorm scales by (1 + weight) and casts after the multiply;
- four norms per layer ("sandwich"): before and after attention, before and after the MLP;
- embeddings scaled by sqrt(hidden_size) (in the weights' dtype);
- per-head RMSNorm on q and k, scores scaled by query_pre_attn_scalar ** -0.5 (folded into q by the shared Attention, so
  every method's usual head_dim ** -0.5 gives the model's scale);
- GeGLU MLP (tanh-approximated GELU on the gate).
"""

from __future__ import annotations

import functools
import math
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from infinitehip.config.model import ModelConfig
from infinitehip.model.llama import MLP, Attention, AttentionFn, OutputHead
from infinitehip.model.rms_norm.op import rms_norm
from infinitehip.model.weights import load_hf_weights
from infinitehip.distributed.state import ParallelState


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, gemma=True)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, parallel: ParallelState | None = None):
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.self_attn = Attention(config, layer_idx, norm=GemmaRMSNorm, o_proj_bias=config.attention_bias,
                                   parallel=parallel)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.mlp = MLP(config, act=functools.partial(F.gelu, approximate="tanh"), parallel=parallel)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)

    def forward(self, x: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), attention))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3Model(nn.Module):
    def __init__(self, config: ModelConfig, parallel: ParallelState | None = None):
        """parallel: build one tensor-parallel rank (distributed/shard.py)."""
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.output_head = OutputHead(config, parallel)
        self.layer_config = self.output_head.layer_config  # the rank's heads and MLP rows under tensor parallelism
        self.layers = nn.ModuleList(Gemma3DecoderLayer(self.layer_config, i, parallel) for i in range(config.num_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        rows = self.output_head.rows
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, rows, bias=False)
        self.embed_scale = math.sqrt(config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        """input_ids [T] -> final normalised hidden states [T, hidden_size]."""
        x = self.embed_tokens(input_ids)
        # transformers multiplies by the scale rounded to the weights' dtype (bf16: 25.25, not 25.30, for 640).
        x = x * float(torch.tensor(self.embed_scale, dtype=x.dtype))
        for layer in self.layers:
            x = layer(x, attention)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] -> float32 logits [N, vocab]."""
        logits = self.output_head.logits(hidden, self.embed_tokens, self.lm_head).float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_hf_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_hf_weights(self, self.layer_config, self.output_head.weights(self.config, tensors))

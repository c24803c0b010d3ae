"""Gemma 3 text decoder (transformers' `Gemma3ForCausalLM`) over a flat batch of tokens.

Same contract as `model/llama.py`: every layer hands pre-RoPE q/k/v to the engine's `AttentionFn` with its
own layer index; the engine routes sliding-window layers to exact local attention and full-attention
layers to the chosen method (`attention/hybrid.py`). What differs from Llama, as transformers defines it:
- RMSNorm scales by (1 + weight) and casts after the multiply;
- four norms per layer ("sandwich"): before and after attention, before and after the MLP;
- embeddings scaled by sqrt(hidden_size) (in the weights' dtype);
- per-head RMSNorm on q and k, scores scaled by query_pre_attn_scalar ** -0.5 (folded into q here, so
  every method's usual head_dim ** -0.5 gives the model's scale);
- GeGLU MLP (tanh-approximated GELU on the gate).
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from infinitehip.config.model import ModelConfig
from infinitehip.model.llama import AttentionFn
from infinitehip.model.weights import load_hf_weights


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class GemmaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.attention_bias)
        self.q_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        # Methods scale scores by head_dim ** -0.5; the model wants query_pre_attn_scalar ** -0.5.
        scalar = config.query_pre_attn_scalar or config.head_dim
        self.q_factor = math.sqrt(config.head_dim / scalar)

    def forward(self, x: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.view(T, self.num_heads, self.head_dim))
        k = self.k_norm(k.view(T, self.num_kv_heads, self.head_dim))
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.q_factor != 1.0:
            q = q * self.q_factor
        out = attention(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(T, self.q_size))


class GemmaMLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.self_attn = GemmaAttention(config, layer_idx)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)
        self.mlp = GemmaMLP(config)
        self.post_feedforward_layernorm = GemmaRMSNorm(config.hidden_size, eps)

    def forward(self, x: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), attention))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3Model(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
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
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(hidden, weight).float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_hf_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_hf_weights(self, self.config, tensors)

"""Llama-family decoder (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, SmolLM2, Phi-3) over a flat batch of tokens.

The decoder knows nothing about sequences, positions or caches: every layer hands its pre-RoPE
q/k/v to an `AttentionFn` supplied by the engine, which owns the KV cache and the attention method.
Tokens of all sequences in a step are concatenated: hidden states are [T, hidden_size].
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from infinitehip.config.model import ModelConfig
from infinitehip.model.rms_norm.op import add_rms_norm, rms_norm
from infinitehip.model.weights import load_hf_weights
from infinitehip.distributed.linear import VocabParallelLogits, row_linear
from infinitehip.distributed.shard import local_config, shard_hf_tensor, shard_of
from infinitehip.distributed.state import ParallelState


class AttentionFn(Protocol):
    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, num_heads, head_dim], k/v [T, num_kv_heads, head_dim], all without RoPE -> [T, num_heads, head_dim]."""
        ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [..., D] -> its norm; with a residual stream, (norm(x + residual), x + residual) in one op (one kernel on
        CUDA). Normalises in float32 and casts back before the weight, as the reference implementations do."""
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        return add_rms_norm(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    """Fused q/k/v projection, optional per-head q/k norm (`norm`: the model's RMSNorm class), the method's attention.

    o_proj_bias: Gemma's o_proj follows attention_bias; Qwen2's q/k/v bias leaves o_proj without one.
    parallel: a tensor-parallel rank (config is then the rank's `local_config`: its heads): o_proj sums over ranks."""

    def __init__(self, config: ModelConfig, layer_idx: int, norm: type[nn.Module] = RMSNorm, o_proj_bias: bool = False,
                 parallel: ParallelState | None = None):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        # q, k and v projections fused into one matmul: [q_size + 2 * kv_size, hidden].
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias)
        self.o_proj = row_linear(self.q_size, config.hidden_size, o_proj_bias, parallel)
        self.q_norm = norm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = norm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        # Methods scale scores by head_dim ** -0.5; Gemma wants query_pre_attn_scalar ** -0.5 (folded into q).
        self.q_factor = math.sqrt(config.head_dim / (config.query_pre_attn_scalar or config.head_dim))
        if layer_idx in config.full_layers:  # yarn / longrope scale full-attention scores by attention_factor ** 2
            self.q_factor *= config.rope_scaling.attention_factor ** 2

    def forward(self, x: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.q_factor != 1.0:
            q = q * self.q_factor
        out = attention(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(T, self.q_size))


class MLP(nn.Module):
    """Gated MLP: down(act(gate) * up); act is SiLU (Llama family) or tanh-approximated GELU (Gemma's GeGLU)."""

    def __init__(self, config: ModelConfig, act: Callable[[torch.Tensor], torch.Tensor] = F.silu,
                 parallel: ParallelState | None = None):
        super().__init__()
        self.act = act
        self.intermediate_size = config.intermediate_size
        # gate and up projections fused: [2 * intermediate, hidden].
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = row_linear(config.intermediate_size, config.hidden_size, False, parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(self.act(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, parallel: ParallelState | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx, parallel=parallel)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config, parallel=parallel)

    def forward(self, x: torch.Tensor, attention: AttentionFn,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the last sublayer's output and residual the stream before it (None: x is the embedding), so the hidden
        state is x + residual -> this layer's MLP output and the stream before it. Each residual add runs inside
        the next norm's kernel; the sums and their roundings are those of `h = h + sublayer(norm(h))`."""
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm(x, residual)
        h, residual = self.post_attention_layernorm(self.self_attn(h, attention), residual)
        return self.mlp(h), residual


class OutputHead:
    """The decoder's output projection, single-process or vocab-parallel (distributed/shard.py says why).

    layer_config: the config the decoder's layers are built with (the rank's heads under tensor parallelism);
    rows: the lm_head's rows (the rank's vocabulary rows)."""

    def __init__(self, config: ModelConfig, parallel: ParallelState | None):
        self.shard, self.vocab_parallel = None, None
        self.layer_config = config if parallel is None else local_config(config, parallel.size)
        self.rows = config.vocab_size
        if parallel is not None:
            self.shard = shard_of(config, parallel.rank, parallel.size)
            self.vocab_parallel = VocabParallelLogits(self.shard, config.vocab_size, parallel)
            self.rows = self.shard.vocab[1] - self.shard.vocab[0]

    def logits(self, hidden: torch.Tensor, embed: nn.Embedding, lm_head: nn.Linear | None) -> torch.Tensor:
        """hidden [N, hidden_size] -> logits [N, vocab] in the weights' dtype."""
        weight = embed.weight if lm_head is None else lm_head.weight
        if self.vocab_parallel is None:
            return F.linear(hidden, weight)
        if lm_head is None:  # tied: this rank's rows of the replicated embedding
            weight = weight[self.shard.vocab[0] : self.shard.vocab[1]]
        return self.vocab_parallel(hidden, weight)

    def weights(self, config: ModelConfig, tensors: Iterable[tuple[str, torch.Tensor]]):
        """Checkpoint tensors as this rank holds them (all of them single-process)."""
        if self.shard is None:
            return tensors
        return ((name, shard_hf_tensor(name, t, config, self.shard)) for name, t in tensors)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, parallel: ParallelState | None = None):
        """parallel: build one tensor-parallel rank (its heads, MLP rows and vocabulary rows; distributed/shard.py)."""
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.output_head = OutputHead(config, parallel)
        self.layer_config = self.output_head.layer_config  # the rank's heads and MLP rows under tensor parallelism
        self.layers = nn.ModuleList(DecoderLayer(self.layer_config, i, parallel) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        rows = self.output_head.rows
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, rows, bias=False)

    def forward(self, input_ids: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        """input_ids [T] -> final normalised hidden states [T, hidden_size]."""
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(x, attention, residual)
        return self.norm(x) if residual is None else self.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden_size] -> float32 logits [N, vocab]; callers pass only the rows they sample from."""
        return self.output_head.logits(hidden, self.embed_tokens, self.lm_head).float()

    def load_hf_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors into this model (model/weights.py), sliced to a rank's part."""
        load_hf_weights(self, self.layer_config, self.output_head.weights(self.config, tensors))

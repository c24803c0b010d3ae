"""What one rank of a tensor-parallel decoder holds, and checkpoint tensors sliced to it.

Split (Megatron-style): each rank holds num_heads / size query heads with their KV heads, and
intermediate_size / size MLP rows. q/k/v and gate/up are column-parallel (rows of the weight sliced, no
communication); o_proj and down_proj are row-parallel (input columns sliced, partial outputs summed by an
all-reduce). The attention method and the KV cache of a rank see only its heads: its `local_config`.

KV heads: when num_kv_heads is a multiple of the size each rank holds its share; when the size is a multiple of
num_kv_heads, every KV head is replicated on size / num_kv_heads ranks (each holds one, as vLLM does), so a
GQA/MQA model runs on more ranks than it has KV heads; any other combination is refused (the query heads of one
rank would need KV heads of two ranks).

Vocabulary: the embedding is replicated (a lookup of T rows; sharding it would add an all-reduce per step to save
V x hidden of memory), the output projection is vocab-parallel (the logits matmul is the largest single matmul of a
decode step; rows split in ceil(V / size) blocks, the last one padded) and its logits are gathered on every rank
(methods such as InfiniPot read per-token losses on every rank).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch

from infinitehip.config.model import ModelConfig


@dataclass(frozen=True)
class Shard:
    rank: int
    size: int
    q_heads: tuple[int, int]  # [start, end) of the query heads
    kv_heads: tuple[int, int]  # [start, end) of the KV heads (one replicated head when size > num_kv_heads)
    mlp_rows: tuple[int, int]  # [start, end) of the intermediate rows
    vocab: tuple[int, int]  # [start, end) of the output rows held (the last block may be short)
    vocab_block: int  # ceil(V / size): logits columns per rank after padding


def check_shardable(config: ModelConfig, size: int) -> None:
    """ValueError naming the model's sizes when `size` ranks cannot split it."""
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {size}")
    h, kv = config.num_heads, config.num_kv_heads
    if h % size:
        raise ValueError(f"tensor_parallel_size {size} must divide the model's {h} attention heads")
    if kv % size and size % kv:
        raise ValueError(f"tensor_parallel_size {size} must divide the model's {kv} KV heads or be a multiple of "
                         f"them (KV heads are then replicated); {kv} KV heads: try a size dividing {h} and {kv}")
    if config.intermediate_size % size:
        raise ValueError(f"tensor_parallel_size {size} must divide intermediate_size {config.intermediate_size}")


def shard_of(config: ModelConfig, rank: int, size: int) -> Shard:
    check_shardable(config, size)
    hl = config.num_heads // size
    if config.num_kv_heads >= size:
        kvl = config.num_kv_heads // size
        kv = (rank * kvl, (rank + 1) * kvl)
    else:  # replicated: rank r's query heads all belong to KV head r * kv // size
        head = rank * config.num_kv_heads // size
        kv = (head, head + 1)
    m = config.intermediate_size // size
    block = -(-config.vocab_size // size)
    vocab = (min(rank * block, config.vocab_size), min((rank + 1) * block, config.vocab_size))
    return Shard(rank, size, (rank * hl, (rank + 1) * hl), kv, (rank * m, (rank + 1) * m), vocab, block)


def local_config(config: ModelConfig, size: int) -> ModelConfig:
    """The decoder layers, KV cache and attention method of one rank: its heads and MLP rows, the rest unchanged."""
    if size == 1:
        return config
    check_shardable(config, size)
    return dataclasses.replace(config, num_heads=config.num_heads // size,
                               num_kv_heads=max(1, config.num_kv_heads // size),
                               intermediate_size=config.intermediate_size // size)


_ROWS = {"q_proj": "q", "k_proj": "kv", "v_proj": "kv", "gate_proj": "mlp", "up_proj": "mlp"}  # column-parallel
_COLS = {"o_proj": "q", "down_proj": "mlp"}  # row-parallel (weights sliced on their input dimension)


def shard_hf_tensor(name: str, tensor: torch.Tensor, config: ModelConfig, shard: Shard) -> torch.Tensor:
    """Hugging Face-named checkpoint tensor -> the part `shard` holds (norms and the embedding: all of it)."""
    d = config.head_dim
    ranges = {"q": (shard.q_heads[0] * d, shard.q_heads[1] * d), "kv": (shard.kv_heads[0] * d, shard.kv_heads[1] * d),
              "mlp": shard.mlp_rows}
    proj = re.search(r"\.(\w+_proj)\.(weight|bias)$", name)
    if proj and proj.group(1) in _ROWS:
        a, b = ranges[_ROWS[proj.group(1)]]
        return tensor[a:b]
    if proj and proj.group(1) in _COLS:
        if proj.group(2) == "bias":  # added once: the all-reduce sums every rank's partial output
            return tensor if shard.rank == 0 else torch.zeros_like(tensor)
        a, b = ranges[_COLS[proj.group(1)]]
        return tensor[:, a:b]
    if name.endswith("lm_head.weight"):
        return tensor[shard.vocab[0] : shard.vocab[1]]
    return tensor


def hf_tensors(model: torch.nn.Module, config: ModelConfig):
    """A full (unsharded) decoder's parameters under Hugging Face names, the fused q/k/v and gate/up split back
    (what `model/weights.load_hf_weights` reads): how an in-memory model reaches the ranks."""
    q, kv, m = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim, config.intermediate_size
    for name, p in model.named_parameters():
        t = p.detach()
        if ".qkv_proj." in name:
            for part, (a, b) in (("q_proj", (0, q)), ("k_proj", (q, q + kv)), ("v_proj", (q + kv, q + 2 * kv))):
                yield "model." + name.replace("qkv_proj", part), t[a:b]
        elif ".gate_up_proj." in name:
            for part, (a, b) in (("gate_proj", (0, m)), ("up_proj", (m, 2 * m))):
                yield "model." + name.replace("gate_up_proj", part), t[a:b]
        else:
            yield (name if name.startswith("lm_head") else "model." + name), t

"""Row-parallel projections and vocab-parallel logits (the column-parallel ones are plain nn.Linear of the
rank's rows: their outputs stay split by head / MLP row until a row-parallel layer consumes them)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from infinitehip.distributed.shard import Shard
from infinitehip.distributed.state import ParallelState


class RowParallelLinear(nn.Linear):
    """x [T, in / size] (this rank's heads or MLP rows) -> summed over the ranks [T, out]. Only rank 0 holds the
    bias (`shard.shard_hf_tensor` zeroes it elsewhere), so the sum adds it once."""

    def __init__(self, in_features: int, out_features: int, bias: bool, parallel: ParallelState):
        super().__init__(in_features, out_features, bias=bias)
        self.parallel = parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.parallel.all_reduce(F.linear(x, self.weight, self.bias))


def row_linear(in_features: int, out_features: int, bias: bool, parallel: ParallelState | None) -> nn.Linear:
    """nn.Linear single-process (today's module, no collective); RowParallelLinear on a tensor-parallel rank."""
    if parallel is None:
        return nn.Linear(in_features, out_features, bias=bias)
    return RowParallelLinear(in_features, out_features, bias, parallel)


class VocabParallelLogits:
    """Logits from this rank's rows of the output projection [V_r, hidden], gathered: hidden [N, hidden] -> [N, V].

    Rank r holds rows [r * B, min((r + 1) * B, V)) with B = ceil(V / size); a short last block is padded before
    the gather and the padding cut after it."""

    def __init__(self, shard: Shard, vocab_size: int, parallel: ParallelState):
        self.shard, self.vocab_size, self.parallel = shard, vocab_size, parallel

    def __call__(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """weight: this rank's rows [V_r, hidden] (for tied embeddings, a slice of the replicated embedding)."""
        local = F.linear(hidden, weight)
        pad = self.shard.vocab_block - local.shape[-1]
        if pad:
            local = F.pad(local, (0, pad))
        return self.parallel.all_gather_last(local)[:, : self.vocab_size]

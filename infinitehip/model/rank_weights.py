"""How each tensor-parallel rank gets its part of the weights (and the tokenizer its method may need).

Three sources, all ending in `model/weights.load_hf_weights` on the rank's decoder, which slices every
Hugging Face-named tensor to the rank's part (`distributed.shard.shard_hf_tensor`):
- a checkpoint directory (safetensors): every rank reads it and keeps its slices;
- an in-memory model (`LoadedModel`): its tensors under HF names, on the CPU (spawned ranks receive them through
  shared memory, not copies);
- random weights of a shape (benchmarks): each rank fills its own part (not slices of one model: the weights
  differ from a single-process run's, their shapes and costs do not).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from infinitehip.config.model import ModelConfig
from infinitehip.model.loading import LoadedModel, empty_model, load_weights_from_dir, random_model
from infinitehip.distributed.shard import check_shardable, hf_tensors
from infinitehip.distributed.state import ParallelState


@dataclass
class RankWeights:
    config: ModelConfig
    tokenizer: object = None
    source: str = ""
    model_dir: Path = Path(".")
    checkpoint_dir: Path | None = None  # read the rank's slices from this directory's *.safetensors
    tensors: dict[str, torch.Tensor] | None = None  # HF name -> full CPU tensor
    random_seed: int | None = None  # random weights, each rank its own part

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.checkpoint_dir, self.tensors, self.random_seed)) != 1:
            raise ValueError("RankWeights needs exactly one of checkpoint_dir, tensors, random_seed")

    @classmethod
    def from_loaded(cls, loaded: LoadedModel) -> "RankWeights":
        tensors = {name: t.cpu() for name, t in hf_tensors(loaded.model, loaded.config)}
        return cls(loaded.config, loaded.tokenizer, loaded.source, loaded.model_dir, tensors=tensors)

    @classmethod
    def random(cls, config: ModelConfig, seed: int = 0, source: str = "random weights") -> "RankWeights":
        return cls(config, source=source, random_seed=seed)

    def load(self, parallel: ParallelState | None, device: torch.device, dtype: torch.dtype) -> LoadedModel:
        """This rank's decoder (the whole model when parallel is None)."""
        if parallel is not None:
            check_shardable(self.config, parallel.size)
        if self.random_seed is not None:
            # One seed on every rank: the replicated embedding (drawn first) is the same everywhere, as it must be.
            model = random_model(self.config, device, dtype, self.random_seed, parallel)
        else:
            model = empty_model(self.config, device, dtype, parallel)
            if self.checkpoint_dir is not None:
                load_weights_from_dir(model, self.checkpoint_dir)
            else:
                model.load_hf_weights(self.tensors.items())
        return LoadedModel(self.config, model, self.tokenizer, self.source, self.model_dir)

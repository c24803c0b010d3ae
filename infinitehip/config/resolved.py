"""The settled values of one engine: what `EngineConfig` leaves open (auto device and dtype, the method's default
context, KV tokens and pages, the effective offload dtype and copies) decided once, before anything is built
(engine/resolve.py), and printed by `--print-config` and written into results files.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ResolvedConfig:
    model: str  # what the user named (path, Hub id, built-in name or the embedded default)
    method: str
    method_config: Any  # the method's config as it runs (fields left to the model filled in; None: no settings)
    device: str  # rank 0's device
    dtype: str  # weights and activations
    tensor_parallel_size: int
    max_context_tokens: int  # longest prompt + completion
    max_context_from: str  # "config" (max_context_tokens was set) or "method default"
    kv_token_limit: int | None  # most cache slots one sequence holds (methods that compact their cache)
    kv_scratch_tokens: int  # slots past the kept ones a method's extra forward may fill
    kv_cache_tokens: int  # KV slots allocated (whole pages: num_pages * page_size)
    page_size: int
    num_pages: int
    prefill_chunk_size: int
    max_num_seqs: int
    rope_table_tokens: int  # positions of the precomputed RoPE table (longer ones are computed on the fly)
    cuda_graphs: bool  # decode graphs are captured (CUDA and cuda_graphs; a method without them decodes eagerly)
    overlap_decode: bool  # the next graph step launches before the host reads a token (single process only)
    enable_prefix_caching: bool  # as configured; off for methods that do not declare reuse (the engine logs it)
    offload_enabled: bool
    kv_dtype: str  # the KV store's dtype (the model's unless offloaded with another)
    mask_bank_tokens: int | None  # offloaded: GPU bank sizes per layer (None: resident KV, no banks)
    attention_bank_tokens: int | None
    offload_impl: str | None  # offloaded: the host->bank copies' implementation on the device

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON data (the method config as a dict of its fields, tuples as lists)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if dataclasses.is_dataclass(self.method_config):
            out["method_config"] = dataclasses.asdict(self.method_config)
        return json.loads(json.dumps(out, default=str))

    def describe(self) -> str:
        """as_dict() as indented JSON (what `--print-config` prints)."""
        return json.dumps(self.as_dict(), indent=2)

"""A request's lifecycle state: token bookkeeping only (the scheduler reads it; tensors live elsewhere)."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from infinitehip.config.sampling import SamplingParams

_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # admitted to the queue, no KV yet
    RUNNING = "running"  # has KV pages; prefilling or decoding
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int  # resolved completion budget (params.max_tokens or what the context allows)
    seq_id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    page_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens that went through the model
    num_cached: int = 0  # cache slots in use: == num_computed unless the method compacts its cache (InfiniPot)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" (then `error` says why)
    error: str | None = None
    output_text: str = ""  # detokenized completion, cut at a stop string
    detokenizer: Any = None  # engine/detokenize.IncrementalText: output_text grows by a few tokens' text a step
    method_state: Any = None  # owned by the attention method
    generator: Any = None  # torch.Generator when the request has a seed
    dropped_prompt_tokens: int = 0  # prompt tokens the method dropped (`truncate`); prompt_ids holds those kept
    probe: Any = None  # NeedleProbe of a diagnosed request (attention/common/needle_probe.py); None normally
    # With params.logprobs / prompt_logprobs (engine/logprobs.py): one TokenLogprob per output token, and per
    # prompt token after the first (filled chunk by chunk during prefill).
    output_logprobs: list = field(default_factory=list)
    prompt_logprobs: list = field(default_factory=list)
    # With a repetition penalty: which tokens the prompt and output hold, [vocab] bool, built once from the prompt
    # and marked per sampled token (rebuilding it from a million-token prompt each step would dominate the step)
    seen_mask: Any = None
    grammar: Any = None  # the structured-output matcher following the output (params.json_schema)
    # Prefix caching (kv/prefix_cache.py): chained hashes of the prompt's full pages (computed at the first lookup),
    # prompt tokens served from cached pages at the latest admission, the hit's page copies still to run (the
    # engine runs them before the next forward), pages of the prompt registered in the cache, and whether the
    # sequence stopped registering (its chunks left the method's grid, or another sequence cached the same pages).
    page_hashes: list | None = None
    cached_prompt_tokens: int = 0
    prefix_hit: Any = None
    registered_pages: int = 0
    prefix_frozen: bool = False
    # Wall-clock times (time.time(), as vLLM's RequestMetrics): the engine took the request, sampled its first output
    # token, finished it
    arrival_time: float = field(default_factory=time.time)
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def prefill_target(self) -> int:
        """Tokens to cache before decoding: the prompt, or after a preemption everything but the newest token."""
        return self.num_tokens - 1 if self.output_ids else self.num_prompt_tokens

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prefill_target

    def advance(self, n: int) -> None:
        """n more tokens went through the model, their k/v appended to the cache."""
        self.num_computed += n
        self.num_cached += n

    def reset_cache(self) -> None:
        """Preempted: everything is recomputed from the first token (or from a cached prefix)."""
        self.num_computed = self.num_cached = 0
        self.registered_pages, self.prefix_frozen, self.prefix_hit = 0, False, None

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.max_tokens

    def token_ids(self, start: int, end: int) -> list[int]:
        # Slices only: a decode step asks for one token of a sequence that may hold a million.
        prompt, n = self.prompt_ids, len(self.prompt_ids)
        if end <= n:
            return prompt[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return prompt[start:] + self.output_ids[: end - n]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

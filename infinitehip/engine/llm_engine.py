"""LLMEngine: owns model, KV cache, attention method, scheduler and runner; advances requests step by step.

The server drives it with add_request / step / abort; `LLM` wraps it for offline generate / chat.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from infinitehip.attention.capabilities import kv_token_limit
from infinitehip.attention.common.needle_probe import NeedleProbe
from infinitehip.config.engine import EngineConfig
from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.long_text import encode_long
from infinitehip.engine.prompt_format import chat_prompt_ids
from infinitehip.engine import prefix_pages
from infinitehip.engine.rank import build_rank
from infinitehip.engine.decode_ahead import DecodeAhead, LaunchedStep
from infinitehip.engine.detokenize import IncrementalText, full_text
from infinitehip.engine.length_advice import LengthAdvice
from infinitehip.engine.request_limits import ContextLengthError, RequestLimits  # noqa: F401 (re-exported)
from infinitehip.engine.logprobs import token_logprobs
from infinitehip.engine.sampler import generation_defaults, sample_token
from infinitehip.engine.runner import StepCancelled
from infinitehip.engine.structured import StructuredOutput
from infinitehip.engine.scheduler import Scheduler
from infinitehip.engine.sequence import Sequence
from infinitehip.kv.offload.bank import BankStats
from infinitehip.kv.page_allocator import PageAllocator
from infinitehip.kv.prefix_cache import PrefixCachingAllocator, PrefixCacheStats
from infinitehip.model.loading import LoadedModel, load_model

logger = logging.getLogger(__name__)


NON_FINITE_LOGITS = ("the model's logits are not finite (NaN or infinity): its weights or KV cache are damaged; the "
                     "request was stopped")  # Sequence.error of a sequence finished with reason "error"


@dataclass
class StepOutput:
    seq: Sequence
    new_token: int
    finished: bool


def load_engine_model(config: EngineConfig) -> LoadedModel:
    """The model, tokenizer and config that `config` names, on its device and dtype."""
    from infinitehip.model.gguf_convert import default_cache_root

    cache_root = Path(config.model_cache_dir) if config.model_cache_dir else default_cache_root()
    device, dtype = config.torch_device(), config.torch_dtype()
    start = time.perf_counter()
    if config.show_progress:  # a status line per phase: a first load converts a GGUF (its own progress bar)
        name = config.model or "the embedded SmolLM2-135M-Instruct"
        print(f"loading {name} ({device}, {str(dtype).removeprefix('torch.')}) ...", file=sys.stderr, flush=True)
    loaded = load_model(config.model, cache_root, device, dtype)
    if config.show_progress:
        print(f"loaded {loaded.source} in {time.perf_counter() - start:.1f} s ({loaded.config.num_layers} layers, "
              f"trained to {loaded.config.max_position_embeddings} tokens)", file=sys.stderr, flush=True)
    return loaded


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None):
        """config: the whole run, the method's config (config.method_config) and KV offloading (config.offload: host
        store + GPU banks when its offload_enabled is set) included.
        loaded: the model (None: the one config.model names); a `model.rank_weights.RankWeights` gives each
        rank its weights its own way (random weights of a shape, for benchmarks).
        config.tensor_parallel_size > 1: this process is rank 0 (scheduler, sampling, API) of N ranks; call
        close() (or let the process end) to stop the others."""
        self.config = config
        self.device, self.dtype = config.torch_device(), config.torch_dtype()
        self.parallel = None
        if config.tensor_parallel_size > 1:  # ranks 1..N-1 start here and follow this rank's steps
            from infinitehip.engine.parallel.launch import start_ranks

            self.parallel, loaded = start_ranks(config, loaded)
            self.device = self.parallel.device
        error, parts = None, None
        try:
            if loaded is not None and not isinstance(loaded, LoadedModel):  # model.rank_weights.RankWeights
                loaded = loaded.load(self.parallel, self.device, self.dtype)
            self.loaded = loaded = loaded or load_engine_model(config)
            parts = build_rank(config, loaded, self.device, self.dtype, self.parallel, config.show_progress)
        except BaseException as e:
            error = e
        if self.parallel is not None and (failed := self.parallel.first_error(error)) is not None:
            self.close()  # every rank backs out; the ranks wait for the next engine
            raise error or RuntimeError(f"tensor-parallel engine not built: {failed}")
        if error is not None:
            raise error
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.method, self.cache, self.kv_plan, self.rope = parts.method, parts.cache, parts.kv_plan, parts.rope
        self.resolved = parts.resolved  # every effective value (config/resolved.py)
        self.sliding, self.max_context_tokens = parts.sliding, self.resolved.max_context_tokens
        self.length_advice = LengthAdvice(self.method, loaded.config, loaded.source, loaded.tokenizer)
        # Prefix caching: on where the method declares how a reused prefix stays exact (engine/prefix_pages.py).
        # With tensor parallelism every rank copies its shard of a hit's pages (engine/parallel/step_sync.py).
        self.prefix = prefix_pages.prefix_policy(config.enable_prefix_caching, self.method,
                                                 bool(loaded.config.sliding_layers), config.page_size,
                                                 self.resolved.prefill_chunk_size)
        r = self.resolved
        allocator = (PageAllocator if self.prefix is None else PrefixCachingAllocator)(r.num_pages, r.page_size)
        self.scheduler = Scheduler(allocator, r.max_num_seqs, r.prefill_chunk_size, r.kv_token_limit,
                                   r.kv_scratch_tokens, self.prefix, self.method.prompt_end_tokens)
        self.limits = RequestLimits(self.scheduler, self.kv_plan, self.method, self.model_config,
                                    self.max_context_tokens, self.length_advice)
        self.runner = parts.runner
        self.runner.prefix = self.prefix
        # Sequences whose abort is on its way (request_cancel, any thread): a step of only these stops at its next
        # layer. Not with tensor parallelism: the other ranks run the whole step.
        self._cancelled: set[int] = set()
        if self.parallel is None:
            self.runner.stop_check = lambda seq_ids: all(i in self._cancelled for i in seq_ids)
        if self.parallel is not None:  # every model call is broadcast to the other ranks first
            from infinitehip.engine.parallel.step_sync import DriverRunner

            self.runner = DriverRunner(parts.runner, self.parallel)
        # a lone greedy sequence's next graph step launched before its token is read (off with tensor parallelism:
        # the other ranks follow the driver's steps one by one)
        self.ahead = DecodeAhead(self.scheduler, self.runner, r.overlap_decode)
        mc = self.model_config
        self.generator = torch.Generator().manual_seed(config.generator_seed)
        tokenizer_eos = getattr(self.tokenizer, "eos_token_id", None)
        self.eos_ids = set(mc.eos_token_ids) | ({tokenizer_eos} if tokenizer_eos is not None else set())
        self.structured = StructuredOutput(self.tokenizer, mc.vocab_size)  # builds its tokenizer view on first use
        # What requests leave unset (LLM API and server): the model's generation_config.json sampling fields.
        self.sampling_defaults = generation_defaults(loaded.model_dir) if config.use_generation_config else {}

    # ---- requests -------------------------------------------------------------------------------------
    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return encode_long(self.tokenizer, prompt, True)
        return list(prompt)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """The chat template's prompt; a base model without one reads the contents as a completion."""
        return chat_prompt_ids(self.tokenizer, messages)

    @property
    def max_sequence_tokens(self) -> int:
        """Most tokens (prompt and completion) one request can hold (`RequestLimits.max_sequence_tokens`)."""
        return self.limits.max_sequence_tokens

    def check_request(self, prompt_ids: list[int], max_tokens: int | None) -> tuple[list[int], int]:
        """Validate a request without touching engine state -> (the prompt tokens the model reads, the resolved
        completion budget); `RequestLimits.check_request` says what is refused."""
        return self.limits.check_request(prompt_ids, max_tokens)

    def add_request(self, prompt_ids: list[int], params: SamplingParams, probe: NeedleProbe | None = None) -> Sequence:
        """Queue a request. `probe` (diagnostics): watch these prompt tokens through the method's selections, or
        force them in (attention/common/needle_probe.py)."""
        kept, max_tokens = self.check_request(prompt_ids, params.max_tokens)
        if any(t >= self.model_config.vocab_size for t in params.stop_token_ids):
            raise ValueError(f"stop_token_ids must be token ids in [0, {self.model_config.vocab_size})")
        seq = Sequence(kept, params, max_tokens, dropped_prompt_tokens=len(prompt_ids) - len(kept))
        if params.json_schema is not None:  # compiled now: a schema that cannot constrain output fails the request
            if self.tokenizer is None:
                raise ValueError("json_schema needs the model's tokenizer")
            seq.grammar = self.structured.matcher(params.json_schema)
        if probe is not None:
            if self.parallel is not None:
                raise ValueError("needle probes record on one process: run them with tensor_parallel_size 1")
            if seq.dropped_prompt_tokens:
                raise ValueError(f"method {self.method.name!r} drops prompt tokens: a needle probe's positions would "
                                 "not match the tokens read")
            if probe.tokens[-1] >= len(kept):
                raise ValueError(f"needle token {probe.tokens[-1]} is past the prompt ({len(kept)} tokens)")
            probe.prompt_tokens = len(kept)
            seq.probe = probe
        self.length_advice.on_request(seq.seq_id, len(kept), params.max_tokens)
        if seq.dropped_prompt_tokens:
            logger.info("request %d: method %s truncated %d of %d prompt tokens", seq.seq_id, self.method.name,
                        seq.dropped_prompt_tokens, len(prompt_ids))
        if params.seed is not None:
            seq.generator = torch.Generator().manual_seed(params.seed)
        self.scheduler.add(seq)
        return seq

    def prompt_logits(self, prompt_ids: list[int]) -> torch.Tensor:
        """Logits [n, vocab] at every prompt position (chunked prefill outside the scheduler's queue; a method
        that compacts its cache evicts between chunks as in a request). The prompt is read whole, never selected."""
        self.limits.check_fits(len(prompt_ids), 1)
        seq = Sequence(list(prompt_ids), SamplingParams(max_tokens=1), max_tokens=1)
        allocator = self.scheduler.allocator
        allocator.grow(seq.page_table, self.scheduler.cache_tokens(seq.max_total_tokens))
        seq.method_state = self.method.new_state()
        limit = kv_token_limit(self.method)
        try:
            chunks = []
            while seq.in_prefill:
                # chunked as the scheduler chunks a request's prefill (the method's prompt-end tokens together)
                n = self.scheduler.chunk_tokens(seq.num_prompt_tokens - seq.num_computed,
                                                self.resolved.prefill_chunk_size, seq.num_prompt_tokens)
                if limit is not None:  # a compacting method evicts after each chunk; a chunk fits the room left
                    n = min(n, limit - seq.num_cached)
                chunks.append(self.runner.forward_logits(seq, n))
            return torch.cat(chunks)
        finally:
            allocator.free(seq.page_table)
            self.method.release(seq.method_state)
            self.runner.release(seq)

    def abort(self, seq: Sequence) -> None:
        if not seq.is_finished:
            self._finish(seq, "abort")

    def request_cancel(self, seq: Sequence) -> None:
        """Any thread, before abort(seq) reaches the engine: a step running only cancelled sequences (a long prefill
        chunk of a client gone) stops at its next layer instead of at its end; its partial chunk goes with them."""
        if not seq.is_finished:
            self._cancelled.add(seq.seq_id)

    def kv_stats(self) -> dict[str, BankStats] | None:
        """Hit / miss counters of the offloaded KV's banks ({"mask": ..., "attention": ...}); None when resident.
        Reads device counters: call between steps."""
        if self.kv_plan is None:
            return None
        mask, attention = self.cache.stats()
        return {"mask": mask, "attention": attention}

    def kv_memory(self) -> dict[str, dict]:
        """KV memory per layer type: full-attention layers grow with the context (bytes per cached token, slots
        allocated), sliding-window layers hold a fixed ring of their window per sequence."""
        mc = self.model_config
        report = {"full_attention": {"layers": len(mc.full_layers), "bytes_per_token": self.cache.bytes_per_token,
                                     "tokens": self.cache.num_slots,
                                     "bytes": self.cache.bytes_per_token * self.cache.num_slots}}
        if self.sliding is not None:
            report["sliding_attention"] = {"layers": len(mc.sliding_layers), "window": mc.sliding_window,
                                           "bytes_per_sequence": self.sliding.bytes_per_sequence,
                                           "bytes": self.sliding.bytes}
        return report

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (nothing single-process); the engine cannot step afterwards."""
        if self.parallel is not None:
            from infinitehip.engine.parallel.launch import stop_ranks

            stop_ranks(self.parallel)

    def prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Prefix caching counters (tokens looked up, served from cache, pages evicted); None when it is off."""
        return None if self.prefix is None else self.scheduler.allocator.stats

    def reset_prefix_cache(self) -> int:
        """Drop every cached prefix no running sequence holds; returns the pages dropped."""
        return 0 if self.prefix is None else self.scheduler.allocator.reset_prefix_cache()

    def save_prefix_cache(self, path) -> int:
        """Write the cached prefixes to a safetensors file (engine/prefix_disk.py); call between steps."""
        from infinitehip.engine.prefix_disk import save_prefix_cache

        self._check_prefix_file()
        return save_prefix_cache(self, path)

    def load_prefix_cache(self, path) -> int:
        """Load cached prefixes saved by an engine of the same model, method and KV layout (else ValueError)."""
        from infinitehip.engine.prefix_disk import load_prefix_cache

        self._check_prefix_file()
        return load_prefix_cache(self, path)

    def _check_prefix_file(self) -> None:
        if self.parallel is not None:  # each rank holds its heads' share of every page
            raise ValueError("prefix cache files hold one process's KV: not available with tensor_parallel_size > 1 "
                             "(prefix caching itself is)")

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # ---- stepping -------------------------------------------------------------------------------------
    def step(self, on_scheduled=None) -> tuple[list[StepOutput], int]:
        """Run one step; return the sampled tokens and the number of prefill tokens processed. on_scheduled(admitted,
        preempted), if given, runs once the step is scheduled and before the model runs (a server's gauges: a step
        may take seconds)."""
        if self.ahead.pending is not None:  # a step launched ahead: read its token (and launch the next one)
            return self._step_after(self.ahead.pending, on_scheduled)
        plan, admitted, preempted = self.scheduler.schedule()
        if on_scheduled is not None:
            on_scheduled(admitted, preempted)
        for seq in preempted:  # recomputed from scratch when re-admitted
            self.method.release(seq.method_state)
            self.runner.release(seq)
            seq.method_state = None
        for seq in admitted:
            seq.method_state = self.method.new_state()
            if seq.prefix_hit is not None:  # a reused prefix's private pages and state, before its first forward
                hit, allocator = seq.prefix_hit, self.scheduler.allocator
                state = None if hit.snapshot_page is None else allocator.payload(hit.snapshot_page)
                self.runner.apply_prefix_hit(seq, hit, state, allocator.page_size)
                self.scheduler.copies_done(seq)
        if plan.is_empty:
            return [], 0
        try:
            samplers, logits = self.runner.run(plan)
        except StepCancelled:  # every sequence of the step is being aborted: nothing of it is kept
            return [], 0
        if self.prefix is not None:  # before sampling: a sequence that finishes now releases its pages as cached
            for seq, n in plan.prefill:
                boundary = self.scheduler.cache_prefix(seq, seq.num_computed - n)
                if boundary is not None and self.prefix.needs_boundary_state:
                    state = self.runner.keep_boundary(seq, self.prefix, boundary)
                    if state is not None:
                        self.scheduler.allocator.attach(seq.page_table[boundary // self.prefix.page_size - 1], state)
        if not plan.prefill and self.ahead.may_launch_after(samplers):
            return self._step_after(self.ahead.pick(samplers, logits), on_scheduled)
        outputs = []
        finite = torch.isfinite(logits).all(dim=-1).tolist()  # one read for the step (sampling reads the device anyway)
        for row, seq in enumerate(samplers):
            if not finite[row]:  # damaged weights or KV: this request fails, not the step's others
                seq.error = NON_FINITE_LOGITS
                self._finish(seq, "error")
                outputs.append(StepOutput(seq, -1, True))
                continue
            if seq.params.repetition_penalty != 1.0 and seq.seen_mask is None:
                seq.seen_mask = torch.zeros(logits.shape[-1], dtype=torch.bool)
                seq.seen_mask[torch.tensor(seq.prompt_ids + seq.output_ids, dtype=torch.long)] = True
            row_logits = logits[row]
            if seq.grammar is not None:  # structured output: only tokens the schema allows next
                row_logits = self.structured.mask(seq.grammar, row_logits)
            token = sample_token(row_logits, seq.params, seq.generator or self.generator, seq.seen_mask)
            if seq.grammar is not None:
                seq.grammar.consume_token(token)
            if seq.seen_mask is not None:
                seq.seen_mask[token] = True
            if seq.params.logprobs is not None:
                seq.output_logprobs += token_logprobs(logits[row : row + 1], torch.tensor([token], device=logits.device),
                                                     seq.params.logprobs)
            seq.output_ids.append(token)
            finished = self._check_finished(seq, token)
            outputs.append(StepOutput(seq, token, finished))
        return outputs, sum(n for _, n in plan.prefill)

    def _step_after(self, launched: LaunchedStep, on_scheduled) -> tuple[list[StepOutput], int]:
        """Launch the step after `launched` where allowed, then read `launched`'s tokens (engine/decode_ahead.py)."""
        seqs, self.ahead.pending = launched.seqs, None
        if self.ahead.may_launch_after(seqs):
            _, admitted, preempted = self.scheduler.schedule()  # the next tokens' slots: nothing waits or is preempted
            if on_scheduled is not None:
                on_scheduled(admitted, preempted)
            logits = self.runner.run_graph_ahead(seqs)
            if logits is not None:
                self.ahead.pending = self.ahead.pick(seqs, logits)
        outputs = []
        for seq, token in zip(seqs, launched.read()):
            seq.output_ids.append(token)
            finished = self._check_finished(seq, token)  # finishing drops its row of the step launched after this
            outputs.append(StepOutput(seq, token, finished))
        return outputs, 0

    def _check_finished(self, seq: Sequence, token: int) -> bool:
        """After each output token: its text and whether it ends the request (the first token's time recorded)."""
        params = seq.params
        if seq.first_token_time is None:
            seq.first_token_time = time.time()
        if self.tokenizer is not None:  # benchmarks of random-weight models run without one
            seq.detokenizer = seq.detokenizer or IncrementalText()
            seq.output_text = seq.detokenizer.update(self.tokenizer, seq.output_ids)
        reason = None
        if any(stop in seq.output_text for stop in params.stop):
            reason = "stop"
        elif token in params.stop_token_ids or (token in self.eos_ids and not params.ignore_eos):
            reason = "stop"
        elif seq.grammar is not None and seq.grammar.is_stopped():  # the schema's value is complete
            reason = "stop"
        elif len(seq.output_ids) >= seq.max_tokens:
            reason = "length"
        if reason is None:
            return False
        if self.tokenizer is not None:  # the final text: the whole output decoded once, cut at a stop string
            seq.output_text = full_text(self.tokenizer, seq.output_ids, params.stop)
        self._finish(seq, reason)
        return True

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finished_time = time.time()
        self._cancelled.discard(seq.seq_id)
        self.ahead.drop(seq)  # a step of it still running on the GPU ends before its graphs and pages are freed
        self.scheduler.finish(seq, reason)
        self.method.release(seq.method_state)
        self.runner.release(seq)

"""Offline Python API: `LLM(model=None, method="auto").generate(prompts, SamplingParams)` and `.chat(...)`.

Settings by name: `LLM(method="infinitehip", preset="3k-fast", max_context_tokens=1 << 20, offload_enabled=True)`
(engine/settings.py routes each to its config), or one `EngineConfig` (`LLM(config=...)`), which nests the method's
config and the offload config."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from infinitehip.attention.common.needle_probe import NeedleProbe
from infinitehip.config.engine import EngineConfig
from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.detokenize import stable_text
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.engine.settings import resolve_settings


@dataclass
class CompletionOutput:
    """One completion of a request, as vLLM names it (`request_output.outputs[0].text`)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    logprobs: list | None = None


@dataclass
class RequestMetrics:
    """When a request passed the engine's milestones, wall-clock seconds (time.time()), as vLLM names them
    (`request_output.metrics`): arrival (after its prompt was templated and tokenized), its first output token (the
    prefill's end: first_token_time - arrival_time is its time to first token) and its end."""

    arrival_time: float
    first_token_time: float | None
    finished_time: float | None


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]  # the prompt as given
    token_ids: list[int]
    text: str
    finish_reason: str
    dropped_prompt_tokens: int = 0  # prompt tokens the method did not read (`truncate`), reported, never silent
    needle_trace: dict | None = None  # NeedleProbe.summary() of a diagnosed request (chat(needle_tokens=...))
    # With SamplingParams.logprobs / prompt_logprobs: TokenLogprob per output token / per prompt token after the first
    logprobs: list | None = None
    prompt_logprobs: list | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (vLLM's name; 0 with caching off)
    metrics: RequestMetrics | None = None

    @property
    def outputs(self) -> list[CompletionOutput]:
        """vLLM's shape: one CompletionOutput per completion (one here: n > 1 is a server feature)."""
        return [CompletionOutput(0, self.text, self.token_ids, self.finish_reason, self.logprobs)]


class LLM:
    def __init__(self, model: str | None = None, method: str | None = None, config: EngineConfig | None = None,
                 preset: str | None = None, **fields: Any):
        """`model` and `method` (default: the embedded model, auto: dense up to half its trained length); `preset`: one of the method's presets;
        `fields`: any field of EngineConfig, of the method's config or of OffloadConfig, by name (an unknown name,
        or a field of another method, is an error).
        Config objects, for settings kept together: `config` (the whole run: EngineConfig, with its method_config
        and offload), or among `fields` `method_config` (e.g. an InfiniteHiPConfig, or a dict of its fields over
        the preset; default: the method's default preset) and `offload` (an OffloadConfig: KV offloading, host
        store + GPU banks, on when its offload_enabled is set); fields by name replace theirs."""
        if model is not None:
            fields["model"] = model
        if method is not None:
            fields["method"] = method
        self.config = resolve_settings(config, preset, **fields)
        self.engine = LLMEngine(self.config)
        self.tokenizer = self.engine.tokenizer

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> "LLM":
        """Wrap an existing engine (e.g. one built around already-loaded weights)."""
        llm = cls.__new__(cls)
        llm.config, llm.engine, llm.tokenizer = engine.config, engine, engine.tokenizer
        return llm

    def default_sampling_params(self, **overrides) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults (EngineConfig.use_generation_config)."""
        return SamplingParams(**{**self.engine.sampling_defaults, **overrides})

    def generate(
        self, prompts: str | list[int] | list[str | list[int]], params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        """Prompts are strings or token id lists; all are validated before any is run."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        return self._run([self.engine.encode_prompt(p) for p in prompts], params or self.default_sampling_params())

    def chat(self, conversations: list[dict] | list[list[dict]], params: SamplingParams | None = None,
             needle_tokens: list[int] | None = None, oracle: bool = False) -> list[RequestOutput]:
        """One conversation (a list of messages) or several; the tokenizer's chat template is applied.

        Diagnostics, for one conversation: `needle_tokens` (positions in the templated prompt) are watched
        through the method's selections and the output's `needle_trace` says what share each selection kept;
        `oracle=True` forces them into every selection (attention/common/needle_probe.py)."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        probes = None
        if needle_tokens is not None:
            if len(conversations) != 1:
                raise ValueError("needle_tokens diagnose one conversation at a time")
            probes = [NeedleProbe(tuple(needle_tokens), oracle=oracle)]
        elif oracle:
            raise ValueError("oracle=True needs needle_tokens (the prompt positions to force into the selection)")
        return self._run([self.engine.encode_chat(c) for c in conversations], params or self.default_sampling_params(), probes)

    def stream(self, prompt: str | list[int] | list[dict], params: SamplingParams | None = None) -> Iterator[str]:
        """One request's text as it is generated, in pieces that join to its final text (the start of a stop
        string is held back until it is known not to be one). `prompt`: a string or token ids, or a conversation
        (a list of messages: the chat template is applied). Closing the iterator early aborts the request."""
        if prompt and isinstance(prompt, list) and isinstance(prompt[0], dict):
            ids = self.engine.encode_chat(prompt)
        else:
            ids = self.engine.encode_prompt(prompt)
        params = params or self.default_sampling_params()
        seq = self.engine.add_request(ids, params)
        sent = 0
        try:
            with self._prefill_bar(seq.num_prompt_tokens) as bar:
                while self.engine.has_work:
                    _, prefilled = self.engine.step()
                    bar.update(prefilled)
                    if seq.output_ids:
                        bar.close()  # the prompt is read: the text follows
                    text = seq.output_text if seq.is_finished else stable_text(seq.output_text, params.stop)
                    if len(text) > sent:
                        yield text[sent:]
                        sent = len(text)
        finally:
            self.engine.abort(seq)  # a no-op once it finished

    def _prefill_bar(self, total: int) -> tqdm:
        """Prefill progress on stderr (tokens/s) when it takes several steps and show_progress is on."""
        show = self.config.show_progress and total > self.engine.resolved.prefill_chunk_size
        return tqdm(total=total, desc="prefill", unit="tok", unit_scale=True, disable=not show, leave=False)

    def _run(self, prompt_ids: list[list[int]], params: SamplingParams, probes: list | None = None) -> list[RequestOutput]:
        for ids in prompt_ids:  # fail before anything runs
            self.engine.check_request(ids, params.max_tokens)
        probes = probes or [None] * len(prompt_ids)
        seqs = [self.engine.add_request(ids, params, probe) for ids, probe in zip(prompt_ids, probes)]
        with self._prefill_bar(sum(s.num_prompt_tokens for s in seqs)) as bar:
            while self.engine.has_work:
                _, prefilled = self.engine.step()
                bar.update(prefilled)
        return [RequestOutput(ids, s.output_ids, s.output_text, s.finish_reason, s.dropped_prompt_tokens,
                              None if s.probe is None else s.probe.summary(),
                              s.output_logprobs if params.logprobs is not None else None,
                              s.prompt_logprobs if params.prompt_logprobs is not None else None,
                              s.cached_prompt_tokens, RequestMetrics(s.arrival_time, s.first_token_time, s.finished_time))
                for ids, s in zip(prompt_ids, seqs)]

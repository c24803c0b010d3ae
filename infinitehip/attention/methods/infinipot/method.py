"""`infinipot`: memory-bounded Continual Context Distillation (paper 001, Sec. 3 and App. B).

A sequence's cache is a pot of at most |M| = pot_tokens slots. Prefill fills it chunk by chunk (the
scheduler caps each chunk at the room left, kv_token_limit = |M| - |P|). When a step leaves it full, the
catalyst prompt (|P| tokens, the scheduler's scratch slots) runs after it; each layer records how much
attention the catalyst queries pay to every pot slot, per KV head. The pot is then distilled to |C| slots
per layer and KV head: the sink tokens (sink_tokens, 0 by default) and the NuC tokens (highest NLL,
token-level) first, then the CaP-scored ones; the
catalyst's own k/v are never kept. CR-RoPE: a token's position is its cache slot, so after a distillation
positions are 0..|C|-1 and new tokens continue from |C|. Decode distills the same way when the pot fills.

Attention is exact (dense causal over the pot's slots); per-head different token sets are fine because the
cache is [pages, page_size, Hkv, d] and position = slot for every head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from infinitehip.attention.base import AttentionMethod, ChunkHooks, ForwardBatch, KVSizing, SequenceSlice
from infinitehip.attention.capabilities import CacheCompaction, TokenizerBinding
from infinitehip.attention.methods.dense.method import causal_sdpa
from infinitehip.attention.methods.infinipot.config import PRESETS, InfiniPotConfig
from infinitehip.attention.methods.infinipot.distill import compact_cache, novelty_tokens, pool_scores, select_slots
from infinitehip.config.model import ModelConfig
from infinitehip.profiling import phase


@dataclass
class InfiniPotState:
    """Per sequence: what each layer/KV head holds in each cache slot (first `limit` slots), and the
    catalyst's scores while it runs. Tensors are allocated on the first step (on the cache's device)."""

    slot_tokens: torch.Tensor | None = None  # [L, Hkv, limit] int64: sequence index of the token in the slot
    slot_nll: torch.Tensor | None = None  # [L, Hkv, limit] fp32: that token's NLL when it was processed
    nll_known: torch.Tensor | None = None  # [L, Hkv, limit] bool: False for the first token of each step
    scoring: bool = False  # the catalyst prompt is running: prefill records its attention to the pot
    catalyst_scores: list[torch.Tensor | None] = field(default_factory=list)  # per layer [Hkv, S]
    distillations: int = 0
    novelty: torch.Tensor | None = None  # token indices [t] NuC picked in the last distillation


def attention_with_scores(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of q [n, H, d] (the last n of the L key positions) over k/v [L, Hkv, d], in fp32, with
    its probabilities -> (out [n, H, d], probs [Hkv, G, n, L]); query head h reads KV head h // G (GQA)."""
    n, H, d = q.shape
    L, Hkv = k.shape[:2]
    qg = q.float().view(n, Hkv, H // Hkv, d)
    scores = torch.einsum("nkgd,lkd->kgnl", qg, k.float()) * scale
    visible = torch.arange(L, device=q.device)[None, :] <= (q_offset + torch.arange(n, device=q.device))[:, None]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    out = torch.einsum("kgnl,lkd->nkgd", probs, v.float()).reshape(n, H, d)
    return out.to(q.dtype), probs


def catalyst_ids(config: InfiniPotConfig, tokenizer: Any) -> list[int]:
    """The catalyst prompt's token ids (|P|) in the model's tokenizer."""
    if tokenizer is None:
        raise ValueError("method 'infinipot' needs the model's tokenizer to encode its catalyst prompt")
    return tokenizer(config.catalyst_text, add_special_tokens=False)["input_ids"]


def pot_sizing(config: InfiniPotConfig, catalyst_tokens: int) -> KVSizing:
    """A sized config's pot: |M| - scratch slots kept, the catalyst (+ question_tokens) in the scratch slots. No
    positional limit of the context (positions stay below pot_tokens): 1M by default, as in the paper's Fig. 4."""
    scratch = catalyst_tokens + config.question_tokens
    return KVSizing(1 << 20, kv_token_limit=config.pot_tokens - scratch, kv_scratch_tokens=scratch,
                    method_config=config)


class InfiniPotAttention(AttentionMethod, CacheCompaction, TokenizerBinding):
    name = "infinipot"
    # Its pot holds what it distilled from the whole prompt so far, not the prefix's own k/v: only a prompt equal
    # to an earlier one up to every compaction could reuse it. Prefix caching is off for it.
    prefix_reuse_note = "its cache is the distilled pot of the whole prompt so far, not a reusable prefix"

    def __init__(self, model_config: ModelConfig, config: InfiniPotConfig | None = None):
        super().__init__(model_config)
        self.config = (config or PRESETS["default"]).for_model(model_config.max_position_embeddings)
        if self.config.pot_tokens > model_config.max_position_embeddings:
            raise ValueError(
                f"pot_tokens = {self.config.pot_tokens} exceeds the model's trained length "
                f"{model_config.max_position_embeddings}: CR-RoPE positions would leave the trained range"
            )
        self.sm_scale = model_config.head_dim ** -0.5
        self.catalyst_ids: torch.Tensor | None = None  # [|P|] int64, set by bind_tokenizer

    # ---- engine hookup ------------------------------------------------------------------------------------
    @classmethod
    def kv_sizing(cls, model_config: ModelConfig, config: InfiniPotConfig | None = None,
                  tokenizer: Any = None) -> KVSizing:
        """The pot's slots: |M| - |P| kept (kv_token_limit), the catalyst's |P| (+ question_tokens) as scratch; the
        catalyst's length is its text in the model's tokenizer."""
        config = (config or PRESETS["default"]).for_model(model_config.max_position_embeddings)
        return pot_sizing(config, len(catalyst_ids(config, tokenizer)))

    def own_kv_sizing(self) -> KVSizing:
        return pot_sizing(self.config, self._catalyst().numel())

    def bind_tokenizer(self, tokenizer: Any) -> None:
        ids = catalyst_ids(self.config, tokenizer)
        c = self.config
        if c.compressed_tokens + len(ids) + c.question_tokens >= c.pot_tokens:
            raise ValueError(
                f"pot_tokens = {c.pot_tokens} leaves no room for new tokens after a distillation: it must exceed "
                f"compressed_tokens ({c.compressed_tokens}) + the catalyst prompt's {len(ids)} tokens"
                + (f" + question_tokens ({c.question_tokens})" if c.question_tokens else "")
            )
        self.catalyst_ids = torch.tensor(ids, dtype=torch.long)

    def _catalyst(self) -> torch.Tensor:
        if self.catalyst_ids is None:
            raise RuntimeError("infinipot: bind_tokenizer() must run before the method is used (the engine does it)")
        return self.catalyst_ids

    def _catalyst_for(self, prompt_ids) -> torch.Tensor:
        """The catalyst run at a distillation [<= |P|]: the catalyst prompt, then the prompt's last
        question_tokens tokens when set (fewer when the prompt is shorter)."""
        n = self.config.question_tokens
        if n == 0 or len(prompt_ids) == 0:
            return self._catalyst()
        tail = torch.tensor(list(prompt_ids[-n:]), dtype=torch.long)
        return torch.cat([self._catalyst(), tail])

    def new_state(self) -> InfiniPotState:
        return InfiniPotState()

    # ---- attention ----------------------------------------------------------------------------------------
    def prefill(self, layer: int, q: torch.Tensor, seq: SequenceSlice, batch: ForwardBatch) -> torch.Tensor:
        k, v = seq.cache.read(layer, seq.context_slots)
        k = batch.rope.apply_range(k, 0)  # CR-RoPE: position = cache slot
        q = batch.rope.apply_range(q, seq.start_pos)
        state: InfiniPotState = seq.state
        if not state.scoring:
            return causal_sdpa(q, k, v, seq.start_pos)
        out, probs = attention_with_scores(q, k, v, seq.start_pos, self.sm_scale)
        # CaP score of each pot slot per KV head: attention of every catalyst query of the group's heads (Eq. 2)
        state.catalyst_scores[layer] = probs[..., : seq.start_pos].sum(dim=(1, 2))
        return out

    # ---- distillation -------------------------------------------------------------------------------------
    def after_forward(self, seq: SequenceSlice, hooks: ChunkHooks) -> int | None:
        state: InfiniPotState = seq.state
        if state.slot_tokens is None:
            shape = (self.model_config.num_layers, self.model_config.num_kv_heads, self.kv_token_limit)
            device = seq.cache.device
            state.slot_tokens = torch.zeros(shape, dtype=torch.long, device=device)
            state.slot_nll = torch.zeros(shape, dtype=torch.float32, device=device)
            state.nll_known = torch.zeros(shape, dtype=torch.bool, device=device)
        start, end = seq.start_pos, seq.context_len
        state.slot_tokens[:, :, start:end] = torch.arange(seq.token_start, seq.token_start + seq.num_queries, device=seq.cache.device)
        state.nll_known[:, :, start] = False  # its prediction came from the previous step's last row, not kept
        if self.config.novelty_tokens > 0 and seq.num_queries > 1:
            state.slot_nll[:, :, start + 1 : end] = hooks.token_nll()  # before extra_forward reuses the model
            state.nll_known[:, :, start + 1 : end] = True
        if end < self.kv_token_limit:
            return None
        return self._distill(seq, hooks)

    @phase("InfiniPot distillation")
    def _distill(self, seq: SequenceSlice, hooks: ChunkHooks) -> int:
        state: InfiniPotState = seq.state
        S, C = seq.context_len, self.config.compressed_tokens
        state.catalyst_scores = [None] * self.model_config.num_layers
        state.scoring = True
        try:
            hooks.extra_forward(self._catalyst_for(hooks.prompt_ids))  # its k/v land in scratch slots S..S+|P|-1
        finally:
            state.scoring = False
        cap = pool_scores(torch.stack(state.catalyst_scores), self.config.pool_tokens)  # [L, Hkv, S]
        state.catalyst_scores = []
        tokens = state.slot_tokens[..., :S]
        sinks = self.config.sink_tokens  # tokens 0..sinks-1: in every row, as every distillation keeps them
        candidates = state.nll_known[..., :S] & (tokens >= sinks)
        novel = novelty_tokens(tokens, state.slot_nll[..., :S], candidates, self.config.novelty_tokens)
        kept_first = torch.cat([torch.arange(min(sinks, S), device=tokens.device), novel])  # sorted: sinks < novel
        keep = select_slots(cap, tokens, kept_first, C)  # [L, Hkv, C] ascending: original order kept
        compact_cache(seq.cache, seq.page_table, keep)
        for t in (state.slot_tokens, state.slot_nll, state.nll_known):
            t[..., :C] = t[..., :S].gather(2, keep)
        state.distillations += 1
        state.novelty = novel
        return C

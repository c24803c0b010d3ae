"""InfiniteHiP method configuration: pruning stages, sink/stream tokens, RoPE styles, mask refresh.

Stage i is (query_block_sizes[i], chunk_sizes[i], keep_tokens[i], refresh_intervals[i]); the tuples are
flat so each can be overridden from the command line (--chunk-sizes 256 32 8). The paper's settings (Appendix F)
are named presets; the defaults are the settings measured best on the real-text suite.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from infinitehip.config.impl import IMPLS, check_impl

# RoPE styles used while scoring chunks in the pruning stages (paper Table 8 rows, plus `none`).
PRUNING_ROPE_STYLES = ("chunk_indexed", "relative", "dynamic", "infllm", "none")
# RoPE styles inside the block-sparse attention (Table 8 columns, plus `none`).
ATTENTION_ROPE_STYLES = ("streaming", "dynamic", "infllm", "none")
REPRESENTATIVES = ("bisection", "landmark")
HEAD_AGGREGATIONS = ("max", "softmax", "zscore")  # see attention/methods/infinitehip/scoring/aggregate.py


@dataclass(frozen=True)
class InfiniteHiPConfig:
    sink_tokens: int = 256  # first tokens, always attended
    stream_tokens: int = 1024  # most recent tokens, always attended
    query_block_sizes: tuple[int, ...] = (64, 64, 64)  # prefill queries that share one selection, per stage
    # The defaults are what measured best on the real-text suite (docs/real-text.md), not the paper's: final chunks
    # of 16 tokens (a 5-digit pass key or a code word stays in one chunk; the paper's 8), question-time selection,
    # and 3k-flash's refresh intervals 96/24/8 (the paper's 16/8/4): the question's chunks are joined at every
    # last-stage refresh, so an answer keeps them between refreshes; an answer of <= 16 tokens sees the same masks
    # as with 32/16/8, and the longer intervals are what meets the decode speed targets.
    # The paper's settings are the presets `paper-3k` (= `3k`) and `paper-5k` (= `5k`).
    chunk_sizes: tuple[int, ...] = (256, 32, 16)  # chunk tokens per stage (powers of two, each dividing the last)
    # The last stage keeps one chunk budget of 256 tokens (the paper's 2048; preset `wide-final`): beside the sink,
    # the window and the question's chunks, more pruned keys made the answer copy look-alike text on code.
    keep_tokens: tuple[int, ...] = (32768, 8192, 256)  # tokens each pruning stage keeps
    refresh_intervals: tuple[int, ...] = (96, 24, 8)  # decode steps between refreshes of each stage's mask
    early_layers: int = 3  # layers [0, early_layers) use the early RoPE style and early keep
    early_last_keep_tokens: int = 256  # keep_tokens of the last stage in early layers
    early_pruning_rope: str = "chunk_indexed"  # RoPE style while scoring chunks in the early layers
    late_pruning_rope: str = "relative"  # RoPE style while scoring chunks in the other layers
    attention_rope: str = "streaming"  # RoPE style inside the block-sparse attention
    impl: str = "auto"  # "auto": triton on CUDA, the CPU formulations (config/impl.py) elsewhere
    # How a chunk's representative token is found: "landmark" (the key with the highest mean logit from its
    # next landmark_window queries; see attention/methods/infinitehip/saliency.py) or "bisection" (the paper's SelectRep,
    # Alg. 3). Landmark is the default: it found the passkey needle where bisection lost it, and its stage-1
    # scoring is far cheaper (docs/devlog.md, "InfiniteHiP: selection").
    representative: str = "landmark"
    landmark_window: int = 512  # later queries whose mean logit picks a chunk's landmark key
    # How the heads' chunk scores combine into a block's chunk ranking: "max" over heads of raw logits (the
    # paper, Alg. 2 line 11), "softmax" (sum over heads of each head's softmax over the chunks) or "zscore"
    # (max over heads of per-head standardised scores); docs/devlog.md, "InfiniteHiP: selection".
    head_aggregation: str = "max"
    # Prefill chunks whose every query keeps every key (context <= sink + stream + last stage's keep) run as
    # dense causal SDPA: the same keys and, for the streaming/none attention RoPE, the same positions.
    dense_when_unpruned: bool = True
    # Within the model's trained length, exact: a prefill chunk or a decode step whose context fits the trained
    # length attends every key at its original position (dense causal SDPA); beyond it the pruned attention. The
    # method's state (landmark saliency, the question's vote) is kept in every prefill chunk either way, so a long
    # prompt's pruned chunks select as they would, and a reused prefix is the same whoever computed it. `auto`'s
    # setting (attention/methods/auto/); off here: the paper prunes from the first chunk that exceeds its budget.
    dense_within_trained: bool = False
    # The share of the trained length attended exactly when dense_within_trained: contexts up to
    # dense_within_share x the trained length. `auto` sets 0.5: Gemma 3 270M (trained to 32K) reads the genre suite
    # exactly at 16K but loses shallow needles at 32K, where the pruned stages read them (docs/real-text.md, "Which
    # method `auto` runs"); RULER finds most models' effective length well short of the trained one.
    dense_within_share: float = 1.0
    # Question-time selection (not in the paper; attention/common/question_selection.py): the prompt's last question_tokens
    # queries vote together over every candidate token (soft vote on raw logits, averaged over question_window
    # tokens); the question_keep_tokens best final-stage chunks are attended by the question's queries and by every
    # decode step of the answer, beside the hierarchy's own chunks. 0 = off (the paper).
    question_tokens: int = 32
    question_keep_tokens: int = 2048  # tokens (in final-stage chunks) the question's vote adds to the answer's keys
    question_window: int = 9  # odd width over which the question's votes are averaged and spread
    # The question's vote skips text that repeats earlier prompt text (attention/common/repeated_text.py): inside a window of
    # repeat_span tokens seen before, a token gets no vote, so the budget holds one copy of a repeated passage; a
    # chunk whose every token repeats is never kept (repetitive filler leaves budget unused). Default 32 (with
    # hierarchy_repeat_span): chosen on seeds 0-1, it read every held-out cell at least as well (docs/real-text.md).
    repeat_span: int = 32
    # The pruning stages leave repeated text out (attention/common/repeated_text.py; not in the paper): at the prompt's last
    # chunk and in decode, a stage-1 chunk whose every token lies in a window of hierarchy_repeat_span tokens seen
    # earlier in the prompt is no candidate, so the answer attends one copy of a repeated passage, not one per copy
    # (each copy would add its attention mass again). Text that never repeats is selected as without it. 0 = off.
    hierarchy_repeat_span: int = 32
    # A short chunk that ends the prompt (<= one query block, holding the question's queries: a question after a
    # cached document) runs with static shapes, each layer replayed from a CUDA graph per chunk start
    # (short_chunk.py): a second question on a resident document reaches its first token several times sooner
    # (docs/prefix-caching.md). On the CPU the same static path runs eagerly. False: the eager prefill.
    short_chunk_graphs: bool = True

    # Knobs of the studies in docs/ (RoPE styles, representatives, head aggregation, kernels): --help-all lists
    # them apart, as settings a user of the method does not need. Allowed values of the choice-like fields.
    STUDY_FIELDS: ClassVar[tuple[str, ...]] = (
        "early_layers", "early_last_keep_tokens", "early_pruning_rope", "late_pruning_rope", "attention_rope", "impl",
        "representative", "landmark_window", "head_aggregation", "dense_when_unpruned", "question_window",
        "short_chunk_graphs")
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "early_pruning_rope": PRUNING_ROPE_STYLES, "late_pruning_rope": PRUNING_ROPE_STYLES,
        "attention_rope": ATTENTION_ROPE_STYLES, "impl": IMPLS, "representative": REPRESENTATIVES,
        "head_aggregation": HEAD_AGGREGATIONS}

    def __post_init__(self) -> None:
        for name in ("query_block_sizes", "chunk_sizes", "keep_tokens", "refresh_intervals"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        n = len(self.chunk_sizes)
        if n == 0:
            raise ValueError("chunk_sizes: at least one pruning stage is needed")
        for name in ("query_block_sizes", "keep_tokens", "refresh_intervals"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries but chunk_sizes has {n} stages")
        for name in ("sink_tokens", "stream_tokens", "early_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for i, (b, c, k, r) in enumerate(zip(self.query_block_sizes, self.chunk_sizes, self.keep_tokens, self.refresh_intervals)):
            if c < 1 or c & (c - 1):
                raise ValueError(f"chunk_sizes[{i}] = {c} is not a power of two")
            if k < c or k % c:
                raise ValueError(f"keep_tokens[{i}] = {k} is not a positive multiple of chunk_sizes[{i}] = {c}")
            if b < 1:
                raise ValueError(f"query_block_sizes[{i}] must be >= 1, got {b}")
            if r < 1:
                raise ValueError(f"refresh_intervals[{i}] must be >= 1, got {r}")
            if i > 0:
                if self.chunk_sizes[i - 1] % c:
                    raise ValueError(f"chunk_sizes[{i}] = {c} must divide chunk_sizes[{i - 1}] = {self.chunk_sizes[i - 1]}")
                if k > self.keep_tokens[i - 1]:
                    raise ValueError(
                        f"keep_tokens[{i}] = {k} keeps more than stage {i - 1} passes on ({self.keep_tokens[i - 1]})"
                    )
                if self.query_block_sizes[i - 1] % b:
                    raise ValueError(
                        f"query_block_sizes[{i}] = {b} must divide query_block_sizes[{i - 1}] = {self.query_block_sizes[i - 1]}"
                    )
        last_c = self.chunk_sizes[-1]
        if self.early_last_keep_tokens < last_c or self.early_last_keep_tokens % last_c:
            raise ValueError(f"early_last_keep_tokens = {self.early_last_keep_tokens} is not a positive multiple of {last_c}")
        if n > 1 and self.early_last_keep_tokens > self.keep_tokens[-2]:
            raise ValueError(f"early_last_keep_tokens = {self.early_last_keep_tokens} keeps more than stage {n - 2} passes on")
        for name in ("early_pruning_rope", "late_pruning_rope"):
            if getattr(self, name) not in PRUNING_ROPE_STYLES:
                raise ValueError(f"{name}: unknown RoPE style {getattr(self, name)!r}; choose from {PRUNING_ROPE_STYLES}")
        if self.attention_rope not in ATTENTION_ROPE_STYLES:
            raise ValueError(f"attention_rope: unknown RoPE style {self.attention_rope!r}; choose from {ATTENTION_ROPE_STYLES}")
        if self.representative not in REPRESENTATIVES:
            raise ValueError(f"representative must be one of {REPRESENTATIVES}, got {self.representative!r}")
        if self.representative == "landmark" and not 1 <= self.landmark_window <= max(1, self.stream_tokens):
            # Candidates end stream_tokens before a block's last query, so their saliency then comes only from
            # queries up to that block: selection stays causal at block granularity.
            raise ValueError(f"landmark_window must be in [1, stream_tokens = {self.stream_tokens}], got {self.landmark_window}")
        if self.question_tokens < 0:
            raise ValueError(f"question_tokens must be >= 0 (0 = off), got {self.question_tokens}")
        if self.question_keep_tokens < last_c or self.question_keep_tokens % last_c:
            raise ValueError(f"question_keep_tokens = {self.question_keep_tokens} is not a positive multiple of "
                             f"chunk_sizes[-1] = {last_c}")
        if self.question_window < 1 or self.question_window % 2 == 0:
            raise ValueError(f"question_window must be an odd width >= 1, got {self.question_window}")
        if not 0.0 < self.dense_within_share <= 1.0:
            raise ValueError(f"dense_within_share must be in (0, 1] (a share of the trained length), got "
                             f"{self.dense_within_share}")
        if self.repeat_span != 0 and not 8 <= self.repeat_span <= 4096:
            raise ValueError(f"repeat_span must be 0 (off) or in [8, 4096] tokens, got {self.repeat_span}")
        if self.hierarchy_repeat_span != 0 and not 8 <= self.hierarchy_repeat_span <= 4096:
            raise ValueError(f"hierarchy_repeat_span must be 0 (off) or in [8, 4096] tokens, got {self.hierarchy_repeat_span}")
        if self.head_aggregation not in HEAD_AGGREGATIONS:
            raise ValueError(f"head_aggregation must be one of {HEAD_AGGREGATIONS}, got {self.head_aggregation!r}")
        check_impl("impl", self.impl)

    @property
    def num_stages(self) -> int:
        return len(self.chunk_sizes)

    def keep_tokens_for(self, layer: int, stage: int) -> int:
        if stage == self.num_stages - 1 and layer < self.early_layers:
            return self.early_last_keep_tokens
        return self.keep_tokens[stage]

    def pruning_rope_for(self, layer: int) -> str:
        return self.early_pruning_rope if layer < self.early_layers else self.late_pruning_rope


_PAPER_3K = dict(chunk_sizes=(256, 32, 8), keep_tokens=(32768, 8192, 2048), early_last_keep_tokens=4096,
                 refresh_intervals=(16, 8, 4), question_tokens=0, repeat_span=0, hierarchy_repeat_span=0)
_PAPER_5K = dict(_PAPER_3K, chunk_sizes=(64, 32, 16), keep_tokens=(32768, 16384, 4096), early_last_keep_tokens=4096)
# `default`: the field defaults (best on the real-text suite). `3k`, `5k`: the paper's settings (Appendix F);
# `paper-3k` / `paper-5k` name them as such. `3k-fast` / `3k-flash`: the paper's 3k with longer mask refresh
# intervals (speed presets). `3k-question` / `3k-fast-question`: the paper's 3k (8-token final chunks) with
# question-time selection (not in the paper; attention/common/question_selection.py), with either refresh intervals.
# `question-chunks`: the default's final-stage budgets by name (the question's chosen chunks are most of what an answer
# reads beyond the sink and the window). `wide-final`: the default with the paper's final-stage budgets (2048 tokens,
# 4096 in early layers), the previous default.
PRESETS: dict[str, InfiniteHiPConfig] = {
    "default": InfiniteHiPConfig(),
    "3k": InfiniteHiPConfig(**_PAPER_3K),
    "5k": InfiniteHiPConfig(**_PAPER_5K),
    "paper-3k": InfiniteHiPConfig(**_PAPER_3K),
    "paper-5k": InfiniteHiPConfig(**_PAPER_5K),
    "3k-fast": InfiniteHiPConfig(**dict(_PAPER_3K, refresh_intervals=(32, 16, 8))),
    "3k-flash": InfiniteHiPConfig(**dict(_PAPER_3K, refresh_intervals=(96, 24, 8))),
    "3k-question": InfiniteHiPConfig(**dict(_PAPER_3K, question_tokens=32)),
    "3k-fast-question": InfiniteHiPConfig(**dict(_PAPER_3K, refresh_intervals=(32, 16, 8), question_tokens=32)),
    "question-chunks": InfiniteHiPConfig(keep_tokens=(32768, 8192, 256), early_last_keep_tokens=256),
    "wide-final": InfiniteHiPConfig(keep_tokens=(32768, 8192, 2048), early_last_keep_tokens=4096),
}


def infinitehip_preset(name: str, **overrides) -> InfiniteHiPConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown InfiniteHiP preset {name!r}; available: {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides)

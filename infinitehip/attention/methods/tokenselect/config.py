"""TokenSelect method configuration (paper Sec. 4, App. C; defaults from Sec. 5.1: k = 2K, n_local = 512,
128 initial tokens, theta = 0.9).

`select_tokens` is the paper's k. It is not called `keep_tokens` because CLI flags are shared by name across
methods and InfiniteHiP's `keep_tokens` is a per-stage tuple.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from infinitehip.config.impl import IMPLS, check_impl

VOTE_LOGITS = ("scaled", "raw")


@dataclass(frozen=True)
class TokenSelectConfig:
    select_tokens: int = 2048  # k: tokens picked by the head soft vote (besides sink and local window)
    sink_tokens: int = 128  # first tokens, always attended
    local_tokens: int = 512  # most recent tokens (the query's own included), always attended
    # Prefill: queries of a block share one selection, made with the block's mean query (chunk-wise selection,
    # Sec. 4.2). 512 = the chunk size of the paper's prefill measurements (Fig. 4, Fig. 6).
    query_block_size: int = 512
    # Width of a max-pool over the votes before top-k (not in the paper; an option of the authors' code): a token
    # scores the best vote within vote_pool_size // 2 of it, so the selection comes as short spans around the
    # peaks instead of isolated tokens. 1 = off. Spans matter twice: on passkey filler they give a needle's digits
    # their neighbours back; on real prose a selection of a few-token fragments from all over a long document is what
    # the model reads instead of the needle's sentence (docs/devlog.md, "TokenSelect"; docs/real-text.md). Default 15:
    # chosen on the real-text suite's 1M screen over 5 (fragments) and 31 (about as good, half as many places); it
    # reads more pass keys than 5 as well (docs/devlog.md, "TokenSelect").
    vote_pool_size: int = 15
    # Logits of the vote's per-head softmax: "scaled" = q . k / sqrt(d) (the attention's own scale), "raw" = q . k
    # (the paper's eq. 10 and the authors' code): sharper per-head distributions, so a token a few heads like
    # strongly is not outvoted by tokens every head likes a little (delimiters, function words in real prose).
    vote_logits: str = "scaled"
    # Question-time selection (SnapKV-style observation window; not in the TokenSelect paper): the prompt's last
    # question_tokens queries (the question and the chat template's turn markers) vote together, each query's
    # soft vote summed, the sum averaged over a centred window of question_window tokens (a sentence: a span
    # matching several question words outranks one matching token among thousands of look-alikes in real prose)
    # and spread over the same width; the question_select_tokens best tokens are kept for the question's own
    # queries and every decode step of the answer, beside each step's own k. 0 = off (the paper, preset `paper`).
    # Defaults 32 / 9: on real-prose captures of the embedded model they put 3-4x more of a needle's value tokens
    # in the selection than one query's vote (docs/real-text.md). Budget 512, chosen over 2,048 and 1,024 on the
    # real-text suite's 1M screen (as good or better) and the passkey: 2,048 question-picked tokens of near-identical
    # filler are what the small model misread (docs/devlog.md, "TokenSelect").
    question_tokens: int = 32
    question_select_tokens: int = 512  # tokens the question's vote selects for the answer
    question_window: int = 9  # odd width over which the question's votes are averaged and spread
    # The question's vote skips text that repeats earlier prompt text (attention/common/repeated_text.py): inside a window of
    # repeat_span tokens seen before, a token gets no vote, so the budget holds one copy of a repeated passage.
    repeat_span: int = 0
    selection_cache: bool = True  # decode: reuse the last selection while queries stay similar (App. C, Alg. 1)
    selection_cache_threshold: float = 0.9  # theta: reuse when cos(query, query of the last selection) >= theta
    impl: str = "auto"  # "auto": triton on CUDA; on CPU eager scoring + batched-SDPA sparse attention

    # Knobs of the studies in docs/ (vote shape, selection cache, kernels): --help-all lists them apart.
    STUDY_FIELDS: ClassVar[tuple[str, ...]] = (
        "query_block_size", "vote_pool_size", "vote_logits", "question_window", "selection_cache",
        "selection_cache_threshold", "repeat_span", "impl")
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"vote_logits": VOTE_LOGITS, "impl": IMPLS}

    def __post_init__(self) -> None:
        if self.select_tokens < 1:
            raise ValueError(f"select_tokens must be >= 1, got {self.select_tokens}")
        if self.sink_tokens < 0:
            raise ValueError(f"sink_tokens must be >= 0, got {self.sink_tokens}")
        if self.local_tokens < 1:
            raise ValueError(f"local_tokens must be >= 1 (the query's own token), got {self.local_tokens}")
        if self.vote_pool_size < 1 or self.vote_pool_size % 2 == 0:
            raise ValueError(f"vote_pool_size must be an odd width >= 1 (1 = off), got {self.vote_pool_size}")
        if self.vote_logits not in VOTE_LOGITS:
            raise ValueError(f"vote_logits must be one of {VOTE_LOGITS}, got {self.vote_logits!r}")
        if self.question_tokens < 0:
            raise ValueError(f"question_tokens must be >= 0 (0 = off), got {self.question_tokens}")
        if self.question_select_tokens < 1:
            raise ValueError(f"question_select_tokens must be >= 1, got {self.question_select_tokens}")
        if self.question_window < 1 or self.question_window % 2 == 0:
            raise ValueError(f"question_window must be an odd width >= 1, got {self.question_window}")
        if self.repeat_span != 0 and not 8 <= self.repeat_span <= 4096:
            raise ValueError(f"repeat_span must be 0 (off) or in [8, 4096] tokens, got {self.repeat_span}")
        if self.query_block_size < 1:
            raise ValueError(f"query_block_size must be >= 1, got {self.query_block_size}")
        if not -1.0 <= self.selection_cache_threshold <= 1.0:
            raise ValueError(f"selection_cache_threshold is a cosine similarity in [-1, 1], got {self.selection_cache_threshold}")
        check_impl("impl", self.impl)

    @property
    def attended_tokens(self) -> int:
        """Most keys one decode query attends right after a selection: sink + k (+ the question's) + local."""
        question = self.question_select_tokens if self.question_tokens else 0
        return self.sink_tokens + self.select_tokens + question + self.local_tokens


# `default`: the dataclass defaults. `paper`: the paper's settings exactly (Sec. 5.1: no vote pooling, no
# question-time selection).
PRESETS: dict[str, TokenSelectConfig] = {
    "default": TokenSelectConfig(),
    "paper": TokenSelectConfig(vote_pool_size=1, question_tokens=0),
}

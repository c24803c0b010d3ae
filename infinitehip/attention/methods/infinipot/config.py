"""InfiniPot method configuration (paper 001: Continual Context Distillation, Sec. 3 and App. B).

A sequence never holds more than `pot_tokens` KV slots (|M|), catalyst prompt included: context fills the
pot up to |M| - |P| slots (|P| = catalyst prompt tokens), the catalyst runs in the last |P| slots, and
the pot is distilled to `compressed_tokens` (|C|) slots, of which novelty_fraction * |C| go first to the
highest-NLL tokens (NuC) and the rest, per KV head, to the tokens the catalyst attends most (CaP).

Sizes: 0 means "from the model", and the NuC share None "from the pot's size". `pot_tokens` 0 = half the model's
trained length, at most 16,384 (16K for Gemma 3 and Llama 3.1, 4K for the embedded SmolLM2): CR-RoPE positions
stay well inside the trained range and, on the real-text suite, a 16K pot keeps a code word through 128K of prose
where the paper's 4K pot keeps none (docs/real-text.md). `compressed_tokens` 0 = |M| / 4: the paper only requires
|M| >> |C|; a quarter keeps a distillation to once per 3|M|/4 input tokens (their cost stays a few percent of
prefill, App. C.2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

# CaP-G, the paper's general (query-agnostic) catalyst (Table 2); the blank line separates it from the context.
GENERAL_CATALYST = "\n\nSummarize the critical points highlighted in this section."
AUTO_POT_TOKENS = 16384  # the largest pot `pot_tokens=0` picks (half the trained length below 32K)
NO_NOVELTY_POT_TOKENS = 8192  # `novelty_fraction=None`: no NuC in pots this large or larger, half of |C| below


@dataclass(frozen=True)
class InfiniPotConfig:
    # |M|: KV slots per sequence, catalyst prompt included; also the largest RoPE position. 0: half the model's
    # trained length, at most 16384
    pot_tokens: int = 0
    compressed_tokens: int = 0  # |C|: slots kept by each distillation (new tokens continue at position |C|). 0: |M| / 4
    # alpha: share of |C| filled first by the highest-NLL tokens (NuC; 0.5 is Table 3's best). None: 0 for pots of
    # 8K slots or more (with the question in the catalyst, NuC's slots go to surprising prose words and cost the
    # code word its digits), 0.5 below (in a 4K pot the question's picks alone kept less; docs/real-text.md).
    novelty_fraction: float | None = None
    # First tokens of the sequence every layer/KV head keeps at every distillation, before NuC and CaP (attention
    # sinks, as StreamingLLM keeps them). Not in the paper: 0 = its CCD, where the catalyst's attention decides
    # per head (the embedded model keeps its first token in 79 of 90 rows that way, and with NuC alone in none).
    sink_tokens: int = 0
    catalyst_prompt: str = GENERAL_CATALYST  # CaP text appended after the pot to score its tokens
    # Question-aware catalyst (CaP-Q): when the question is known up front, it is appended to the catalyst
    # as "<catalyst_prompt> Question: <catalyst_question>" (the paper's best QA setting). Engine-wide:
    # every request of the engine uses it.
    catalyst_question: str | None = None
    # Per request: the prompt's last question_tokens tokens (where a prompt puts the question) follow the catalyst
    # prompt at every distillation, so the pot keeps what the request's own question attends. Not in the paper
    # (its CaP-Q needs the question as separate text); 0 = off (the paper's presets).
    question_tokens: int = 64
    # CaP scores max-pooled over this many neighbouring slots before the top-k (SnapKV's clustering; not in the
    # paper): a kept token keeps its neighbours, so a fact split into several tokens (a word and its digits)
    # survives whole. 1 = off (the paper's per-token top-k, its presets). Odd.
    pool_tokens: int = 15

    # Knobs of the studies in docs/ (NuC share, sinks, pooling): --help-all lists them apart.
    STUDY_FIELDS: ClassVar[tuple[str, ...]] = ("novelty_fraction", "sink_tokens", "pool_tokens")

    def __post_init__(self) -> None:
        if self.pot_tokens != 0 and self.pot_tokens < 2:
            raise ValueError(f"pot_tokens must be >= 2 (or 0: from the model), got {self.pot_tokens}")
        if self.compressed_tokens < 0 or (self.pot_tokens and self.compressed_tokens >= self.pot_tokens):
            raise ValueError(f"compressed_tokens must be in [1, pot_tokens={self.pot_tokens}) (or 0: pot_tokens / 4), "
                             f"got {self.compressed_tokens}")
        if self.novelty_fraction is not None and not 0.0 <= self.novelty_fraction <= 1.0:
            raise ValueError(f"novelty_fraction must be in [0, 1] (or None: from the pot's size), "
                             f"got {self.novelty_fraction}")
        if self.sized and not 0 <= self.sink_tokens <= self.compressed_tokens - self.novelty_tokens:
            raise ValueError(f"sink_tokens must be in [0, compressed_tokens - NuC tokens = "
                             f"{self.compressed_tokens - self.novelty_tokens}], got {self.sink_tokens}")
        if not self.catalyst_prompt.strip():
            raise ValueError("catalyst_prompt must not be empty: its attention scores select the kept tokens")
        if self.pool_tokens < 1 or self.pool_tokens % 2 == 0:
            raise ValueError(f"pool_tokens must be an odd number >= 1, got {self.pool_tokens}")
        if self.question_tokens < 0:
            raise ValueError(f"question_tokens must be >= 0, got {self.question_tokens}")
        if self.catalyst_question is not None and not self.catalyst_question.strip():
            raise ValueError("catalyst_question must be None or non-empty text")

    @property
    def sized(self) -> bool:
        """Sizes and NuC share given (none left to the model): what `for_model` returns and the method runs with."""
        return self.pot_tokens > 0 and self.compressed_tokens > 0 and self.novelty_fraction is not None

    def for_model(self, trained_length: int) -> "InfiniPotConfig":
        """The fields left to the model (sizes 0, NuC share None) filled in for one trained to `trained_length`."""
        pot = self.pot_tokens or min(AUTO_POT_TOKENS, trained_length // 2)
        novelty = self.novelty_fraction
        if novelty is None:
            novelty = 0.0 if pot >= NO_NOVELTY_POT_TOKENS else 0.5
        return dataclasses.replace(self, pot_tokens=pot, compressed_tokens=self.compressed_tokens or pot // 4,
                                   novelty_fraction=novelty)

    @property
    def novelty_tokens(self) -> int:
        """Slots of |C| given to NuC tokens first (of a sized config: `for_model`'s)."""
        if not self.sized:
            raise ValueError("novelty_tokens of an InfiniPotConfig whose sizes come from the model: call for_model()")
        return round(self.novelty_fraction * self.compressed_tokens)

    @property
    def catalyst_text(self) -> str:
        if self.catalyst_question is None:
            return self.catalyst_prompt
        return f"{self.catalyst_prompt} Question: {self.catalyst_question}"


# The paper's CCD: a 4K pot distilled to 1K, half of it NuC, the general catalyst, per-token top-k.
_PAPER = dict(pot_tokens=4096, compressed_tokens=1024, novelty_fraction=0.5, question_tokens=0, pool_tokens=1)
# `default`: the field defaults, the best measured on the real-text suite (Gemma 3, docs/real-text.md: the question
# in the catalyst, pooled scores, a pot of half the trained length and no NuC; chosen on seeds 0-1 of the essays at
# 128K, reported on seed 2 and on the sotu haystack). `4k` (= `paper-4k`) and `2k`: the paper's settings.
PRESETS: dict[str, InfiniPotConfig] = {
    "default": InfiniPotConfig(),
    "4k": InfiniPotConfig(**_PAPER),  # the paper's main memory budget (Table 1, Fig. 4)
    "paper-4k": InfiniPotConfig(**_PAPER),
    "2k": InfiniPotConfig(**{**_PAPER, "pot_tokens": 2048, "compressed_tokens": 512}),  # its LLaMA-2 budget (Table 1)
    # Not in the paper: for retrieving one isolated fact (passkey-style). The pot is filled almost only by NuC, so
    # every layer and head holds the same tokens, plus the attention sink. Better than "4k" on the embedded
    # model's passkey sweeps (docs/devlog.md, "InfiniPot").
    "4k-retrieval": InfiniPotConfig(**{**_PAPER, "novelty_fraction": 0.99, "sink_tokens": 4}),
}

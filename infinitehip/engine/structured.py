"""Structured output: a JSON schema constrains sampling through a token mask (llguidance).

Why llguidance: it compiles a JSON schema (or any JSON object) into a matcher that gives the allowed next tokens as
a bitmask in microseconds on the CPU, has no dependency beyond the tokenizer (xgrammar pulls torch, triton and a
TVM runtime; outlines-core is slower to compile), and vLLM, SGLang and llama.cpp use it. The mask is applied to the
logits before sampling, for every attention method (the method only changes the logits).

Per sequence a matcher follows the output; generation stops when the grammar is complete (`is_stopped`).
"""

from __future__ import annotations

import json

import torch

_OBJECT_SCHEMA = json.dumps({"type": "object"})


def json_object_schema() -> str:
    """The schema of OpenAI's `response_format: json_object`: any JSON object."""
    return _OBJECT_SCHEMA


class StructuredOutput:
    """The tokenizer's llguidance view (built once, ~1 s) and the matchers of the sequences that need one."""

    def __init__(self, tokenizer, vocab_size: int):
        self.hf_tokenizer, self.vocab_size = tokenizer, vocab_size
        self._tokenizer = None

    def _llg_tokenizer(self):
        if self._tokenizer is None:
            import llguidance.hf

            self._tokenizer = llguidance.hf.from_tokenizer(self.hf_tokenizer, n_vocab=self.vocab_size)
        return self._tokenizer

    def grammar(self, json_schema: str) -> str:
        """The grammar of a JSON schema; ValueError naming the problem when it cannot constrain output."""
        import llguidance

        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(json_schema)
        except Exception as exc:  # not JSON, or not a schema it compiles
            raise ValueError(f"json_schema: {exc}") from None
        error = llguidance.LLMatcher.validate_grammar(grammar, self._llg_tokenizer())  # "" when it compiles
        if error:
            raise ValueError(f"json_schema: {error}")
        return grammar

    def matcher(self, json_schema: str):
        import llguidance

        return llguidance.LLMatcher(self._llg_tokenizer(), self.grammar(json_schema))

    def mask(self, matcher, logits: torch.Tensor) -> torch.Tensor:
        """logits [vocab] -> a copy with every token the grammar does not allow next at -inf. The matcher fills a
        packed bitmask on the host (32 tokens per int32); it is unpacked on the logits' device (llguidance's own
        apply step goes through torch.compile, seconds of compilation on a first CPU call)."""
        import llguidance.torch as llg_torch

        bitmask = llg_torch.allocate_token_bitmask(1, self.vocab_size)
        llg_torch.fill_next_token_bitmask(matcher, bitmask, 0)
        words = bitmask[0].to(logits.device)
        bits = (words[:, None] >> torch.arange(32, dtype=torch.int32, device=logits.device)) & 1  # [words, 32]
        allowed = bits.flatten()[: logits.shape[-1]].bool()
        return logits.float().masked_fill(~allowed, float("-inf"))

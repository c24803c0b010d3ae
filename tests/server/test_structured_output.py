"""Structured output's token mask (engine/structured.py) against a plain-Python reading of llguidance's packed
bitmask, and a JSON schema honoured end to end by the offline API on the embedded model."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def llm():
    from infinitehip import LLM

    return LLM(method="dense", max_context_tokens=512, show_progress=False, device="cpu")


def test_mask_unpacks_the_grammars_bitmask(llm):
    import llguidance.torch as llg_torch

    structured = llm.engine.structured
    matcher = structured.matcher(json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}}))
    for token in llm.tokenizer('{"n": 4', add_special_tokens=False)["input_ids"]:
        bitmask = llg_torch.allocate_token_bitmask(1, structured.vocab_size)
        llg_torch.fill_next_token_bitmask(matcher, bitmask, 0)
        words = bitmask[0].tolist()
        logits = torch.randn(structured.vocab_size)
        masked = structured.mask(matcher, logits)
        allowed = [(words[t // 32] >> (t % 32)) & 1 for t in range(structured.vocab_size)]
        assert [bool(a) for a in allowed] == (masked > float("-inf")).tolist()
        assert torch.equal(masked[masked > float("-inf")], logits[torch.tensor(allowed, dtype=torch.bool)])
        assert sum(allowed) >= 1
        matcher.consume_token(token)


def test_offline_json_schema_output_parses_and_bad_schemas_are_refused(llm):
    from infinitehip import SamplingParams

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    (out,) = llm.chat([{"role": "user", "content": "Describe a person called Ann as JSON."}],
                      SamplingParams(temperature=0.0, max_tokens=48, json_schema=json.dumps(schema)))
    value = json.loads(out.text)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int) and out.finish_reason == "stop"
    with pytest.raises(ValueError, match="json_schema"):
        llm.generate(["hi"], SamplingParams(max_tokens=2, json_schema='{"type": "nonsense"}'))

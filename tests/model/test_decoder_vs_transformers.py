"""Our decoder against transformers' own implementation of the same weights (fp32)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import engine_for_dir


@pytest.mark.parametrize("length", [1, 7, 100, 700])
def test_logits_match_transformers(tiny_hf_model, length):
    family, hf_model, path = tiny_hf_model
    ids = torch.randint(0, 512, (length,), generator=torch.Generator().manual_seed(length)).tolist()
    ours = engine_for_dir(path, max_context_tokens=2048).prompt_logits(ids)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].float()
    err = (ours - ref).abs().max().item()
    assert err < 1e-4 * max(1.0, ref.abs().max().item()), f"{family} L={length}: max abs err {err}"


def test_chunked_prefill_equals_one_shot(tiny_hf_model):
    _, _, path = tiny_hf_model
    ids = torch.randint(0, 512, (777,), generator=torch.Generator().manual_seed(1)).tolist()
    one_shot = engine_for_dir(path, max_context_tokens=2048, prefill_chunk_size=1024).prompt_logits(ids)
    chunked = engine_for_dir(path, max_context_tokens=2048, prefill_chunk_size=100, page_size=16).prompt_logits(ids)
    torch.testing.assert_close(chunked, one_shot, rtol=1e-4, atol=1e-4)

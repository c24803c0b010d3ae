"""A prefix cache file is untrusted: one flipped byte in a KV tensor, NaN keys, a truncated, an empty and another
configuration's file are each refused with an error naming the file, before any page is written, so the engine's
answers stay those of an engine that never saw the file."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from infinitehip import SamplingParams
from infinitehip.engine.prefix_file_check import CHECKSUMS_KEY, PrefixCacheFileError, tensor_checksums
from tests.conftest import engine_for_dir, random_ids

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
DOC = random_ids(96, seed=3)
QUESTION = DOC + random_ids(10, seed=4)


def _engine(tiny_llama_dir, tokenizer, **config):
    return engine_for_dir(tiny_llama_dir, tokenizer, **{"max_context_tokens": 512, "page_size": 16,
                                                         "prefill_chunk_size": 32, **config})


def _answer(engine, prompt):
    seq = engine.add_request(prompt, GREEDY)
    while engine.has_work:
        engine.step()
    return seq.output_ids, seq.cached_prompt_tokens


@pytest.fixture(scope="module")
def saved(tiny_llama_dir, tokenizer, tmp_path_factory):
    """(a good file of DOC's pages, the answer to QUESTION of an engine that never loaded a file)."""
    engine = _engine(tiny_llama_dir, tokenizer)
    _answer(engine, DOC)
    path = tmp_path_factory.mktemp("prefix") / "good.safetensors"
    assert engine.save_prefix_cache(path) > 0
    fresh, cached = _answer(_engine(tiny_llama_dir, tokenizer), QUESTION)
    assert cached == 0
    return path, fresh


def _tensor_bytes(path, name: str) -> tuple[int, int]:
    """(start, end) of a tensor's bytes in a safetensors file."""
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    start, end = json.loads(data[8 : 8 + header_len])[name]["data_offsets"]
    return 8 + header_len + start, 8 + header_len + end


def _flipped_byte(good, path):
    data = bytearray(good.read_bytes())
    start, end = _tensor_bytes(good, "k")
    data[(start + end) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _nan_keys_checksummed(good, path):
    """As an engine whose keys were NaN would write it: valid checksums of NaN bytes."""
    from safetensors import safe_open

    with safe_open(str(good), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(good))
    tensors["k"][0, 0, 0, 0, 0] = float("nan")
    save_file(tensors, str(path), metadata={**metadata, CHECKSUMS_KEY: tensor_checksums(tensors)})


DAMAGES = {
    "flipped byte in k": (_flipped_byte, "tensor 'k' fails its checksum"),
    "NaN in k": (_nan_keys_checksummed, "tensor 'k' holds non-finite values"),
    "truncated": (lambda good, path: path.write_bytes(good.read_bytes()[: good.stat().st_size * 2 // 3]),
                  "not a readable safetensors file"),
    "empty": (lambda good, path: path.write_bytes(b""), "not a readable safetensors file"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_file_is_refused_and_changes_nothing(saved, tiny_llama_dir, tokenizer, tmp_path, damage):
    good, fresh = saved
    make, message = DAMAGES[damage]
    path = tmp_path / "damaged.safetensors"
    make(good, path)
    engine = _engine(tiny_llama_dir, tokenizer)
    free = engine.scheduler.allocator.num_free
    with pytest.raises(PrefixCacheFileError, match=message) as err:
        engine.load_prefix_cache(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    assert engine.scheduler.allocator.num_free == free and engine.scheduler.allocator.num_cached_pages == 0
    assert _answer(engine, QUESTION) == (fresh, 0)


def test_file_of_another_configuration_is_refused(saved, tiny_llama_dir, tokenizer):
    good, fresh = saved
    engine = _engine(tiny_llama_dir, tokenizer, page_size=32)
    with pytest.raises(PrefixCacheFileError, match=r"saved for another configuration \(differs in: page_size") as err:
        engine.load_prefix_cache(good)
    assert str(good) in str(err.value)
    assert _answer(engine, QUESTION) == (fresh, 0)


def test_good_file_loads_and_gives_the_same_answer(saved, tiny_llama_dir, tokenizer):
    good, fresh = saved
    engine = _engine(tiny_llama_dir, tokenizer)
    assert engine.load_prefix_cache(good) == len(DOC) // 16
    assert _answer(engine, QUESTION) == (fresh, len(DOC))

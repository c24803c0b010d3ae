"""One resolver: `resolve_config` settles every effective value from EngineConfig and the model before anything is
built, and the engine runs with exactly those values; `--print-config` prints them without loading weights."""

from __future__ import annotations

import dataclasses
import json

import pytest

from infinitehip.attention.capabilities import kv_scratch_tokens, kv_token_limit
from infinitehip.cli.main import main
from infinitehip.config.engine import EngineConfig
from infinitehip.config.methods import METHODS
from infinitehip.config.model import ModelConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.engine.resolve import resolve_config, resolve_for_model
from tests.attention.test_method_matrix import PER_TOKEN
from tests.conftest import engine_for_dir


@pytest.mark.parametrize("max_context", [None, 1000])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_resolved_values_are_the_built_engines(tiny_llama_dir, tokenizer, method, max_context):
    """Before building: the context, the method's slot limits and the pages the engine then has, for every method
    (with its context default and with one set)."""
    config = EngineConfig(method=method, method_config=PER_TOKEN[method], device="cpu", dtype="float32",
                          show_progress=False, max_context_tokens=max_context)
    resolved = resolve_config(config, ModelConfig.from_dir(tiny_llama_dir), tokenizer, "test")
    engine = engine_for_dir(tiny_llama_dir, tokenizer, PER_TOKEN[method], method=method, max_context_tokens=max_context)
    assert engine.resolved == resolved
    method_obj = engine.method
    assert resolved.max_context_tokens == engine.max_context_tokens == (
        max_context or method_obj.own_kv_sizing().default_max_context_tokens)
    assert (resolved.kv_token_limit, resolved.kv_scratch_tokens) == (kv_token_limit(method_obj),
                                                                     kv_scratch_tokens(method_obj))
    assert engine.scheduler.allocator.num_pages == resolved.num_pages
    assert resolved.kv_cache_tokens == resolved.num_pages * resolved.page_size >= (
        min(resolved.max_context_tokens, resolved.kv_token_limit or resolved.max_context_tokens))
    assert resolved.max_context_from == ("config" if max_context else "method default")


def test_infinipot_sizes_come_from_its_catalyst_in_the_tokenizer(tiny_llama_dir, tokenizer):
    config = PER_TOKEN["infinipot"]
    engine_config = EngineConfig(method="infinipot", method_config=config, device="cpu")
    resolved = resolve_config(engine_config, ModelConfig.from_dir(tiny_llama_dir), tokenizer)
    catalyst = len(tokenizer(config.catalyst_text, add_special_tokens=False)["input_ids"])
    assert resolved.kv_scratch_tokens == catalyst + config.question_tokens
    assert resolved.kv_token_limit == config.pot_tokens - resolved.kv_scratch_tokens
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        resolve_config(engine_config, ModelConfig.from_dir(tiny_llama_dir), None)


def test_record_is_immutable_and_plain_data(tiny_llama_dir, tokenizer):
    config = EngineConfig(method="infinitehip", device="cpu", kv_cache_tokens=1000,
                          offload=OffloadConfig(offload_enabled=True, mask_bank_tokens=4096, kv_dtype="fp8_e4m3"))
    resolved = resolve_config(config, ModelConfig.from_dir(tiny_llama_dir), tokenizer)
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.num_pages = 1
    data = json.loads(resolved.describe())
    assert data["kv_cache_tokens"] == 1024 and data["num_pages"] == 16  # whole pages of 64
    assert (data["mask_bank_tokens"], data["kv_dtype"], data["offload_impl"]) == (4096, "float8_e4m3fn", "cpu")
    assert data == resolved.as_dict() and data["method_config"]["chunk_sizes"] == list(config.method_config.chunk_sizes)


@pytest.mark.parametrize("command", [["generate"], ["serve"], ["eval", "passkey", "--lengths", "3000"]])
def test_print_config_prints_the_resolved_settings_and_exits(capsys, command):
    """The embedded model's settings as the command would run them (eval sets the context its lengths need)."""
    flags = ["--method", "tokenselect", "--select-tokens", "512", "--page-size", "32", "--device", "cpu"]
    assert main([*command, *flags, "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    config = EngineConfig(method="tokenselect", page_size=32, device="cpu",
                          method_config=dataclasses.replace(METHODS["tokenselect"].config(), select_tokens=512))
    if command[0] == "eval":
        assert printed["max_context_from"] == "config" and printed["max_context_tokens"] > 3000
        config = dataclasses.replace(config, max_context_tokens=printed["max_context_tokens"])
    assert printed == resolve_for_model(config).as_dict()
    assert printed["page_size"] == 32 and printed["method_config"]["select_tokens"] == 512

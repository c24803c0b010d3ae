"""One preset API: `LLM(method=..., preset=..., **fields)` routes each field by name to EngineConfig, the chosen
method's config or OffloadConfig (engine/settings.py); the config-object form keeps working; unknown names,
another method's fields and ambiguous names are errors. The CLI builds its configs through the same function."""

from __future__ import annotations

import pytest

from infinitehip.attention.infinitehip.config import PRESETS, InfiniteHiPConfig
from infinitehip.attention.tokenselect.config import TokenSelectConfig
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.engine import settings as settings_module
from infinitehip.engine.settings import resolve_settings


def test_fields_are_routed_by_name_over_the_preset():
    s = resolve_settings(method="infinitehip", preset="3k-fast", max_context_tokens=1 << 20, stream_tokens=2048,
                         offload_enabled=True, kv_dtype="fp8_e4m3", device="cpu")
    assert (s.engine.method, s.engine.max_context_tokens, s.engine.device) == ("infinitehip", 1 << 20, "cpu")
    assert s.method == InfiniteHiPConfig(**{**PRESETS["3k-fast"].__dict__, "stream_tokens": 2048})
    assert s.offload == OffloadConfig(offload_enabled=True, kv_dtype="fp8_e4m3")


def test_nothing_given_leaves_the_method_default_and_no_offload():
    s = resolve_settings()
    assert (s.engine, s.method, s.offload) == (EngineConfig(), None, None)
    assert resolve_settings(method="infinitehip").method is None  # the engine builds the default preset


def test_config_objects_are_bases_that_fields_replace():
    base = EngineConfig(method="tokenselect", page_size=32)
    s = resolve_settings(base, TokenSelectConfig(select_tokens=512), OffloadConfig(mask_bank_tokens=4096),
                         sink_tokens=16, attention_bank_tokens=8192, max_num_seqs=2)
    assert (s.engine.page_size, s.engine.max_num_seqs, s.engine.method) == (32, 2, "tokenselect")
    assert (s.method.select_tokens, s.method.sink_tokens) == (512, 16)
    assert (s.offload.mask_bank_tokens, s.offload.attention_bank_tokens) == (4096, 8192)
    # a mapping of method fields sits over the preset, under the fields
    s = resolve_settings(method="infinitehip", preset="3k", method_config={"stream_tokens": 512, "impl": "reference"},
                         impl="triton")
    assert (s.method.chunk_sizes, s.method.stream_tokens, s.method.impl) == ((256, 32, 8), 512, "triton")


@pytest.mark.parametrize("kwargs, message", [
    (dict(method="dense", stream_tokens=512), r"stream_tokens: not a setting of method 'dense' \(a setting of "
                                              r"infinitehip\); it has no such settings"),
    (dict(method="tokenselect", keep_tokens=(8,)), r"keep_tokens: not a setting of method 'tokenselect'.*its settings: "),
    (dict(method="infinitehip", strem_tokens=512), r"unknown setting 'strem_tokens'; did you mean stream_tokens"),
    (dict(method="dense", preset="3k"), "no such settings"),
    (dict(method="infinitehip", preset="huge"), "unknown infinitehip preset 'huge'"),
    (dict(method="infinitehip", preset="3k", method_config=InfiniteHiPConfig()), "either a preset or a method_config"),
    (dict(method="tokenselect", method_config=InfiniteHiPConfig()), "takes TokenSelectConfig, got InfiniteHiPConfig"),
    (dict(method="dense", method_config={"head_aggregation": "max"}), "method_config: head_aggregation: not a setting"),
    (dict(method="infinitehip", chunk_sizes=(256, 30, 8)), "power of two"),  # the config still validates
    (dict(method="nope"), "unknown attention method 'nope'"),
])
def test_bad_settings_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        resolve_settings(**kwargs)


def test_a_name_two_configs_share_is_refused_as_ambiguous(monkeypatch):
    real = settings_module.field_names
    monkeypatch.setattr(settings_module, "field_names",
                        lambda cls: real(cls) | ({"page_size"} if cls is OffloadConfig else set()))
    with pytest.raises(ValueError, match="'page_size' is a field of both EngineConfig and OffloadConfig"):
        resolve_settings(page_size=32)


def test_llm_takes_method_preset_and_fields(monkeypatch):
    from infinitehip.engine import llm as llm_module

    seen = []

    class FakeEngine:
        tokenizer = None

        def __init__(self, config, method_config=None, offload_config=None):
            seen.append((config, method_config, offload_config))

    monkeypatch.setattr(llm_module, "LLMEngine", FakeEngine)
    llm = llm_module.LLM(method="infinitehip", preset="3k-fast", max_context_tokens=1 << 20, stream_tokens=2048,
                         offload_enabled=True)
    config, method, offload = seen[-1]
    assert llm.config is config and (config.method, config.max_context_tokens) == ("infinitehip", 1 << 20)
    assert (method.refresh_intervals, method.stream_tokens, offload.offload_enabled) == ((32, 16, 8), 2048, True)
    # the config-object form, with model/method and engine fields replacing its fields
    llm_module.LLM("m.gguf", config=EngineConfig(method="tokenselect", page_size=32), method_config=TokenSelectConfig(),
                   offload_config=OffloadConfig(), page_size=16)
    config, method, offload = seen[-1]
    assert (config.model, config.method, config.page_size) == ("m.gguf", "tokenselect", 16)
    assert method == TokenSelectConfig() and offload == OffloadConfig()
    with pytest.raises(ValueError, match="unknown setting 'temperature'"):  # sampling is per request
        llm_module.LLM(temperature=0)

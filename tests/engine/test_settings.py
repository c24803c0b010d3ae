"""One preset API: `LLM(method=..., preset=..., **fields)` routes each field by name to EngineConfig, the chosen
method's config (EngineConfig.method_config) or OffloadConfig (EngineConfig.offload) and gives one EngineConfig
(engine/settings.py); the config-object form keeps working; unknown names, another method's fields and ambiguous
names are errors. The CLI builds its config through the same function."""

from __future__ import annotations

import pytest

from infinitehip.attention.methods.auto.presets import PRESETS as AUTO_PRESETS
from infinitehip.attention.methods.infinitehip.config import PRESETS, InfiniteHiPConfig
from infinitehip.attention.methods.tokenselect.config import TokenSelectConfig
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.engine import settings as settings_module
from infinitehip.engine.settings import resolve_settings


def test_fields_are_routed_by_name_over_the_preset():
    c = resolve_settings(method="infinitehip", preset="3k-fast", max_context_tokens=1 << 20, stream_tokens=2048,
                         offload_enabled=True, kv_dtype="fp8_e4m3", device="cpu")
    assert (c.method, c.max_context_tokens, c.device) == ("infinitehip", 1 << 20, "cpu")
    assert c.method_config == InfiniteHiPConfig(**{**PRESETS["3k-fast"].__dict__, "stream_tokens": 2048})
    assert c.offload == OffloadConfig(offload_enabled=True, kv_dtype="fp8_e4m3")


def test_nothing_given_gives_the_method_default_preset_and_no_offload():
    c = resolve_settings()
    assert c == EngineConfig() and (c.method_config, c.offload) == (AUTO_PRESETS["default"], OffloadConfig())
    assert resolve_settings(method="dense").method_config is None
    assert resolve_settings(method="infinitehip").method_config == PRESETS["default"]
    assert EngineConfig(method="infinitehip").method_config == PRESETS["default"]


def test_engine_config_nests_the_method_config_typed_by_the_method():
    c = EngineConfig(method="tokenselect", method_config=TokenSelectConfig(select_tokens=512),
                     offload=OffloadConfig(offload_enabled=True))
    assert (c.method_config.select_tokens, c.offload.offload_enabled) == (512, True)
    with pytest.raises(ValueError, match="method_config: method 'tokenselect' takes a TokenSelectConfig, got "
                                         "InfiniteHiPConfig"):
        EngineConfig(method="tokenselect", method_config=InfiniteHiPConfig())
    with pytest.raises(ValueError, match="method 'dense' takes no method_config"):
        EngineConfig(method="dense", method_config=InfiniteHiPConfig())
    with pytest.raises(ValueError, match="offload must be an OffloadConfig"):
        EngineConfig(offload={"offload_enabled": True})
    with pytest.raises(ValueError, match="unknown attention method 'nope'"):
        EngineConfig(method="nope")


def test_config_objects_are_bases_that_fields_replace():
    base = EngineConfig(method="tokenselect", page_size=32)
    c = resolve_settings(base, method_config=TokenSelectConfig(select_tokens=512),
                         offload=OffloadConfig(mask_bank_tokens=4096), sink_tokens=16, attention_bank_tokens=8192,
                         max_num_seqs=2)
    assert (c.page_size, c.max_num_seqs, c.method) == (32, 2, "tokenselect")
    assert (c.method_config.select_tokens, c.method_config.sink_tokens) == (512, 16)
    assert (c.offload.mask_bank_tokens, c.offload.attention_bank_tokens) == (4096, 8192)
    # the base's nested configs are kept while the method stays; another method starts from its default preset
    base = EngineConfig(method="infinitehip", method_config=PRESETS["3k"], offload=OffloadConfig(offload_enabled=True))
    assert resolve_settings(base, stream_tokens=512).method_config == InfiniteHiPConfig(
        **{**PRESETS["3k"].__dict__, "stream_tokens": 512})
    assert resolve_settings(base, preset="5k").method_config == PRESETS["5k"]
    assert resolve_settings(base, method="tokenselect").method_config == TokenSelectConfig()
    assert resolve_settings(base, method="dense").offload.offload_enabled
    # a mapping of method fields sits over the preset, under the fields
    c = resolve_settings(method="infinitehip", preset="3k", method_config={"stream_tokens": 512, "impl": "reference"},
                         impl="triton")
    assert (c.method_config.chunk_sizes, c.method_config.stream_tokens, c.method_config.impl) == ((256, 32, 8), 512,
                                                                                                  "triton")


@pytest.mark.parametrize("kwargs, message", [
    (dict(method="dense", stream_tokens=512), r"stream_tokens: not a setting of method 'dense' \(a setting of "
                                              r"auto, infinitehip\); it has no such settings"),
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

        def __init__(self, config):
            seen.append(config)

    monkeypatch.setattr(llm_module, "LLMEngine", FakeEngine)
    llm = llm_module.LLM(method="infinitehip", preset="3k-fast", max_context_tokens=1 << 20, stream_tokens=2048,
                         offload_enabled=True)
    config = seen[-1]
    method, offload = config.method_config, config.offload
    assert llm.config is config and (config.method, config.max_context_tokens) == ("infinitehip", 1 << 20)
    assert (method.refresh_intervals, method.stream_tokens, offload.offload_enabled) == ((32, 16, 8), 2048, True)
    # the config-object form, with model/method and engine fields replacing its fields
    llm_module.LLM("m.gguf", config=EngineConfig(method="tokenselect", page_size=32),
                   method_config=TokenSelectConfig(select_tokens=64), offload=OffloadConfig(), page_size=16)
    config = seen[-1]
    assert (config.model, config.method, config.page_size) == ("m.gguf", "tokenselect", 16)
    assert config.method_config == TokenSelectConfig(select_tokens=64) and config.offload == OffloadConfig()
    with pytest.raises(ValueError, match="unknown setting 'temperature'"):  # sampling is per request
        llm_module.LLM(temperature=0)

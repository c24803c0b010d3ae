"""`--config FILE` (YAML or JSON, keys named as the flags) and `--method-config JSON` on every command: a file
reproduces the command line, the command line overrides the file, unknown keys and bad values are errors that
name the key and the file."""

from __future__ import annotations

import json

import pytest

from infinitehip.cli.config_file import parse_args
from infinitehip.cli.main import build_parser, main
from infinitehip.cli.method_options import method_config_from_args
from infinitehip.cli.options import dataclass_from_args
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.config.sampling import SamplingParams

FLAGS = ["--prompt", "hello", "--chat", "--method", "infinitehip", "--preset", "3k-fast", "--max-context-tokens", "1M",
         "--device", "cpu", "--temperature", "0", "--stop", "\n\n", "END", "--offload-enabled", "--kv-dtype", "fp8_e4m3",
         "--head-aggregation", "softmax", "--chunk-sizes", "256", "32", "8", "--show-progress", "false"]
YAML = """
prompt: hello
chat: true
method: infinitehip
preset: 3k-fast
max-context-tokens: 1M      # flag spelling and sizes as on the command line
device: cpu
temperature: 0
stop: ["\\n\\n", END]
offload_enabled: true
kv_dtype: fp8_e4m3
head_aggregation: softmax
chunk_sizes: [256, 32, 8]
show_progress: false
"""


def _configs(args):
    engine = dataclass_from_args(EngineConfig, args)
    return (engine, dataclass_from_args(SamplingParams, args), dataclass_from_args(OffloadConfig, args),
            method_config_from_args(engine, args), args.prompt, args.chat)


def _parse(argv):
    return parse_args(build_parser(), argv)


def test_a_yaml_or_json_file_reproduces_the_command_line(tmp_path):
    from_flags = _configs(_parse(["generate", *FLAGS]))
    assert from_flags[0].max_context_tokens == 1 << 20 and from_flags[3].refresh_intervals == (32, 16, 8)
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text(YAML)
    assert _configs(_parse(["generate", "--config", str(yaml_file)])) == from_flags
    import yaml

    json_file = tmp_path / "run.json"
    json_file.write_text(json.dumps(yaml.safe_load(YAML)))
    assert _configs(_parse(["generate", "--config", str(json_file)])) == from_flags


def test_the_command_line_overrides_the_file(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("method: infinitehip\npreset: 3k\nstream_tokens: 512\ntemperature: 0.5\nmax_context_tokens: 64K\n")
    args = _parse(["generate", "--config", str(f), "--prompt", "x", "--preset", "5k", "--temperature", "0.7"])
    engine, sampling, _, method, _, _ = _configs(args)
    assert (sampling.temperature, engine.max_context_tokens) == (0.7, 65536)
    assert (method.chunk_sizes, method.stream_tokens) == ((64, 32, 16), 512)  # 5k, with the file's field


@pytest.mark.parametrize("text, message", [
    ("max_tokns: 3\n", "unknown key 'max_tokns'.*did you mean max_tokens"),
    ("max_context_tokens: lots\n", "max_context_tokens: expected an integer"),
    ("method: densest\n", "method: 'densest' is not one of auto, dense, "),
    ("page_size: null\n", "page_size: null is not a value"),
    ("- a list\n", "expected a mapping"),
    ("config: other.yaml\n", "unknown key 'config'"),
    ("prompt: [unclosed\n", "not valid YAML"),
])
def test_bad_files_are_errors_naming_the_file_and_the_key(tmp_path, capsys, text, message):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=f"{f}: {message}"):
        _parse(["generate", "--config", str(f)])
    assert main(["generate", "--config", str(f)]) == 2
    assert str(f) in capsys.readouterr().err
    assert main(["generate", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "no such config file" in capsys.readouterr().err


def test_null_sets_an_optional_setting_to_none(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("prompt: x\nmax_context_tokens: null\ntop_k: null\n")
    engine, sampling, *_ = _configs(_parse(["generate", "--config", str(f)]))
    assert engine.max_context_tokens is None and sampling.top_k is None


def test_every_command_takes_a_config_file(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("model: m.gguf\nport: 9001\nmethod: tokenselect\nvote_logits: raw\n")
    args = _parse(["serve", "--config", str(f)])
    assert (args.model, args.port, method_config_from_args(EngineConfig(method=args.method), args).vote_logits) == (
        "m.gguf", 9001, "raw")
    f.write_text("lengths: [4K, 8K]\ndepths: [0.5]\n")
    for command in (["eval", "passkey"], ["eval", "niah"], ["eval", "ruler"], ["eval", "compare"]):
        args = _parse([*command, "--config", str(f)])
        assert (args.lengths, args.depths) == ([4096, 8192], [0.5])
    f.write_text("title: My results\n")
    assert _parse(["eval", "ruler-report", "a.json", "--config", str(f)]).title == "My results"


def test_method_config_json_sets_study_knobs_under_field_flags(capsys):
    args = _parse(["generate", "--prompt", "x", "--method", "infinitehip", "--preset", "3k",
                   "--method-config", '{"head_aggregation": "zscore", "stream-tokens": 512, "chunk_sizes": [256, 32, 8]}',
                   "--stream-tokens", "2048"])
    config = method_config_from_args(EngineConfig(method="infinitehip"), args)
    assert (config.head_aggregation, config.stream_tokens, config.chunk_sizes) == ("zscore", 2048, (256, 32, 8))
    args = _parse(["generate", "--prompt", "x", "--method", "dense", "--method-config", '{"head_aggregation": "max"}'])
    with pytest.raises(ValueError, match="head_aggregation: not a setting of method 'dense'"):
        method_config_from_args(EngineConfig(method="dense"), args)
    for bad in ("{not json", "[1, 2]"):
        with pytest.raises(SystemExit):
            _parse(["generate", "--prompt", "x", "--method-config", bad])
        assert "--method-config" in capsys.readouterr().err


def test_generate_runs_from_a_config_file(tmp_path, capsys):
    f = tmp_path / "run.yaml"
    f.write_text("prompt: The capital of France is\nmax_tokens: 2\ntemperature: 0\ndevice: cpu\nshow_progress: false\n")
    assert main(["generate", "--config", str(f)]) == 0  # the same configs as the flags (tested above), one load here
    assert "Paris" in capsys.readouterr().out
    assert main(["generate", "--max-tokens", "2"]) == 2
    assert "give one of --prompt and --prompt-file" in capsys.readouterr().err

"""The CLI's help: `--help` lists the flags a user needs, each with a help text; `--help-all` lists every setting
(hidden flags, each method's fields with its own defaults, study knobs apart); choice-like fields show their values."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from infinitehip.config.methods import METHODS
from infinitehip.cli.field_docs import field_docs
from infinitehip.cli.main import build_parser, main
from infinitehip.cli.parser import CommandParser
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.config.sampling import SamplingParams
from infinitehip.config.server import ServerConfig
from infinitehip.eval.compare import CompareConfig
from infinitehip.eval.ruler.runner import RulerConfig

CONFIGS = [EngineConfig, SamplingParams, OffloadConfig, ServerConfig, CompareConfig, RulerConfig] + [
    s.config_cls for s in METHODS.values() if s.config_cls is not None]


def _commands(parser: argparse.ArgumentParser, path: str = "infinitehip"):
    """(path, parser) of every command that runs something (the leaves of the subcommand tree)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _commands(sub, f"{path} {name}")


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_every_flag_has_a_help_text_and_is_listed_by_help_all():
    commands = list(_commands(build_parser()))
    assert {p for p, _ in commands} >= {"infinitehip generate", "infinitehip serve", "infinitehip eval passkey",
                                       "infinitehip eval compare", "infinitehip eval ruler"}
    for path, parser in commands:
        assert isinstance(parser, CommandParser)
        full = parser.format_full_help()  # a help text that breaks argparse's %-formatting fails here
        for action in parser._actions:
            if not action.option_strings:
                continue
            flag = action.option_strings[-1]
            assert f"{flag} " in full or f"{flag}\n" in full, f"{path} {flag} missing from --help-all"
            text = parser.hidden_help.get(action, action.help) or ""
            if text != argparse.SUPPRESS:  # method fields: their comments, checked below
                assert text.strip() and not text.startswith("(default"), f"{path} {flag} has no help text"
    for cls in CONFIGS:
        bare = {f.name for f in dataclasses.fields(cls)} - set(field_docs(cls))
        assert not bare, f"{cls.__name__} fields without a comment: {bare}"


def test_help_is_short_and_help_all_lists_study_knobs_per_method(capsys):
    short = _help(["generate", "--help"], capsys)
    full = _help(["generate", "--help-all"], capsys)
    flags = {w.split("=")[0] for w in short.split() if w.startswith("--")}
    assert len(flags) <= 22, sorted(flags)
    for needed in ("--prompt", "--chat", "--model", "--method", "--preset", "--max-context-tokens", "--max-tokens",
                   "--temperature", "--offload-enabled", "--device"):
        assert needed in flags
    for knob in ("--head-aggregation", "--representative", "--impl", "--novelty-fraction", "--landmark-window",
                 "--vote-logits", "--page-size", "--mask-bank-tokens"):
        assert knob not in short and knob in full
    # choice-like fields show their values
    assert "dense,infinitehip,infinipot,tokenselect,streaming,truncate,cascade,hip}" in short
    assert "--kv-dtype {auto,bfloat16,float16,float32,fp8_e4m3,fp8_e5m2}" in full
    assert "--impl {auto,reference,triton}" in full
    # each method's section has its own defaults; study knobs under their own heading
    ih = full.index("--method infinitehip (InfiniteHiPConfig):")
    ih_study = full.index("--method infinitehip (InfiniteHiPConfig): study knobs:")
    ts = full.index("--method tokenselect (TokenSelectConfig):")
    # auto's section (InfiniteHiPConfig too) comes first: look inside infinitehip's own
    assert ih < full.index("first tokens, always attended (default: 256)", ih) < ih_study
    assert ih_study < full.index("--head-aggregation {max,softmax,zscore}", ih_study) < ts
    assert ts < full.index("first tokens, always attended (default: 128)")
    for command in (["serve"], ["eval", "passkey"], ["eval", "ruler"], ["eval", "compare"]):
        assert "--head-aggregation" not in _help([*command, "--help"], capsys)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_cli_declarations_name_real_fields_and_allowed_values_are_accepted(cls):
    names = {f.name for f in dataclasses.fields(cls)}
    shown, study = set(getattr(cls, "HELP_FIELDS", ())), set(getattr(cls, "STUDY_FIELDS", ()))
    assert shown <= names and study <= names and not shown & study
    for name, values in getattr(cls, "CHOICES", {}).items():
        assert name in names
        tuple_field = isinstance(getattr(cls(), name), tuple)
        for value in values:
            cls(**{name: (value,) if tuple_field else value})  # every listed value is valid
        with pytest.raises(ValueError):
            cls(**{name: ("bogus",) if tuple_field else "bogus"})


def test_bool_flags_alone_mean_true_and_choices_are_checked(capsys):
    args = build_parser().parse_args(["generate", "--prompt", "x", "--offload-enabled", "--show-progress", "false"])
    assert args.offload_enabled is True and args.show_progress is False
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--prompt", "x", "--method", "densest"])
    assert "invalid choice: 'densest'" in capsys.readouterr().err


def test_field_docs_read_trailing_and_preceding_comments():
    from dataclasses import dataclass

    @dataclass
    class Example:
        # explained above,
        # over two lines
        a: int = 1
        b: str = "x"  # explained on its line
        c: float = 0.5

        def method(self) -> None:
            d: int = 2  # not a field  # noqa: F841

    assert field_docs(Example) == {"a": "explained above, over two lines", "b": "explained on its line"}

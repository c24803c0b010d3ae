"""The results store and its page (bench/report/): every manifest row reads existing JSON with the fields its table
needs and agrees with the date and device the files record; docs/results.md is the manifest's rendering; a missing
or malformed file is a clear error naming it; `add` files a run under its canonical name and its row renders."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from bench.report.add import add
from bench.report.check import check_records, check_store
from bench.report.manifest import load_manifest
from bench.report.page import PAGE, render, table_markdown
from bench.report.store import STORE, ResultsError, canonical_name, length_tag

RULER_RUN = "ruler/h100/gemma3-270m/sotu.niah_single_word.infinitehip-wide-final.64k.s0-2.json"
TABLE = """[[table]]
id = "t"
kind = "accuracy"
title = "T"
text = "what it measures"
lengths = [65536]
task = "niah_single_word"
"""


@pytest.fixture(scope="module")
def manifest():
    return load_manifest()


def test_every_row_reads_existing_files_with_its_fields(manifest):
    assert manifest.rows and all((manifest.store / f).is_file() for row in manifest.rows for f in row.files)
    for table in manifest.tables:
        assert manifest.rows_of(table), table.id  # a table without rows would vanish from the page
        assert f"## {table.title}" in table_markdown(manifest, table, figures=None)
    check_records(manifest)  # each row's date range and device hold what its files record
    check_store(manifest)  # no file in the store that no row reads


def test_page_is_the_manifests_rendering(manifest):
    page = render(manifest)
    assert PAGE.read_text() == page, "docs/results.md is stale: run `python -m bench.report`"
    for row in manifest.rows:
        assert f"`{row.command}` | {row.device.replace('|', chr(92) + '|')} | {row.date} |" in page, row.label


def test_documented_ruler_commands_parse(manifest):
    from infinitehip.cli.config_file import parse_args
    from infinitehip.cli.main import build_parser

    commands = [shlex.split(r.command) for r in manifest.rows if r.command.startswith("infinitehip ")]
    assert commands
    for argv in commands:
        parse_args(build_parser(), argv[1:])


def _store(tmp_path: Path, rows: str) -> Path:
    (tmp_path / "manifest.toml").write_text(TABLE + rows)
    return tmp_path / "manifest.toml"


def _pivot_store(tmp_path: Path, kind: str, table_id: str, runs: dict[str, dict], rows: list[tuple[str, str]]) -> Path:
    """A store of `runs` (file name -> ruler JSON), rows (label, file) of table "t" and a `kind` table showing them."""
    for name, run in runs.items():
        (tmp_path / name).write_text(json.dumps(run))
    pivot = (f'[[table]]\nid = "{table_id}"\nkind = "{kind}"\nrows_from = "t"\ntitle = "P"\ntext = "pivot"\n'
             'lengths = [65536]\ntask = "niah_single_word"\n')
    return _store(tmp_path, pivot + "".join(
        f'[[row]]\ntable = "t"\nlabel = "{label}"\nfiles = ["{name}"]\ncommand = "c"\n'
        f'device = "NVIDIA H100 80GB HBM3"\ndate = "2026-11-27"\n' for label, name in rows))


def test_missing_file_is_an_error_naming_it(tmp_path):
    path = _store(tmp_path, '[[row]]\ntable = "t"\nlabel = "gone"\nfiles = ["ruler/x.json"]\ncommand = "c"\n'
                            'device = "d"\ndate = "2026-11-27"\n')
    with pytest.raises(ResultsError, match=r"row 'gone' of table 't': result file .*ruler/x\.json does not exist"):
        render(load_manifest(path))


def test_file_without_the_fields_a_cell_needs_is_an_error(tmp_path):
    data = json.loads((STORE / RULER_RUN).read_text())
    for s in data["samples"]:
        del s["correct"]
    (tmp_path / "run.json").write_text(json.dumps(data))
    path = _store(tmp_path, '[[row]]\ntable = "t"\nlabel = "r"\nfiles = ["run.json"]\ncommand = "c"\n'
                            'device = "NVIDIA H100 80GB HBM3"\ndate = "2026-11-27"\n')
    with pytest.raises(ResultsError, match=r"run\.json: a sample lacks correct"):
        render(load_manifest(path))


def test_bad_manifest_entries_are_errors(tmp_path):
    with pytest.raises(ResultsError, match="unknown field"):
        load_manifest(_store(tmp_path, '[[row]]\ntable = "t"\nlabel = "r"\nfiles = ["a.json"]\ncommand = "c"\n'
                                       'device = "d"\ndate = "2026-11-27"\ncolour = "red"\n'))
    with pytest.raises(ResultsError, match="table 'nope' is not defined"):
        load_manifest(_store(tmp_path, '[[row]]\ntable = "nope"\nlabel = "r"\nfiles = ["a.json"]\ncommand = "c"\n'
                                       'device = "d"\ndate = "2026-11-27"\n'))
    with pytest.raises(ResultsError, match="not valid TOML"):
        load_manifest(_store(tmp_path, "[[row]\n"))


def test_a_date_outside_the_row_is_caught(tmp_path):
    shutil.copyfile(STORE / RULER_RUN, tmp_path / "run.json")
    path = _store(tmp_path, '[[row]]\ntable = "t"\nlabel = "r"\nfiles = ["run.json"]\ncommand = "c"\n'
                            'device = "NVIDIA H100 80GB HBM3"\ndate = "2026-11-20"\n')
    with pytest.raises(ResultsError, match="records date 2026-11-27, outside the row's 2026-11-20"):
        check_records(load_manifest(path))


@pytest.mark.parametrize("with_meta", [True, False], ids=["bench-ruler", "eval-ruler"])
def test_add_files_a_run_under_its_canonical_name(tmp_path, with_meta):
    data = json.loads((STORE / RULER_RUN).read_text())
    if with_meta:  # the genres' folder as the device named it: the page shows the documented one
        data["meta"]["argv"] += ["--haystack-dir", "/root/p/tree/.corpora"]
    else:  # `infinitehip eval ruler --output` writes no meta block: the command is rebuilt
        del data["meta"]
    run = tmp_path / "incoming" / "out.json"
    run.parent.mkdir()
    run.write_text(json.dumps(data))
    path = _store(tmp_path, "")
    target = add(run, "t", "infinitehip", setting="wide-final", note="a new genre", manifest_path=path)
    assert target == tmp_path / RULER_RUN and target.read_text() == run.read_text()
    manifest = load_manifest(path)
    (row,) = manifest.rows
    assert row.files == (RULER_RUN,) and row.date == "2026-11-27" and row.device == "NVIDIA H100 80GB HBM3, bfloat16"
    argv = shlex.split(row.command)
    assert argv[:3] == ["infinitehip", "eval", "ruler"] and argv[argv.index("--model") + 1] == "gemma3-270m"
    assert "--output" not in argv and argv[argv.index("--lengths") + 1] == "65536"
    assert "/root" not in row.command and (not with_meta or argv[argv.index("--haystack-dir") + 1] == ".corpora")
    right = sum(s["correct"] for s in data["samples"])
    assert f"| infinitehip | {right}/{len(data['samples'])} |" in render(manifest)
    check_records(manifest)
    with pytest.raises(ResultsError, match="exists and differs"):  # a second run never overwrites the first
        data["samples"][0]["correct"] = not data["samples"][0]["correct"]
        run.write_text(json.dumps(data))
        add(run, "t", "again", setting="wide-final", manifest_path=path)


def test_names_say_what_a_run_measures():
    assert len({length_tag(n) for n in (32000, 32768, 65536, 1048576)}) == 4
    data = json.loads((STORE / RULER_RUN).read_text())
    data["ruler_config"]["vary_haystack"] = False
    assert canonical_name(data, "q512") == RULER_RUN.replace("sotu.", "sotu-fixed.").replace("-wide-final", "-q512")


@pytest.mark.parametrize("run, expected", [
    ("accuracy/h100/smollm2-135m/passkey.tokenselect-default.64k-128k-256k-512k-1m.s1.json",
     "python -m bench accuracy --model smol.gguf --method tokenselect --lengths 65536 131072 262144 524288 1048576 "
     "--seed 1 --method-config '{\"question_select_tokens\": 512}'"),
    ("offload-decode/h100/llama3-8b-random/infinitehip-default.offloaded-fp8.1m.json",
     "python -m bench offload-decode --kv-dtype fp8_e4m3 --fast-prefill --graph-times --contexts 1048576 --preset "
     "default --dense-layerwise"),
])
def test_add_names_and_commands_bench_suites(tmp_path, run, expected):
    incoming = tmp_path / "in.json"
    shutil.copyfile(STORE / run, incoming)
    path = _store(tmp_path, "")
    target = add(incoming, "t", "r", manifest_path=path)
    (row,) = load_manifest(path).rows
    assert row.command == expected and "/root" not in row.command
    assert target.parent.relative_to(tmp_path) == Path(run).parent  # suite / device / model


def test_add_per_haystack_splits_a_multi_genre_file(tmp_path):
    data = json.loads((STORE / RULER_RUN).read_text())
    other = json.loads((STORE / RULER_RUN.replace("sotu.", "essays.").replace(".64k.", ".128k.")).read_text())
    data["samples"] += other["samples"]  # one file, two genres, as `--haystacks sotu essays` writes
    data["ruler_config"]["haystacks"] = ["sotu", "essays"]
    data["ruler_config"]["lengths"] = [65536, 131072]
    run = tmp_path / "genres.json"
    run.write_text(json.dumps(data))
    path = _store(tmp_path, "").parent / "manifest.toml"
    path.write_text(TABLE.replace("lengths = [65536]", "lengths = [65536, 131072]"))
    target = add(run, "t", "ih", per_haystack=True, manifest_path=path)
    assert target.name == "essays+sotu.niah_single_word.infinitehip-default.64k-128k.s0-2.json"
    manifest = load_manifest(path)
    assert [(r.label, r.haystack) for r in manifest.rows] == [("ih, essays", "essays"), ("ih, sotu", "sotu")]
    page = render(manifest)
    for genre, n in (("essays", 131072), ("sotu", 65536)):
        rows = [s for s in data["samples"] if s["haystack"] == genre and s["length"] == n]
        cells = ["–", f"{sum(s['correct'] for s in rows)}/{len(rows)}"]
        assert f"| ih, {genre} | {' | '.join(cells if genre == 'essays' else cells[::-1])} |" in page


def test_command_line_checks_and_names_a_missing_run(tmp_path, capsys):
    from bench.report.__main__ import main

    assert main(["check"]) == 0
    before = (STORE / "manifest.toml").read_text()
    assert main(["add", str(tmp_path / "nope.json"), "--table", "sotu", "--label", "x", "--command", "c"]) == 1
    assert f"result file {tmp_path / 'nope.json'} does not exist" in capsys.readouterr().err
    assert (STORE / "manifest.toml").read_text() == before  # a failed add changes nothing


def test_genre_matrix_shows_each_defaults_largest_run_against_its_target(tmp_path):
    data = json.loads((STORE / RULER_RUN).read_text())  # sotu, 30 prompts at 64K
    samples = data["samples"]
    small = dict(data, samples=[dict(s, correct=True) for s in samples[:10]])
    oracle = dict(data, samples=[dict(s, correct=True) for s in samples])
    path = _pivot_store(tmp_path, "genre-matrix", "m", {"full.json": data, "small.json": small, "oracle.json": oracle},
                        [("infinitehip (default)", "small.json"), ("infinitehip (default)", "full.json"),
                         ("infinitehip (default), oracle", "oracle.json"), ("infinitehip `3k`", "oracle.json")])
    manifest = load_manifest(path)
    text = table_markdown(manifest, next(t for t in manifest.tables if t.id == "m"), None)
    correct = sum(bool(s["correct"]) for s in samples)
    lines = [line for line in text.splitlines() if line.startswith("| sotu")]
    assert len(lines) == 1 and f"| {correct}/30 |" in lines[0]  # the 30-prompt run, not the oracle's or the preset's
    assert ("below target at 64K" in lines[0]) == (correct < 27)
    path.write_text(path.read_text().replace('rows_from = "t"\n', ""))
    with pytest.raises(ResultsError, match="rows_from"):
        load_manifest(path)


def test_prompt_seconds_pools_each_defaults_prompts_once_and_leaves_oracle_rows_out(tmp_path):
    data = json.loads((STORE / RULER_RUN).read_text())  # sotu, 30 prompts at 64K
    seconds = [float(i + 1) for i in range(30)]
    timed = dict(data, samples=[dict(s, seconds=t, encode_seconds=0.25, first_token_seconds=t / 2)
                                for s, t in zip(data["samples"], seconds)])
    slow = dict(data, samples=[dict(s, seconds=1000.0) for s in data["samples"]])
    manifest = load_manifest(_pivot_store(
        tmp_path, "prompt-seconds", "p", {"timed.json": timed, "slow.json": slow},
        [("infinitehip (default)", "timed.json"), ("infinitehip (default)", "timed.json"),
         ("infinitehip (default), oracle", "slow.json"), ("infinitehip `3k`", "slow.json")]))
    text = table_markdown(manifest, next(t for t in manifest.tables if t.id == "p"), None)
    (line,) = [line for line in text.splitlines() if line.startswith("| infinitehip (default), 64K")]
    # the file filed twice counts once; the oracle's and the preset's prompts are not the default's
    # the engine's RequestMetrics parts, where recorded: tokenizing, then the prefill to the first token
    assert "| 30 | 65,536 | 15.50 | 27.10 | 30.00 | 0.25 | 7.75 |" in line and line.endswith("| 1 row of 't' |")
    no_seconds = dict(data, samples=[{k: v for k, v in s.items() if k != "seconds"} for s in data["samples"]])
    (tmp_path / "timed.json").write_text(json.dumps(no_seconds))
    with pytest.raises(ResultsError, match="lacks `seconds`"):
        table_markdown(manifest, next(t for t in manifest.tables if t.id == "p"), None)


def test_needle_misses_pools_each_needle_over_the_cells_the_matrix_shows(tmp_path):
    data = json.loads((STORE / RULER_RUN).read_text())  # sotu, 30 prompts at 64K, one per needle (seed)
    samples = [dict(s, correct=True) for s in data["samples"]]
    missed = dict(data, samples=[dict(s, correct=i != 1) for i, s in enumerate(samples)])  # loses needle 1 only
    dense = dict(data, samples=[dict(s, correct=i not in (1, 2)) for i, s in enumerate(samples)])
    stale = dict(data, samples=[dict(s, correct=False) for s in samples[:10]])  # a smaller, older run: not shown
    path = _pivot_store(tmp_path, "needle-misses", "n",
                        {"missed.json": missed, "dense.json": dense, "stale.json": stale, "oracle.json": missed},
                        [("tokenselect (default)", "missed.json"), ("tokenselect (default)", "stale.json"),
                         ("dense (calibration)", "dense.json"), ("infinitehip (default), oracle", "oracle.json")])
    manifest = load_manifest(path)
    text = table_markdown(manifest, next(t for t in manifest.tables if t.id == "n"), None)
    lines = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    needle = samples[1]
    # columns: dense, auto, infinitehip, tokenselect, infinipot; dense's own misses (needle 2) make no line
    assert lines[0].startswith(f"| {needle['expected'][0]} (seed {needle['seed']}, depth {needle['depth']:.0%}) "
                               "| 0/1 | – | – | 0/1 | – |") and "sotu 64K (tokenselect)" in lines[0]
    assert lines[1].startswith("| every other needle (29) | 28/29 | – | – | 29/29 | – |") and len(lines) == 2

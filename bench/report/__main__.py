"""python -m bench.report                 render docs/results.md and docs/figures/ from bench/results/manifest.toml
python -m bench.report check           the manifest, its files, the store and the page agree (no writes)
python -m bench.report add RUN.json --table ID --label TEXT [--setting NAME] [--note TEXT] [--per-haystack]
                                       file a run under its canonical name and append its manifest row"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.report.add import add
from bench.report.check import check
from bench.report.manifest import load_manifest
from bench.report.page import FIGURES, PAGE, render
from bench.report.store import ResultsError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action")
    sub.add_parser("render", help="write docs/results.md and its figures (the default)")
    sub.add_parser("check", help="validate without writing")
    p = sub.add_parser("add", help="file a run into the store and append its manifest row")
    p.add_argument("run", type=Path, help="the JSON a benchmark wrote (--output)")
    p.add_argument("--table", required=True, help="the id of the manifest table the row goes in")
    p.add_argument("--label", required=True, help="the row's label on the page")
    p.add_argument("--setting", default="default", help="the setting's name in the file name (default: default)")
    p.add_argument("--note", default="", help="the row's note")
    p.add_argument("--command", help="the command that reproduces it (default: read or rebuilt from a ruler file)")
    p.add_argument("--device-tag", help="the store's device folder (default: from the file, e.g. h100)")
    p.add_argument("--model", help="the store's model folder (default: from the file, e.g. gemma3-270m)")
    p.add_argument("--name", help="the path under bench/results/ (default: the canonical name of a ruler or "
                                  "passkey run; required for other suites)")
    p.add_argument("--per-haystack", action="store_true",
                   help="one row per haystack of a ruler file that holds several genres, labelled 'LABEL, GENRE'")
    args = parser.parse_args(argv)
    try:
        if args.action == "add":
            target = add(args.run, args.table, args.label, args.setting, args.note, args.command, args.device_tag,
                         args.model, args.name, args.per_haystack)
            print(f"stored {target}; appended its row: now run `python -m bench.report`")
        elif args.action == "check":
            check(load_manifest())
            print("manifest, store and page agree")
        else:
            PAGE.write_text(render(load_manifest(), FIGURES))
            print(f"wrote {PAGE} and its figures under {FIGURES}")
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

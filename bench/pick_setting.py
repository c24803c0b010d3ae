"""Pick the best of several `eval ruler` runs of one method (its variants) by accuracy, ties to the first listed,
and print the winner's extra arguments: a detached plan chooses a setting on selection seeds and then runs only
the winner on held-out seeds.

    python bench/pick_setting.py NAME=RESULT.json=ARGS ... > winner.args   (ARGS: the variant's flags, quoted)
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    best = None
    for spec in sys.argv[1:]:
        name, path, flags = spec.split("=", 2)
        try:
            samples = json.load(open(path))["samples"]
        except (OSError, ValueError, KeyError):
            samples = []
        hits = sum(bool(s["correct"]) for s in samples)
        print(f"{name}: {hits}/{len(samples)}", file=sys.stderr)
        if samples and (best is None or hits > best[0]):
            best = (hits, name, flags)
    if best is None:
        sys.exit("no variant produced samples")
    print(f"picked {best[1]}", file=sys.stderr)
    print(best[2])


if __name__ == "__main__":
    main()

"""Pick the best of several `eval ruler` runs of one method (its variants) by accuracy, ties to the first listed,
and print the winner's extra arguments: a detached plan chooses a setting on selection seeds and then runs only
the winner on held-out seeds and genres.

    python bench/pick_setting.py NAME=RESULT.json=ARGS ... > winner.args   (ARGS: the variant's flags, quoted)

The held-out protocol (docs/real-text.md, "Held-out genres"): a setting is never chosen on a held-out genre, so a
result file holding a sample of one (eval/ruler/haystacks.py: HELD_OUT) is refused, naming the file and the genre;
so is a file whose samples lack their haystack.
"""

from __future__ import annotations

import json
import sys

from infinitehip.eval.ruler.haystacks import HAYSTACKS, HELD_OUT


class HeldOutError(ValueError):
    """A result file given to choose a setting holds a held-out genre."""


def tuning_samples(path: str) -> list[dict]:
    """The samples of a result file, refused where any lies on a held-out genre (or on no known genre)."""
    try:
        samples = json.load(open(path))["samples"]
    except (OSError, ValueError, KeyError):
        return []
    for s in samples:
        name = s.get("haystack")
        if name not in HAYSTACKS:
            raise HeldOutError(f"{path}: a sample on haystack {name!r}, which is no known genre")
        if name in HELD_OUT or s.get("split") == "held-out":
            raise HeldOutError(f"{path}: holds samples of the held-out genre {name!r}; settings are chosen on the "
                               f"tuning genres only ({', '.join(h for h in HAYSTACKS if h not in HELD_OUT)})")
    return samples


def pick(specs: list[str]) -> tuple[str, str]:
    """-> (name, flags) of the best variant; specs: NAME=RESULT.json=ARGS."""
    best = None
    for spec in specs:
        name, path, flags = spec.split("=", 2)
        samples = tuning_samples(path)
        hits = sum(bool(s["correct"]) for s in samples)
        print(f"{name}: {hits}/{len(samples)}", file=sys.stderr)
        if samples and (best is None or hits > best[0]):
            best = (hits, name, flags)
    if best is None:
        raise SystemExit("no variant produced samples")
    return best[1], best[2]


def main() -> None:
    try:
        name, flags = pick(sys.argv[1:])
    except HeldOutError as exc:
        raise SystemExit(f"pick_setting: {exc}") from None
    print(f"picked {name}", file=sys.stderr)
    print(flags)


if __name__ == "__main__":
    main()

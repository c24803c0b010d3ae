"""Help texts for the flags derived from config dataclasses: each field's own comment in its class.

Config classes document every field where it is declared: a trailing `# ...` on the field's line, or the comment
lines right above it (for longer explanations). Reading them back with `tokenize` keeps one source for the code's
and the CLI's documentation, instead of a second copy in `metadata` that would drift from the comments.
"""

from __future__ import annotations

import inspect
import io
import re
import textwrap
import tokenize
from functools import cache

_FIELD = re.compile(r"^\s*([A-Za-z_]\w*)\s*:")  # `name: type ...` in a class body


@cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its comment, one line} for the dataclass `cls` (fields without a comment are absent)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (frozen app, interactive class): flags keep only their defaults
        return {}
    lines = source.splitlines()
    comments: dict[int, str] = {}  # line number (1-based) -> comment text
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    body_indent = None
    docs: dict[str, str] = {}
    above: list[str] = []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("#"):
            above.append(comments.get(number, ""))
            continue
        match = _FIELD.match(line)
        if match and stripped and (body_indent is None or indent == body_indent) and number > 1:
            body_indent = indent
            own = comments.get(number)
            text = own if own else " ".join(above)
            if text:
                docs[match.group(1)] = " ".join(text.split())
        if stripped.startswith("def ") and body_indent is not None and indent == body_indent:
            break  # methods follow the fields
        above = []
    return docs

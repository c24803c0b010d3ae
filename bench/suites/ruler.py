"""RULER-style retrieval over real prose: `infinitehip eval ruler` itself (its flags, its resumable result file),
with the meta block added to the file when the sweep ends (a sweep cut short keeps the product's own "runs" record:
date, device, versions and git commit of every invocation).

    python -m bench ruler --model gemma3-270m --haystacks essays --tasks niah_single_word --lengths 32000 131072 \
        --method infinitehip --prefill-chunk-size 32768 --output gemma_ih.json
    python -m bench ruler --method dense --lengths 4096 7000 ...          # calibration: what dense gets right

Every flag is `infinitehip eval ruler --help-all`'s; the report: `infinitehip eval ruler-report FILES`.
"""

from __future__ import annotations

import json
from pathlib import Path

from infinitehip.cli import eval_ruler
from infinitehip.eval.ruler.runner import RulerConfig


def add_arguments(p) -> None:
    eval_ruler.add_ruler_flags(p)  # `infinitehip eval ruler`'s own flags, RulerConfig's --output included
    p.set_defaults(output=RulerConfig.output)


def run(args, out) -> dict | None:
    code = eval_ruler.run(args)
    path = Path(args.output)
    if code or not path.exists():
        return {"ok": False} if code else None
    data = json.loads(path.read_text())
    out.path = path
    return data  # written back with the meta block

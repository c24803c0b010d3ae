"""`python -m bench SUITE [flags]`: run one benchmark suite and write its JSON (--output) with a meta block (git
commit, device, versions, arguments: common/meta.py).

    python -m bench                          # the suites
    python -m bench SUITE --help             # a suite's flags; --help-all: every method and offload setting too
    python -m bench SUITE --config run.yaml  # flags from a YAML file, as `infinitehip` commands read them

A suite is a module of bench/suites/ with add_arguments(parser) and run(args, out) -> dict: `out` is the result
file (common/meta.py: out.write(body) rewrites it, meta included; a suite may write after every row), the dict
returned is written last; {"ok": false} in it makes the exit status 1.
"""

from __future__ import annotations

import importlib
import os
import sys

# name -> (module under bench/suites/, one line for the listing)
SUITES = {
    "accuracy": ("accuracy", "passkey / NIAH accuracy over lengths x depths (result file rewritten per length)"),
    "ruler": ("ruler", "RULER-style tasks over real prose: `infinitehip eval ruler`, meta block added"),
    "attention-latency": ("attention_latency", "one attention layer: InfiniteHiP presets vs dense SDPA-flash"),
    "hip-attn": ("hip_attn", "one attention layer: ours vs the authors' hip-attn vs dense"),
    "method-latency": ("method_latency", "one attention layer: any registered method vs dense SDPA-flash"),
    "decode": ("decode", "whole-model decode tokens/s (random 8B-shaped weights) against the bandwidth bound"),
    "paged-decode": ("paged_decode", "a decode op alone (dense paged or sparse key lists): launch variants against the K/V bytes bound"),
    "batch-decode": ("batch_decode", "N sequences decoding together: step time, aggregate tok/s, the bytes-read bound"),
    "offload-decode": ("offload_decode", "prefill + decode with the KV offloaded (host store + GPU banks)"),
    "prefill": ("prefill", "whole-model time to first token, resident / offloaded, dense in the same run"),
    "prefix-ttft": ("prefix_ttft", "prefix caching: TTFT of a second question on the same document"),
    "offload-resolve": ("offload_resolve", "resolve latency of the offloaded KV banks, one layer"),
    "memory": ("memory", "KV memory and speed of a bounded-memory method (InfiniPot) vs dense"),
    "server-latency": ("server_latency", "`infinitehip serve`: TTFT and decode speed for concurrent clients"),
    "tensor-parallel": ("tensor_parallel", "tensor parallelism with the KV offloaded: TTFT and decode per TP size"),
}


def _interpreter_on_cpu(argv: list[str]) -> None:
    """CPU smoke runs execute the Triton kernels in the interpreter: set before anything imports a kernel."""
    if argv[0] == "hip-attn" and "--smoke" in argv:  # its kernels run interpreted on CPU even beside a GPU
        os.environ["TRITON_INTERPRET"] = "1"
    if "--smoke" in argv or "cpu" in argv:
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")


def build_parser(suite: str | None = None):
    """The parser; only `suite`'s module is imported (the listing names every suite without importing them)."""
    from infinitehip.cli.parser import CommandParser, add_command

    parser = CommandParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="suite", required=True, metavar="SUITE")
    for name, (module_name, help_text) in SUITES.items():
        p = add_command(sub, name, help=help_text)
        if name != suite:
            continue
        module = importlib.import_module(f"bench.suites.{module_name}")
        p.description = module.__doc__
        module.add_arguments(p)
        if "--output" not in p._option_string_actions:
            p.add_argument("--output", default=None, metavar="JSON", help="write the results (and meta) here")
        p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    suite = argv[0] if argv and argv[0] in SUITES else None
    if suite is not None:
        _interpreter_on_cpu(argv)
    from infinitehip.cli.config_file import parse_args

    from bench.common.meta import ResultFile, meta

    try:
        args = parse_args(build_parser(suite), argv)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = ResultFile(args.output, meta(args.suite, argv[1:], args))
    body = args.run(args, out)
    if body is not None:
        out.write(body)
        if out.path is not None:
            print(f"wrote {out.path}")
    return 1 if body is not None and body.get("ok") is False else 0

"""`infinitehip serve`: the OpenAI-compatible HTTP server (one engine, one attention method per server).

Requests that name another method or preset than the server's get a 400. `--help-all` lists every setting
(queue and body limits, CORS origins, the prefix cache on disk, ...).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from infinitehip.cli.method_options import add_method_flags, engine_config_from_args
from infinitehip.cli.options import add_dataclass_flags, dataclass_from_args
from infinitehip.cli.parser import add_command
from infinitehip.cli.print_config import add_print_config_flag, print_resolved
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.config.server import ServerConfig


def register(subparsers) -> None:
    p = add_command(subparsers, "serve", help="run the OpenAI-compatible HTTP server", description=__doc__)
    add_dataclass_flags(p, EngineConfig, title="engine (EngineConfig)")
    add_method_flags(p)
    server = add_dataclass_flags(p, ServerConfig, title="server (ServerConfig)")
    server.add_argument("--api-key-file", type=Path, metavar="FILE",
                        help="read the API key from this file (instead of --api-key, which the process list shows)")
    add_dataclass_flags(p, OffloadConfig, title="KV offloading (OffloadConfig)")
    add_print_config_flag(p)
    p.set_defaults(func=run)


def configs_from_args(args: argparse.Namespace) -> tuple[EngineConfig, ServerConfig]:
    """Validated configs (ValueError on bad flags) before anything heavy is loaded."""
    engine_config = engine_config_from_args(args)
    extra = {}
    key_file = getattr(args, "api_key_file", None)
    if key_file is not None:
        if getattr(args, "api_key", None) is not None:
            raise ValueError("give either --api-key or --api-key-file, not both")
        extra["api_key"] = key_file.read_text().strip()
    return engine_config, dataclass_from_args(ServerConfig, args, **extra)


def run(args: argparse.Namespace) -> int:
    engine_config, server_config = configs_from_args(args)
    if args.print_config:
        return print_resolved(engine_config)
    from infinitehip.engine.llm_engine import LLMEngine  # heavy imports only once the flags are known to be valid
    from infinitehip.server.app import create_app
    from infinitehip.server.shutdown import draining_server

    engine = LLMEngine(engine_config)
    app = create_app(engine, server_config)
    print(
        f"serving {app.state.model_name} (method {engine_config.method}, context {engine.max_context_tokens} tokens) "
        f"on http://{server_config.host}:{server_config.port}/v1"
        + (" with API key" if server_config.api_key else ""),
        flush=True,
    )
    # SIGTERM / Ctrl-C: running requests get drain_timeout_s to finish, the rest end with an error (server/shutdown.py)
    draining_server(app, server_config).run()
    return 0

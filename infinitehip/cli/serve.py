"""`infinitehip serve`: the OpenAI-compatible HTTP server (one engine, one attention method per server).

Flags: every EngineConfig field (--model, --method, --max-context-tokens, ...) and every ServerConfig
field (--host, --port, --api-key, --max-waiting-requests, ...), plus --preset for methods with presets
(requests that name another method or preset get a 400). --api-key-file reads the key from a file,
which keeps it out of the process list.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from infinitehip.cli.method_options import add_method_flags, method_config_from_args
from infinitehip.cli.options import add_dataclass_flags, dataclass_from_args
from infinitehip.config.engine import EngineConfig
from infinitehip.config.offload import OffloadConfig
from infinitehip.config.server import ServerConfig


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="run the OpenAI-compatible HTTP server", description=__doc__.splitlines()[0])
    p.add_argument("--api-key-file", type=Path, help="read the API key from this file (instead of --api-key)")
    add_dataclass_flags(p, EngineConfig)
    add_dataclass_flags(p, ServerConfig)
    add_dataclass_flags(p, OffloadConfig)
    add_method_flags(p)
    p.set_defaults(func=run)


def configs_from_args(args: argparse.Namespace) -> tuple[EngineConfig, ServerConfig]:
    """Validated configs (ValueError on bad flags) before anything heavy is loaded."""
    engine_config = dataclass_from_args(EngineConfig, args)
    extra = {}
    key_file = getattr(args, "api_key_file", None)
    if key_file is not None:
        if getattr(args, "api_key", None) is not None:
            raise ValueError("give either --api-key or --api-key-file, not both")
        extra["api_key"] = key_file.read_text().strip()
    return engine_config, dataclass_from_args(ServerConfig, args, **extra)


def run(args: argparse.Namespace) -> int:
    engine_config, server_config = configs_from_args(args)
    method_config = method_config_from_args(engine_config, args)
    import uvicorn  # heavy imports only once the flags are known to be valid

    from infinitehip.engine.llm_engine import LLMEngine
    from infinitehip.server.app import create_app

    engine = LLMEngine(engine_config, method_config=method_config, offload_config=dataclass_from_args(OffloadConfig, args))
    app = create_app(engine, server_config)
    print(
        f"serving {app.state.model_name} (method {engine_config.method}, context {engine.max_context_tokens} tokens) "
        f"on http://{server_config.host}:{server_config.port}/v1"
        + (" with API key" if server_config.api_key else ""),
        flush=True,
    )
    # Streams can be long: on Ctrl-C give them a few seconds, then close (the engine loop aborts the rest).
    uvicorn.run(app, host=server_config.host, port=server_config.port, log_level=server_config.log_level,
                timeout_graceful_shutdown=5)
    return 0

"""HTTP server configuration (the OpenAI-compatible `infinitehip serve`), validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's
BAD_PREFIX_CACHE = ("refuse", "skip")  # ServerConfig.on_bad_prefix_cache


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"  # address to listen on; loopback by default: exposing the server is an explicit choice
    port: int = 8000  # port to listen on; 0: any free port
    api_key: str | None = None  # when set, /v1/* requires `Authorization: Bearer <api_key>`
    max_waiting_requests: int = 64  # sequences queued but not yet running; beyond it: 503 + Retry-After
    max_body_bytes: int = 8 * 1024 * 1024  # larger request bodies: 413
    keepalive_interval_s: float = 5.0  # SSE comment every N seconds while a stream has nothing to send
    served_model_name: str | None = None  # model id in /v1/models and responses; None: derived from the model
    log_level: str = "info"  # uvicorn log level
    # Browser origins allowed to call the API (CORS, e.g. https://app.example.com; "*" = any). Empty: no CORS
    # headers, so browsers on other origins are refused (the default: a local server is not a public API).
    allowed_origins: tuple[str, ...] = ()
    # Directory of the prefix cache on disk: loaded at start when it holds one (refused if made for another model,
    # method or KV layout), saved at shutdown, so a restarted server answers on a known document without its prefill.
    prefix_cache_dir: str | None = None
    # A prefix cache file that fails its checks (unreadable, a checksum or finite-values check, another model or
    # method): "refuse" to start, naming the file and what failed; "skip": move it aside to <file>.rejected (kept)
    # and start with an empty cache, with a warning.
    on_bad_prefix_cache: str = "refuse"
    # After SIGTERM / Ctrl-C: new requests get 503, running ones get this many seconds to finish; the rest then end
    # with an error (JSON, or an SSE error event and [DONE]); the prefix cache is saved and the process exits 0.
    drain_timeout_s: float = 20.0
    body_read_timeout_s: float = 30.0  # a request body not fully received within this: 408 and the connection closed
    ui: bool = True  # serve the page at / to ask questions of a long document (server/ui/); false: the API only

    # For the CLI (cli/options.py): the fields `--help` lists (--help-all lists all), allowed values.
    HELP_FIELDS: ClassVar[tuple[str, ...]] = ("host", "port", "api_key", "served_model_name", "ui")
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"log_level": LOG_LEVELS, "on_bad_prefix_cache": BAD_PREFIX_CACHE}

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be a non-empty string, got {self.host!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.api_key is not None and (not self.api_key or self.api_key != self.api_key.strip()):
            raise ValueError("api_key must be non-empty and have no surrounding whitespace")
        if self.max_waiting_requests < 1:
            raise ValueError(f"max_waiting_requests must be >= 1, got {self.max_waiting_requests}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if not (math.isfinite(self.keepalive_interval_s) and self.keepalive_interval_s > 0):
            raise ValueError(f"keepalive_interval_s must be a positive number, got {self.keepalive_interval_s}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("served_model_name must be non-empty when given")
        object.__setattr__(self, "allowed_origins", tuple(self.allowed_origins))
        if any(not isinstance(o, str) or not o.strip() for o in self.allowed_origins):
            raise ValueError("allowed_origins must be non-empty strings (an origin such as https://host:port, or *)")
        if not isinstance(self.ui, bool):
            raise ValueError(f"ui must be true or false, got {self.ui!r}")
        for name in ("drain_timeout_s", "body_read_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.on_bad_prefix_cache not in BAD_PREFIX_CACHE:
            raise ValueError(f"on_bad_prefix_cache must be one of {'/'.join(BAD_PREFIX_CACHE)}, "
                             f"got {self.on_bad_prefix_cache!r}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {'/'.join(LOG_LEVELS)}, got {self.log_level!r}")

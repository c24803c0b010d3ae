"""The page at / for asking questions of a long document (static files in server/ui/: plain HTML, JS and CSS, no
build step, nothing fetched from elsewhere), and GET /server_info, the server's settings the page shows.

The page talks to the public API only (/server_info, /tokenize, /v1/chat/completions with `prefill_progress`), so
what it shows is what any client gets. Its files are open without the API key (they hold no data; the page asks
for the key and sends it with every API call); /server_info needs the key like the rest of the API.
"""

from __future__ import annotations

import dataclasses
import json
from importlib.resources import files
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, JSONResponse

from infinitehip.config.sampling import SamplingParams
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.engine.sampler import GENERATION_DEFAULTS

UI_DIR = files("infinitehip.server") / "ui"
# URL path -> (file in UI_DIR, media type). A fixed list: nothing else of the package is reachable.
UI_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/ui/style.css": ("style.css", "text/css; charset=utf-8"),
}
UI_PATHS = frozenset(UI_FILES)  # open without the API key (ServerMiddleware's open_paths)
# The page runs only its own script and style and calls only this server.
_PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
                 "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


def _file_route(name: str, media_type: str):
    async def serve() -> FileResponse:  # no parameters: a request cannot name another file
        return FileResponse(str(UI_DIR / name), media_type=media_type, headers=_PAGE_HEADERS)

    return serve


def ui_router() -> APIRouter:
    router = APIRouter(include_in_schema=False)
    for path, (name, media_type) in UI_FILES.items():
        router.add_api_route(path, _file_route(name, media_type), methods=["GET"])
    return router


def _json_safe(value: Any) -> Any:
    """A method config's fields as JSON (tuples as lists, anything else unusual as its text)."""
    return json.loads(json.dumps(value, default=str))


def server_info(engine: LLMEngine, model_name: str, preset: str | None, max_waiting_requests: int) -> dict[str, Any]:
    """What this server runs: model, context limit, method and its settings, and the sampling a request gets for
    the fields it leaves unset (SamplingParams' defaults under the model's generation_config.json ones)."""
    method_config = getattr(engine.method, "config", None)
    defaults = SamplingParams()
    sampling = {name: getattr(defaults, name) for name in GENERATION_DEFAULTS} | dict(engine.sampling_defaults)
    return {
        "model": model_name,
        "max_model_len": engine.max_sequence_tokens,  # the KV cache may hold less than the context
        "method": engine.config.method,
        "preset": preset,
        "method_config": _json_safe(dataclasses.asdict(method_config)) if dataclasses.is_dataclass(method_config)
        else None,
        "prefix_caching": engine.prefix is not None,
        "prefill_chunk_size": engine.resolved.prefill_chunk_size,
        "max_waiting_requests": max_waiting_requests,
        "sampling_defaults": sampling,
    }


def server_info_router(engine: LLMEngine, model_name: str, preset: str | None,
                       max_waiting_requests: int) -> APIRouter:
    router = APIRouter()
    info = server_info(engine, model_name, preset, max_waiting_requests)  # fixed for the server's life

    @router.get("/server_info")
    async def get_server_info():
        return JSONResponse(info)

    return router

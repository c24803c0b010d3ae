"""FastAPI app factory: OpenAI-compatible routes over one LLMEngine driven by a background engine loop.

    app = create_app(LLMEngine(EngineConfig(...)), ServerConfig(api_key="..."))
    uvicorn.run(app, host=..., port=...)

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models[/{id}], POST /tokenize, POST /detokenize,
GET /tokenizer_info (vLLM's; also under /v1), GET /server_info, GET /health, GET /metrics (Prometheus), and the page
at / (unless ui is off). With an API key, everything but /health, /metrics and the API docs needs
`Authorization: Bearer <key>`.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response

from infinitehip.config.server import ServerConfig
from infinitehip.engine.llm_engine import LLMEngine
from infinitehip.server.async_engine import AsyncEngine
from infinitehip.server.errors import APIError, error_response, install_error_handlers
from infinitehip.server.metrics import ServerMetrics
from infinitehip.server.middleware import OPEN_PATHS, ServerMiddleware
from infinitehip.server.prefix_cache_file import PREFIX_CACHE_FILE, PrefixCacheFile  # noqa: F401 (the file's name)
from infinitehip.server.protocol import (
    ChatCompletionRequest, ChatCompletionResponse, CompletionRequest, CompletionResponse, ErrorResponse, ModelCard,
    ModelList,
)
from infinitehip.server.serving import OpenAIServing
from infinitehip.server.tokenizer_routes import tokenizer_router
from infinitehip.server.ui_routes import UI_PATHS, server_info_router, ui_router

_ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 422, 503)}


def _version() -> str:
    try:
        return importlib.metadata.version("infinitehip")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def served_model_name(engine: LLMEngine, config: ServerConfig) -> tuple[str, set[str]]:
    """(model id shown to clients, other names accepted in requests)."""
    aliases = set()
    if engine.config.model is not None:
        aliases.add(engine.config.model)
        name = Path(engine.config.model).name
        name = name[: -len(".gguf")] if name.endswith(".gguf") else name
    else:
        from infinitehip.model.builtin import EMBEDDED_MODEL_FILE

        name = Path(EMBEDDED_MODEL_FILE).stem
    aliases.add(name)
    if config.served_model_name:
        aliases.add(config.served_model_name)
        name = config.served_model_name
    return name, aliases


def create_app(engine: LLMEngine, server_config: ServerConfig | None = None) -> FastAPI:
    config = server_config or ServerConfig()
    metrics = ServerMetrics()
    if config.prefix_cache_dir and engine.parallel is not None:  # refused at start, not at the first save
        raise ValueError("--prefix-cache-dir is not available with tensor_parallel_size > 1: a prefix cache file "
                         "holds one process's KV")
    async_engine = AsyncEngine(engine, config.max_waiting_requests, metrics)
    model_name, aliases = served_model_name(engine, config)
    serving = OpenAIServing(async_engine, config, model_name, aliases)
    created = int(time.time())

    cache_file = PrefixCacheFile(engine, config)
    cache_file.load()  # before the loop starts: nothing else touches the KV; a bad file: ValueError naming it

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async_engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(async_engine.shutdown)
            await asyncio.to_thread(cache_file.save)  # the loop has stopped: the KV is still

    app = FastAPI(
        title="infinitehip", version=_version(), lifespan=lifespan,
        description="OpenAI-compatible API over one long-context engine "
        f"(method {engine.config.method!r}, context {engine.max_context_tokens} tokens).",
    )
    app.state.async_engine = async_engine
    app.state.metrics = metrics
    app.state.model_name = model_name
    install_error_handlers(app)
    app.add_middleware(ServerMiddleware, metrics=metrics, api_key=config.api_key, max_body_bytes=config.max_body_bytes,
                       open_paths=OPEN_PATHS | UI_PATHS if config.ui else OPEN_PATHS,
                       body_read_timeout_s=config.body_read_timeout_s)
    if config.allowed_origins:  # added last = outermost: a browser's preflight is answered before the key check
        app.add_middleware(CORSMiddleware, allow_origins=list(config.allowed_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])

    def model_card() -> dict:
        # the real limit of one request: kv_cache_tokens below the context limit lowers it
        return ModelCard(id=model_name, created=created, max_model_len=engine.max_sequence_tokens,
                         method=engine.config.method, preset=serving.preset).model_dump()

    v1 = APIRouter(prefix="/v1", responses=_ERRORS)

    @v1.post("/completions", response_model=CompletionResponse)
    async def completions(body: CompletionRequest, request: Request):
        return await serving.completions(body, request)

    @v1.post("/chat/completions", response_model=ChatCompletionResponse)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await serving.chat(body, request)

    @v1.get("/models", response_model=ModelList)
    async def list_models():
        return JSONResponse({"object": "list", "data": [model_card()]})

    @v1.get("/models/{model_id:path}", response_model=ModelCard)
    async def get_model(model_id: str):
        if model_id not in serving.aliases:
            raise APIError(404, f"model {model_id!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found")
        return JSONResponse(model_card())

    app.include_router(v1)
    app.include_router(tokenizer_router(engine, serving.check_model, serving.message_dict), responses=_ERRORS)
    app.include_router(server_info_router(engine, model_name, serving.preset, config.max_waiting_requests))
    if config.ui:  # the page at / (server/ui_routes.py)
        app.include_router(ui_router())

    @app.get("/health")
    async def health():
        if not async_engine.healthy:
            return error_response(503, "engine loop is not running", code="unavailable")
        body = {"status": "ok", "model": model_name, "method": engine.config.method}
        if async_engine.last_error:
            body["last_engine_error"] = async_engine.last_error
        return JSONResponse(body)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics():
        payload, content_type = metrics.render()
        return Response(payload, media_type=content_type)

    return app

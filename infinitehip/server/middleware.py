"""Pure ASGI middleware in front of the routes: request metrics, API-key check, request-body limit.

Pure ASGI (not BaseHTTPMiddleware) so that streaming responses and client-disconnect messages pass
through untouched. The body is read here, up to the limit, and replayed to the app: an oversized body
gets a 413 before any JSON parsing, whether it announces its length or streams it chunked. A body that does
not arrive whole within body_read_timeout_s (shorter than its Content-Length, or sent slowly) gets a 408 and
its connection is closed, so it cannot hold a connection open.
"""

from __future__ import annotations

import asyncio
import hmac
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infinitehip.server.errors import error_body
from infinitehip.server.metrics import ServerMetrics

# Routes that stay open with an API key set (probes, scrapers, API docs); the app adds the page's files when it
# serves the page (server/ui_routes.py), which ask for the key themselves.
OPEN_PATHS = frozenset({"/health", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


async def send_json(send: Send, status: int, body: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(body).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *headers],
    })
    await send({"type": "http.response.body", "body": payload, "more_body": False})


class ServerMiddleware:
    def __init__(self, app: ASGIApp, *, metrics: ServerMetrics, api_key: str | None, max_body_bytes: int,
                 open_paths: frozenset[str] = OPEN_PATHS, body_read_timeout_s: float = 30.0):
        self.app, self.metrics, self.max_body_bytes, self.open_paths = app, metrics, max_body_bytes, open_paths
        self.body_read_timeout_s = body_read_timeout_s
        self.api_key = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.count_request(path, message["status"])
            await send(message)

        if self.api_key is not None and path not in self.open_paths and not self._authorized(scope):
            await send_json(
                counting_send, 401,
                error_body("missing or invalid API key (send `Authorization: Bearer <key>`)", "authentication_error",
                           code="invalid_api_key"),
                [(b"www-authenticate", b"Bearer")],
            )
            return
        if scope.get("method") in ("POST", "PUT", "PATCH"):
            replay = await self._read_body(scope, receive, counting_send)
            if replay is None:
                return
            receive = replay
        await self.app(scope, receive, counting_send)

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.strip().partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key)
        return False

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        """Read the whole body (at most max_body_bytes); None when an error response was sent instead."""
        limit = self.max_body_bytes
        too_large = error_body(f"request body exceeds the limit of {limit} bytes", "invalid_request_error",
                               code="request_too_large")
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    announced = int(value)
                except ValueError:
                    await send_json(send, 400, error_body("invalid Content-Length header", "invalid_request_error"))
                    return None
                if announced > limit:
                    await send_json(send, 413, too_large, [(b"connection", b"close")])
                    return None
        chunks, size = [], 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_read_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                timeout = error_body(f"the request body did not arrive within {self.body_read_timeout_s:g} s "
                                     f"({size} bytes received)", "invalid_request_error", code="request_timeout")
                await send_json(send, 408, timeout, [(b"connection", b"close")])
                return None
            if message["type"] == "http.disconnect":
                return None  # nobody to answer
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await send_json(send, 413, too_large, [(b"connection", b"close")])
                return None
            chunks.append(body)
            if not message.get("more_body", False):
                break
        first: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            if first:
                return first.pop()
            return await receive()  # after the body: wait for http.disconnect

        return replay

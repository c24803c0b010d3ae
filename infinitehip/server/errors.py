"""OpenAI error envelope `{"error": {"message", "type", "param", "code"}}` and the handlers that produce it.

Every error leaves the server in this shape: our own `APIError`s, FastAPI's request validation errors
(malformed JSON -> 400, schema errors -> 422), Starlette's 404/405, and as a last resort unexpected
exceptions (500; bad input must never get there).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("infinitehip.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_overloaded",
}


class APIError(Exception):
    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None,
        type: str | None = None, headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _TYPES.get(status, "internal_error" if status >= 500 else "invalid_request_error")
        self.headers = headers


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(status: int, message: str, *, param: str | None = None, code: str | None = None,
                   type: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    err = APIError(status, message, param=param, code=code, type=type, headers=headers)
    return JSONResponse(error_body(err.message, err.type, err.param, err.code), status_code=status, headers=headers)


def _loc_to_param(loc: tuple | list) -> str | None:
    parts = [str(p) for p in loc if p != "body"]
    # Union members show up as type names in the location (e.g. "str", "list[int]"): drop them.
    parts = [p for p in parts if not (p[:1].isalpha() and ("[" in p or p in ("str", "int", "float", "bool")))]
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out += f"[{p}]" if p.isdigit() else f".{p}"
    return out


def validation_error_response(exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid")
        ctx = detail.get("ctx") or {}
        msg = f"request body is not valid JSON: {ctx.get('error', detail.get('msg', 'parse error'))}"
        return error_response(400, msg, code="invalid_json")
    if not errors:
        return error_response(422, "invalid request", code="invalid_request")
    # One entry per parameter (a union type reports one error per member: join them), first few only.
    by_param: dict[str | None, list[str]] = {}
    for e in errors:
        msgs = by_param.setdefault(_loc_to_param(e.get("loc", ())), [])
        if e.get("msg") not in msgs:
            msgs.append(str(e.get("msg")))
    parts = [f"{p}: {' or '.join(m)}" if p else " or ".join(m) for p, m in list(by_param.items())[:5]]
    more = f" (and {len(by_param) - 5} more)" if len(by_param) > 5 else ""
    return error_response(422, "; ".join(parts) + more, param=next(iter(by_param)), code="invalid_request")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, exc.type, exc.param, exc.code), status_code=exc.status,
                            headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            msg, code = f"no route {request.method} {request.url.path}", "not_found"
        elif exc.status_code == 405:
            msg, code = f"method {request.method} is not allowed on {request.url.path}", "method_not_allowed"
        else:
            msg, code = str(exc.detail), None
        return error_response(exc.status_code, msg, code=code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, f"internal server error: {type(exc).__name__}", code="internal_error")

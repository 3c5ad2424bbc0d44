"""Typed API errors and the one handler that turns any error into OpenAI's envelope.

    ApiError                    status, type, param, code, headers
     ├── InvalidRequest         400 invalid_request_error
     ├── Unauthorized           401 invalid_request_error / invalid_api_key
     ├── NotFound               404 invalid_request_error (model_not_found, not_found)
     ├── MethodNotAllowed       405 invalid_request_error
     ├── RequestTooLarge        413 invalid_request_error / request_too_large
     ├── RateLimited            429 rate_limit_error, with an integer Retry-After
     └── ServiceUnavailable     503 server_error (model loading, engine not ready)

The pipeline's exceptions (pipeline/errors.py) become API errors in exactly one place,
`pipeline_api_error`: a route lets them propagate (or, in a body already streaming, turns
them into an SSE error event through the same function). Foreign errors (FastAPI's
RequestValidationError, Starlette's HTTPException, anything unexpected) are translated in
`to_api_error`, so the envelope is built in exactly one place, `error_response`.
Pydantic's 422 never reaches a client.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from app.client_json import quote
from pipeline.errors import (
    NotReady,
    PipelineError,
    Rejected,
    StreamCancelled,
    StreamFailed,
    UnknownVoice,
)

logger = logging.getLogger("playhead.app")


class ApiError(Exception):
    status_code = 500
    error_type = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        status_code: int | None = None,
    ) -> None:
        super().__init__(message)
        if status_code is not None:
            self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def envelope(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(ApiError):
    status_code = 400
    error_type = "invalid_request_error"


class Unauthorized(ApiError):
    status_code = 401
    error_type = "invalid_request_error"


class NotFound(ApiError):
    status_code = 404
    error_type = "invalid_request_error"


class MethodNotAllowed(ApiError):
    status_code = 405
    error_type = "invalid_request_error"


class RequestTooLarge(ApiError):
    """413: the request body is larger than server.max_request_bytes."""

    status_code = 413
    error_type = "invalid_request_error"


class RateLimited(ApiError):
    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: int, code: str | None = None) -> None:
        retry_after_s = max(1, int(retry_after_s))
        super().__init__(message, code=code, headers={"Retry-After": str(retry_after_s)})
        self.retry_after_s = retry_after_s


class ServiceUnavailable(ApiError):
    status_code = 503
    error_type = "server_error"


def shutting_down_error(retry_after_s: float) -> ServiceUnavailable:
    """What a request gets while the server drains (app/shutdown.py) or has stopped."""
    return ServiceUnavailable(
        "The server is shutting down; retry on another instance or shortly.",
        code="shutting_down",
        headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))},
    )


_TYPE_NAMES = {
    "string_type": "a string",
    "float_type": "a number",
    "int_type": "an integer",
    "bool_type": "a boolean",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "int_from_float": "an integer",
}


def json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def validation_error(errors: Sequence[Mapping[str, Any]]) -> InvalidRequest:
    """The first pydantic error (of a request body) as a 400 naming its field."""
    if not errors:
        return InvalidRequest("Invalid request body.", code="invalid_value")
    err = errors[0]
    loc = [
        quote(part) if isinstance(part, str) and not part.isidentifier() else str(part)
        for part in err.get("loc", ())
        if part != "body"
    ]
    param = ".".join(loc) or None
    kind = str(err.get("type", ""))
    value = err.get("input")
    if param is None and kind in ("model_type", "model_attributes_type", "dict_type"):
        return InvalidRequest(
            f"The request body must be a JSON object, but got {json_type_name(value)}.",
            code="invalid_type",
        )
    if kind == "missing":
        return InvalidRequest(
            f"Missing required parameter: '{param}'.",
            param=param,
            code="missing_required_parameter",
        )
    if kind == "extra_forbidden":
        return InvalidRequest(
            f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter"
        )
    if kind in _TYPE_NAMES:
        return InvalidRequest(
            f"Invalid type for '{param}': expected {_TYPE_NAMES[kind]}, "
            f"but got {json_type_name(value)} instead.",
            param=param,
            code="invalid_type",
        )
    if param is None:
        return InvalidRequest("The request body is not a valid request.", code="invalid_value")
    ctx = err.get("ctx") or {}
    if kind == "float_type" and isinstance(value, int) and not isinstance(value, bool):
        message = f"Invalid '{param}': the number is out of range"  # too large for a float
    elif kind in _BOUND_WORDS:
        words, key = _BOUND_WORDS[kind]
        message = f"Invalid '{param}': it must be {words} {ctx.get(key)}"
    elif kind == "string_too_long":
        message = f"Invalid '{param}': it must be at most {ctx.get('max_length')} characters long"
    elif kind == "literal_error":
        message = f"Invalid '{param}': it must be one of {ctx.get('expected', '?')}"
    else:
        message = f"Invalid '{param}': the value is not accepted"
    if isinstance(value, int | float) and not isinstance(value, bool) and len(str(value)) <= 40:
        message += f" (got {json.dumps(value)})"
    elif isinstance(value, str):
        message += f" (got {quote(value, 40)})"
    return InvalidRequest(message + ".", param=param, code="invalid_value")


_BOUND_WORDS = {
    "greater_than_equal": ("at least", "ge"),
    "greater_than": ("greater than", "gt"),
    "less_than_equal": ("at most", "le"),
    "less_than": ("less than", "lt"),
}


def shutting_down() -> ServiceUnavailable:
    """A stream ended because the engine stopped under it."""
    return ServiceUnavailable("The server is shutting down.", code="shutting_down")


def pipeline_api_error(exc: PipelineError) -> ApiError:
    """The API error for one of the pipeline's exceptions: the only place that maps them."""
    if isinstance(exc, Rejected):
        decision = exc.decision
        return RateLimited(
            f"The server is at capacity ({decision.reason}); retry after "
            f"{decision.retry_after_s} s.",
            retry_after_s=decision.retry_after_s or 1,
            code="rate_limit_exceeded",
        )
    if isinstance(exc, UnknownVoice):
        return InvalidRequest(
            f"Unknown voice {quote(exc.voice)}. Available voices: {', '.join(exc.available)} "
            "(OpenAI voice names map to the default voice).",
            param="voice",
            code="voice_not_found",
        )
    if isinstance(exc, NotReady):
        return ServiceUnavailable("The engine is not running.", code="engine_not_ready")
    if isinstance(exc, StreamFailed):
        return ApiError(f"Speech generation failed: {exc.cause}", code="stream_failed")
    if isinstance(exc, StreamCancelled):  # the engine stopped under a stream
        return shutting_down()
    return ApiError(f"Speech generation failed: {exc}", code="pipeline_error")


def to_api_error(exc: Exception) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, PipelineError):
        return pipeline_api_error(exc)
    if isinstance(exc, RequestValidationError):
        return validation_error(exc.errors())
    if isinstance(exc, StarletteHTTPException):
        headers = getattr(exc, "headers", None)
        if exc.status_code == 404:
            return NotFound("Not found.", code="not_found", headers=headers)
        if exc.status_code == 405:
            return MethodNotAllowed(
                "Method not allowed.", code="method_not_allowed", headers=headers
            )
        if exc.status_code == 401:
            return Unauthorized(str(exc.detail), code="invalid_api_key", headers=headers)
        if 400 <= exc.status_code < 500:
            return InvalidRequest(str(exc.detail), headers=headers)
        # a 5xx keeps its own status (500, 501, 503...)
        return ApiError(str(exc.detail), headers=headers, status_code=exc.status_code)
    return ApiError("The server had an error while processing your request.")


class EnvelopeResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: an envelope that echoes a client's
    string (even a lone surrogate) always encodes."""

    def render(self, content: object) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(exc: ApiError) -> JSONResponse:
    headers = exc.headers
    if exc.status_code >= 500 and "Connection" not in headers:
        # the server may be in a bad way (or going away): the client's next request opens a
        # new connection rather than meeting a reset on this one
        headers = {**headers, "Connection": "close"}
    return EnvelopeResponse(exc.envelope(), status_code=exc.status_code, headers=headers)


async def handle_error(request: Request, exc: Exception) -> JSONResponse:
    """The one exception handler: every error leaves as OpenAI's envelope."""
    # An unexpected exception is logged by the server: Starlette re-raises it after this.
    return error_response(to_api_error(exc))


async def handle_client_gone(request: Request, exc: Exception) -> JSONResponse:
    """The client left before its response started (while its request body was read, or
    while its first audio was made): nobody gets this answer, and it is not a server
    error (no traceback in the log)."""
    logger.debug("client disconnected before its response started: %s", request.url.path)
    return error_response(
        InvalidRequest("The client disconnected before the response started.", code="client_gone")
    )


def install_error_handlers(app: FastAPI) -> None:
    for exc_class in (
        ApiError,
        PipelineError,
        RequestValidationError,
        StarletteHTTPException,
        Exception,
    ):
        app.add_exception_handler(exc_class, handle_error)
    app.add_exception_handler(ClientDisconnect, handle_client_gone)

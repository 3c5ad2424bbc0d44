"""ElevenLabs' error shape: `{"detail": {"status", "code", "type", "message", "param"}}`
over HTTP (its SDK raises `ApiError(status_code, body=that)`; pipecat and LiveKit show the
text), and `{"error", "message", ...}` on its sockets (LiveKit fails the context with it;
the official SDK raises it).

Playhead's own errors (app/errors.py's ApiError, the pipeline's through
`to_api_error`) keep their status and message; their codes become ElevenLabs' where one
means the same thing (a 429 is `too_many_concurrent_requests`, as ElevenLabs says it).
"""

from __future__ import annotations

from typing import Any

from app.errors import ApiError, EnvelopeResponse, InvalidRequest

# Playhead's code -> ElevenLabs' status for the same thing
_STATUS = {
    "rate_limit_exceeded": "too_many_concurrent_requests",
    "missing_api_key": "needs_authorization",
    "string_above_max_length": "max_character_limit_exceeded",
}
_TYPES = {400: "validation_error", 401: "authentication_error", 404: "not_found", 429: "rate_limit"}


class ElevenLabsInvalid(InvalidRequest):
    """400 for a value ElevenLabs' API would refuse (or Playhead cannot serve)."""


def status_of(exc: ApiError) -> str:
    code = exc.code or "error"
    return _STATUS.get(code, code)


def detail(exc: ApiError) -> dict[str, Any]:
    return {
        "detail": {
            "status": status_of(exc),
            "code": status_of(exc),
            "type": _TYPES.get(
                exc.status_code, "server_error" if exc.status_code >= 500 else "invalid_request"
            ),
            "message": exc.message,
            "param": exc.param,
        }
    }


def error_response(exc: ApiError) -> EnvelopeResponse:
    """The HTTP answer for `exc` in ElevenLabs' shape (Retry-After and the like kept)."""
    headers = dict(exc.headers)
    if exc.status_code >= 500:
        headers.setdefault("Connection", "close")
    return EnvelopeResponse(detail(exc), status_code=exc.status_code, headers=headers)


def socket_error(exc: ApiError, context_id: str | None = None) -> dict[str, Any]:
    """A socket's error message; with the context's id on the multi-context socket."""
    message: dict[str, Any] = {
        "error": status_of(exc),
        "message": exc.message,
        "code": exc.status_code,
    }
    retry_after = exc.headers.get("Retry-After")
    if retry_after is not None:
        message["retry_after_s"] = int(retry_after)
    if context_id is not None:
        message["contextId"] = context_id
        message["context_id"] = context_id
    return message

"""The messages of WS /v1/audio/speech/stream (docs/websocket.md): parsing what the client
sends, building what the server sends, and the close codes.

Client messages are JSON text. `parse_message` returns one of the message dataclasses or
raises ProtocolError, which carries the error event to send and, for a violation that
ends the session, the close code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.client_json import ClientJsonError, load_client_json, quote
from app.errors import json_type_name, validation_error
from pipeline import Rejected
from pipeline.alignment import CharTiming, WordTiming

# Close codes (RFC 6455).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_SERVER_ERROR = 1011

SOCKET_FORMATS = ("pcm", "wav")


class SessionConfig(BaseModel):
    """session.config: how this socket's utterances are spoken (each field optional)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: str
    model: str | None = None  # accepted for clients that send one; the voice decides
    voice: str | None = None
    response_format: str = "pcm"
    sample_rate: int | None = Field(None, ge=8000, le=48000)
    speed: float = Field(1.0, ge=0.25, le=4.0)
    # send `alignment` events (when each character and word is heard) before the audio
    alignment: bool = False


@dataclass(frozen=True, slots=True)
class InputText:
    text: str


@dataclass(frozen=True, slots=True)
class InputDone:
    pass


@dataclass(frozen=True, slots=True)
class PlaybackPosition:
    played_ms: float
    utterance: int | None  # None: the utterance whose audio is being sent


@dataclass(frozen=True, slots=True)
class Cancel:
    pass


@dataclass(frozen=True, slots=True)
class SessionClose:
    pass


ClientMessage = SessionConfig | InputText | InputDone | PlaybackPosition | Cancel | SessionClose


class ProtocolError(Exception):
    """A client message the server refuses: send `event()`; close with `close_code` if set."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        param: str | None = None,
        close_code: int | None = None,
        error_type: str = "invalid_request_error",
        retry_after_s: int | None = None,
        utterance: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.close_code = close_code
        self.error_type = error_type
        self.retry_after_s = retry_after_s
        self.utterance = utterance

    def event(self, utterance: int | None = None) -> dict[str, Any]:
        return error_event(
            self.message,
            code=self.code,
            param=self.param,
            error_type=self.error_type,
            utterance=self.utterance if self.utterance is not None else utterance,
            retry_after_s=self.retry_after_s,
        )


def error_event(
    message: str,
    *,
    code: str | None,
    param: str | None = None,
    error_type: str = "invalid_request_error",
    utterance: int | None = None,
    retry_after_s: int | None = None,
) -> dict[str, Any]:
    """The `error` event: OpenAI's envelope fields, plus the utterance and retry_after_s."""
    event: dict[str, Any] = {
        "type": "error",
        "error": {"message": message, "type": error_type, "param": param, "code": code},
    }
    if utterance is not None:
        event["utterance"] = utterance
    if retry_after_s is not None:
        event["retry_after_s"] = retry_after_s
    return event


def alignment_event(
    utterance: int, chars: list[CharTiming], words: list[WordTiming]
) -> dict[str, Any]:
    """The `alignment` event: characters (and the words they complete) of one utterance's
    text as sent, with times in ms from the start of the utterance's audio."""
    return {
        "type": "alignment",
        "utterance": utterance,
        "start_index": chars[0].index if chars else None,
        "chars": [c.char for c in chars],
        "char_start_ms": [round(c.start_s * 1000.0, 1) for c in chars],
        "char_duration_ms": [round(c.duration_s * 1000.0, 1) for c in chars],
        "words": [
            {
                "word": w.word,
                "start_ms": round(w.start_s * 1000.0, 1),
                "end_ms": round(w.end_s * 1000.0, 1),
                "start_index": w.start_index,
                "end_index": w.end_index,
            }
            for w in words
        ],
    }


def _field(data: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ProtocolError(
            f"Invalid type for '{name}': expected {what}, but got {json_type_name(value)}.",
            code="invalid_type" if name in data else "missing_required_parameter",
            param=name,
        )
    return value


def _no_extra(data: dict[str, Any], allowed: tuple[str, ...]) -> None:
    extra = sorted(set(data) - {"type", *allowed})
    if extra:
        raise ProtocolError(
            f"Unknown parameter: {quote(extra[0])}.", code="unknown_parameter", param=extra[0]
        )


def parse_message(raw: str) -> ClientMessage:
    """One client text message, or ProtocolError (never a close: the caller decides)."""
    try:
        data = load_client_json(raw)
    except ClientJsonError as exc:
        message = f"The message is not valid JSON. {exc.message}"
        raise ProtocolError(message, code=exc.code) from None
    if not isinstance(data, dict):
        raise ProtocolError(
            f"A message must be a JSON object, but got {json_type_name(data)}.",
            code="invalid_type",
        )
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(
            "A message needs a string 'type'.", code="missing_required_parameter", param="type"
        )
    if kind == "session.config":
        try:
            config = SessionConfig.model_validate(data)
        except ValidationError as exc:
            error = validation_error(exc.errors())
            raise ProtocolError(
                error.message, code=error.code or "invalid_value", param=error.param
            ) from None
        if config.response_format not in SOCKET_FORMATS:
            raise ProtocolError(
                f"Invalid 'response_format': {config.response_format!r}; the socket sends "
                f"{' or '.join(SOCKET_FORMATS)}.",
                code="invalid_value",
                param="response_format",
            )
        return config
    if kind == "input.text":
        _no_extra(data, ("text",))
        return InputText(_field(data, "text", str, "a string"))
    if kind == "input.done":
        _no_extra(data, ())
        return InputDone()
    if kind == "playback.position":
        _no_extra(data, ("played_ms", "utterance"))
        played_ms = float(_field(data, "played_ms", (int, float), "a number"))
        if not (math.isfinite(played_ms) and played_ms >= 0):
            raise ProtocolError(
                "Invalid 'played_ms': it must be a number >= 0.",
                code="invalid_value",
                param="played_ms",
            )
        utterance = None
        if data.get("utterance") is not None:
            utterance = _field(data, "utterance", int, "an integer")
        return PlaybackPosition(played_ms, utterance)
    if kind == "cancel":
        _no_extra(data, ())
        return Cancel()
    if kind == "session.close":
        _no_extra(data, ())
        return SessionClose()
    raise ProtocolError(
        f"Unknown message type {kind!r}; known: session.config, input.text, input.done, "
        "playback.position, cancel, session.close.",
        code="unknown_type",
        param="type",
    )


def at_capacity_error(exc: Rejected, index: int) -> ProtocolError:
    """An admission refusal: the utterance's text is dropped, the socket stays."""
    retry_after_s = exc.retry_after_s
    return ProtocolError(
        f"The server is at capacity ({exc.decision.reason}); retry after "
        f"{retry_after_s} s. The rest of this utterance's text is dropped.",
        code="rate_limit_exceeded",
        error_type="rate_limit_error",
        retry_after_s=retry_after_s,
        utterance=index,
    )


def not_running_error() -> ProtocolError:
    """The engine stopped (or never started): the socket closes with 1011."""
    return ProtocolError(
        "The engine is not running.",
        code="engine_not_ready",
        error_type="server_error",
        close_code=CLOSE_SERVER_ERROR,
    )

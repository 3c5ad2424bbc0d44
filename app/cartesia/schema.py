"""Cartesia's request fields and error shape (docs/cartesia.md), read defensively.

`parse_generation` turns one JSON object (a POST /tts/bytes or /tts/sse body, or one
generation message on /tts/websocket) into a `Generation`; `parse_output_format` reads
`output_format`. Anything Playhead cannot honour as asked is a `CartesiaError` (a 400 with
Cartesia's `error_code`, `title` and `message`), never a 5xx. Fields Playhead does not use
(pronunciation dictionaries, emotion, volume, `save`, ...) are
accepted and ignored, as the clients send them whatever the server.

Errors have Cartesia's own shape: over HTTP `{"error_code", "title", "message",
"request_id"}` with the status code (429 with Retry-After); on the socket the same fields
plus `type: "error"`, `done` (false: see `CartesiaError.event`), `status_code` and
`context_id`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from app.client_json import quote
from app.errors import json_type_name
from app.text_input import has_nul

# The encodings Playhead writes raw or in wav: every one of Cartesia's
RAW_ENCODINGS = ("pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw")
CONTAINERS = ("raw", "wav", "mp3")
MP3_BIT_RATES_BPS = (32000, 64000, 96000, 128000, 192000)
MIN_RATE_HZ = 8000
MAX_RATE_HZ = 48000
# Cartesia's `speed` (an experimental enum) as a speed factor of the engine.
SPEED_WORDS = {"slowest": 0.7, "slow": 0.85, "normal": 1.0, "fast": 1.2, "fastest": 1.4}
GENERATION_SPEED_RANGE = (0.6, 1.5)  # generation_config.speed, as Cartesia documents it
MAX_BUFFER_DELAY_MS = 5000
DEFAULT_BUFFER_DELAY_MS = 3000  # Cartesia's default
# A Cartesia voice id: a UUID. One that is not a Playhead voice means the default voice.
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}$")

_TITLES = {
    400: "Invalid request",
    401: "Unauthorized",
    404: "Not found",
    413: "Request too large",
    429: "Too many requests",
    500: "Internal server error",
    503: "Service unavailable",
}


class CartesiaError(Exception):
    """An error as Cartesia reports it (see the module doc)."""

    def __init__(
        self,
        message: str,
        *,
        error_code: str,
        status_code: int = 400,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.error_code = error_code
        self.status_code = status_code
        self.retry_after_s = retry_after_s

    @property
    def title(self) -> str:
        return _TITLES.get(self.status_code, "Error")

    def body(self, request_id: str) -> dict[str, Any]:
        return {
            "error_code": self.error_code,
            "title": self.title,
            "message": self.message,
            "request_id": request_id,
        }

    def event(self, request_id: str, context_id: str | None) -> dict[str, Any]:
        """The socket's (and the SSE body's) error message; `context_id` is always there
        (null when the message had none): pipecat reads it from every message. `done` is
        false, where Cartesia sends true: LiveKit's plugin reads `done` before `type`, and
        would end the stream quietly instead of raising the error."""
        return {
            "type": "error",
            "context_id": context_id,
            "done": False,
            "status_code": self.status_code,
            **self.body(request_id),
        }


def invalid(message: str, code: str = "invalid_request") -> CartesiaError:
    return CartesiaError(message, error_code=code)


@dataclass(frozen=True)
class OutputFormat:
    container: str  # raw, wav, mp3
    encoding: str | None  # one of RAW_ENCODINGS; None for mp3
    sample_rate_hz: int
    bit_rate_bps: int | None = None  # mp3 only


@dataclass(frozen=True)
class Generation:
    """One generation request (HTTP body or socket message)."""

    transcript: str
    voice_id: str | None  # None: the default voice
    output_format: OutputFormat
    speed: float  # the engine's speed factor
    model_id: str | None
    context_id: str | None = None
    continue_: bool = False
    flush: bool = False
    add_timestamps: bool = False
    max_buffer_delay_ms: int | None = None  # None: Cartesia's default


def _get(data: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    """`data[name]` if present and not null, checked against `kind` (bool is not a number)."""
    value = data.get(name)
    if value is None:
        return None
    wrong_bool = isinstance(value, bool) and bool not in (
        kind if isinstance(kind, tuple) else (kind,)
    )
    if wrong_bool or not isinstance(value, kind):
        raise invalid(
            f"Invalid type for '{name}': expected {what}, but got {json_type_name(value)}."
        )
    return value


def _required(data: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = _get(data, name, kind, what)
    if value is None:
        raise invalid(f"Missing required field '{name}'.", "missing_field")
    return value


def parse_output_format(value: Any, *, containers: tuple[str, ...] = CONTAINERS) -> OutputFormat:
    if not isinstance(value, dict):
        raise invalid(
            f"Invalid type for 'output_format': expected an object, but got "
            f"{json_type_name(value)}."
            if value is not None
            else "Missing required field 'output_format'.",
            "invalid_output_format" if value is not None else "missing_field",
        )
    container = _required(value, "container", str, "a string")
    if container not in containers:
        raise invalid(
            f"Invalid 'output_format.container' {quote(container)}: this endpoint takes "
            f"{', '.join(containers)}.",
            "invalid_output_format",
        )
    rate = _required(value, "sample_rate", int, "an integer")
    if not MIN_RATE_HZ <= rate <= MAX_RATE_HZ:
        raise invalid(
            f"Invalid 'output_format.sample_rate' {rate}: it must be between {MIN_RATE_HZ} and "
            f"{MAX_RATE_HZ} Hz.",
            "invalid_output_format",
        )
    if container == "mp3":
        bit_rate = _get(value, "bit_rate", int, "an integer") or 128000
        if bit_rate not in MP3_BIT_RATES_BPS:
            raise invalid(
                f"Invalid 'output_format.bit_rate' {bit_rate}: one of "
                f"{', '.join(map(str, MP3_BIT_RATES_BPS))}.",
                "invalid_output_format",
            )
        return OutputFormat("mp3", None, rate, bit_rate)
    encoding = _required(value, "encoding", str, "a string")
    if encoding not in RAW_ENCODINGS:
        raise invalid(
            f"Invalid 'output_format.encoding' {quote(encoding)}: Playhead writes "
            f"{', '.join(RAW_ENCODINGS)}.",
            "invalid_output_format",
        )
    return OutputFormat(container, encoding, rate)


def parse_voice(value: Any) -> str | None:
    """The voice id of `voice` (a string, or `{"mode": "id", "id": ...}`); None: default."""
    if value is None or isinstance(value, str):
        return value or None
    if not isinstance(value, dict):
        raise invalid(
            f"Invalid type for 'voice': expected an object, but got {json_type_name(value)}."
        )
    mode = value.get("mode", "id")
    if mode != "id":
        raise invalid(
            f"Voice mode {quote(str(mode))} is not supported: Playhead takes voices by id "
            "(mode 'id'); embeddings are not accepted.",
            "unsupported_voice_mode",
        )
    voice_id = value.get("id")
    if voice_id is not None and not isinstance(voice_id, str):
        raise invalid(
            f"Invalid type for 'voice.id': expected a string, but got {json_type_name(voice_id)}."
        )
    return voice_id or None


def is_cartesia_voice_id(voice_id: str) -> bool:
    """A Cartesia voice id (a UUID): one Playhead does not have means the default voice."""
    return bool(_UUID.match(voice_id))


def parse_speed(data: dict[str, Any]) -> float:
    """`generation_config.speed` (a factor), else `speed` (slow / normal / fast), else 1."""
    config = _get(data, "generation_config", dict, "an object") or {}
    factor = _get(config, "speed", (int, float), "a number")
    if factor is not None:
        low, high = GENERATION_SPEED_RANGE
        if not (math.isfinite(factor) and low <= factor <= high):
            raise invalid(
                f"Invalid 'generation_config.speed' {factor}: it must be between {low} and {high}."
            )
        return float(factor)
    word = _get(data, "speed", (str, int, float), "a string")
    if word is None:
        return 1.0
    if isinstance(word, str) and word in SPEED_WORDS:
        return SPEED_WORDS[word]
    raise invalid(
        f"Invalid 'speed' {quote(str(word))}: one of {', '.join(SPEED_WORDS)} "
        "(or generation_config.speed, a number)."
    )


def parse_generation(
    data: Any, *, socket: bool, containers: tuple[str, ...] = CONTAINERS
) -> Generation:
    """One generation request. `transcript` is required (a string; on the socket it may be
    empty: it closes or flushes a context); on the socket `context_id` is required too and
    only raw audio is sent."""
    if not isinstance(data, dict):
        raise invalid(f"A request must be a JSON object, but got {json_type_name(data)}.")
    transcript = _get(data, "transcript", str, "a string")
    if transcript is None:
        hint = ' ("" to close or flush a context)' if socket else ""
        raise invalid(f"Missing required field 'transcript'{hint}.", "missing_field")
    if has_nul(transcript):
        raise invalid("Invalid 'transcript': it contains a NUL character (U+0000).")
    context_id = _get(data, "context_id", str, "a string")
    if socket and not context_id:
        raise invalid("Missing required field 'context_id'.", "missing_field")
    return Generation(
        transcript=transcript,
        voice_id=parse_voice(data.get("voice")),
        output_format=parse_output_format(data.get("output_format"), containers=containers),
        speed=parse_speed(data),
        model_id=_get(data, "model_id", str, "a string"),
        context_id=context_id,
        continue_=bool(_get(data, "continue", bool, "a boolean")),
        flush=bool(_get(data, "flush", bool, "a boolean")),
        add_timestamps=bool(_get(data, "add_timestamps", bool, "a boolean")),
        max_buffer_delay_ms=_buffer_delay_ms(data),
    )


def _buffer_delay_ms(data: dict[str, Any]) -> int | None:
    delay_ms = _get(data, "max_buffer_delay_ms", int, "an integer")
    if delay_ms is not None and not 0 <= delay_ms <= MAX_BUFFER_DELAY_MS:
        raise invalid(
            f"Invalid 'max_buffer_delay_ms' {delay_ms}: between 0 and {MAX_BUFFER_DELAY_MS}."
        )
    return delay_ms


def check_model(model_id: str | None, accepted: tuple[str, ...]) -> None:
    """Every Cartesia model id (sonic*) and Playhead's own ids speak with Playhead's voice."""
    if model_id is None or model_id.startswith("sonic") or model_id in accepted:
        return
    raise CartesiaError(
        f"Model {quote(model_id)} not found: Playhead takes any sonic* model id "
        f"(and {', '.join(accepted)}).",
        error_code="model_not_found",
        status_code=404,
    )


def check_version(version: str | None) -> None:
    """`Cartesia-Version` (header or `cartesia_version` query): a date, when given."""
    if version is not None and not _VERSION.match(version):
        raise invalid(
            f"Invalid Cartesia-Version {quote(version)}: a date such as 2025-04-16.",
            "invalid_version",
        )

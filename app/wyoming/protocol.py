"""Wyoming events on the wire, read defensively, and the errors the server answers with.

An event is a JSON header line (`type`, optional `data`, `data_length`, `payload_length`),
then `data_length` bytes of JSON merged into `data`, then `payload_length` bytes of
payload. The wyoming package's own reader returns None (as if the peer had left) for
anything it cannot read and has no size limits; `read_event` reads the same framing with
limits and raises `FatalEventError`, whose text goes to the client as an `error` event
before the connection closes (the byte stream cannot be resynchronised after a bad
frame).

`EventError` is the base of every refusal: its `event()` is the Wyoming `error` event
(wyoming.error.Error: text and code). A request the server refuses (a bad voice, empty
text, admission) is answered with one and the connection is closed too, as the Wyoming
servers do: Home Assistant ignores `error` events and reads until the audio ends or the
connection closes, so an open connection would leave it waiting.
"""

from __future__ import annotations

import asyncio
from typing import Any

from wyoming.error import Error
from wyoming.event import Event

from app.client_json import ClientJsonError, load_client_json, quote
from app.errors import ApiError
from app.text_input import has_nul, words_apart

# A JSON string may spell each character as a 6-byte \uXXXX escape; the rest of `data`
# (a voice, a context) gets this much on top.
JSON_BYTES_PER_CHAR = 6
DATA_EXTRA_BYTES = 64 * 1024

# control characters other than tab, newline and carriage return (NUL is refused)


class EventError(Exception):
    """A refusal: send `event()` to the client (then the connection closes)."""

    def __init__(self, text: str, code: str) -> None:
        super().__init__(text)
        self.text = text
        self.code = code

    def event(self) -> Event:
        return Error(text=self.text, code=self.code).event()


class FatalEventError(EventError):
    """The byte stream cannot be read on (a bad frame, a timeout mid-event)."""


def api_error(exc: ApiError) -> EventError:
    """The Wyoming error of one of the HTTP API's errors (app/errors.py), keeping its text
    and code; a Retry-After becomes words when the text does not say when to retry."""
    text = exc.message
    retry_after = exc.headers.get("Retry-After")
    if retry_after is not None and "retry after" not in text.lower():
        text = f"{text} Retry after {retry_after} s."
    return EventError(text, exc.code or "server_error")


def max_data_bytes(max_text_chars: int) -> int:
    return JSON_BYTES_PER_CHAR * max_text_chars + DATA_EXTRA_BYTES


def _length(header: dict[str, Any], key: str) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FatalEventError(
            f"The event's {key} must be a non-negative integer, got {quote(str(value))}.",
            "invalid_event",
        )
    return value


def _json(raw: bytes, what: str) -> Any:
    try:
        return load_client_json(raw)
    except ClientJsonError as exc:
        raise FatalEventError(
            f"The event's {what} is not valid JSON: {exc.message}", exc.code
        ) from None


async def read_event(
    reader: asyncio.StreamReader,
    *,
    max_line_bytes: int,
    max_data_bytes: int,
    max_payload_bytes: int,
    first_byte_timeout_s: float,
) -> Event | None:
    """The next event; None when the client closed the connection (at an event boundary).
    The reader's own limit (its connection's) is `max_line_bytes` (wyoming.max_line_bytes).

    Raises TimeoutError when no event begins within `first_byte_timeout_s` (nothing is
    consumed: reading may go on), FatalEventError for a frame that cannot be read (its
    data or payload not there within the same time included)."""
    async with asyncio.timeout(first_byte_timeout_s):
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial.strip():
                return None  # closed between events
            raise FatalEventError(
                "The connection closed in the middle of an event header.", "invalid_event"
            ) from None
        except asyncio.LimitOverrunError:
            raise FatalEventError(
                f"An event header line is longer than {max_line_bytes} bytes "
                "(wyoming.max_line_bytes).",
                "event_too_large",
            ) from None
    if not line.strip():
        raise FatalEventError("An event header line is empty.", "invalid_event")
    header = _json(line, "header")
    if not isinstance(header, dict):
        raise FatalEventError("An event header must be a JSON object.", "invalid_event")
    event_type = header.get("type")
    if not isinstance(event_type, str) or not event_type:
        raise FatalEventError("An event header needs a string 'type'.", "invalid_event")
    data = header.get("data") or {}
    if not isinstance(data, dict):
        raise FatalEventError("An event's 'data' must be a JSON object.", "invalid_event")
    data_length = _length(header, "data_length")
    payload_length = _length(header, "payload_length")
    if data_length > max_data_bytes:
        raise FatalEventError(
            f"The event's data has {data_length} bytes; at most {max_data_bytes} are accepted.",
            "event_too_large",
        )
    if payload_length > max_payload_bytes:
        raise FatalEventError(
            f"The event's payload has {payload_length} bytes; at most {max_payload_bytes} are "
            "accepted (wyoming.max_payload_bytes; a TTS request has none).",
            "event_too_large",
        )
    try:
        async with asyncio.timeout(first_byte_timeout_s):
            raw = await reader.readexactly(data_length) if data_length else b""
            payload = await reader.readexactly(payload_length) if payload_length else None
    except asyncio.IncompleteReadError:
        raise FatalEventError(
            "The connection closed in the middle of an event's data or payload.", "invalid_event"
        ) from None
    except TimeoutError:
        raise FatalEventError(
            f"An event's data or payload did not arrive within {first_byte_timeout_s:g} s.",
            "invalid_event",
        ) from None
    if raw:
        more = _json(raw, "data")
        if not isinstance(more, dict):
            raise FatalEventError("An event's data must be a JSON object.", "invalid_event")
        data = {**data, **more}
    return Event(type=event_type, data=data, payload=payload)


def text_field(data: dict[str, Any], key: str = "text") -> str:
    """An event's text: a string without NUL; other control characters become spaces."""
    text = data.get(key)
    if not isinstance(text, str):
        raise EventError(f"The event needs a string '{key}'.", "invalid_value")
    if has_nul(text):
        raise EventError(
            f"The '{key}' contains a NUL character (U+0000), which is not text.", "invalid_value"
        )
    return words_apart(text)


def text_format_field(data: dict[str, Any]) -> None:
    """Only plain text is spoken: SSML (or any other format) is refused."""
    text_format = data.get("text_format")
    if text_format not in (None, "text"):
        raise EventError(
            f"The text_format {quote(str(text_format))} is not supported; send plain text.",
            "unsupported_text_format",
        )

"""What an ElevenLabs socket (app/elevenlabs/sockets.py) accepts and sends: the messages'
checks, the errors that refuse one (`Refused`), the close codes and the alignment.

Client messages (JSON): `{"text", "context_id"?, "flush"?, "voice_settings"?}` (text " "
opens a context; text "" is a keep-alive on the multi-context socket and the end of the
text on the single one; with `auto_mode=true` each text is a complete phrase, spoken
without waiting for what follows, a space after it if it has none), `{"context_id",
"flush": true}`, `{"context_id", "close_context": true}`, `{"context_id", "keep_alive":
true}`, `{"close_socket": true}`.
`close_context` right after a flush that carried no text (`{"flush": true}` or `{"text":
"", "flush": true}`, how pipecat and LiveKit end a turn) ends the context's text: the rest
of its audio comes, then `isFinal`. Any other `close_context` is an interruption: its audio
stops within the chunk being sent, the engine stream is freed, and `isFinal` follows.

Server messages: `{"audio": base64, "alignment", "normalizedAlignment", "contextId"}` then
`{"isFinal": true, "contextId"}` per context (the single socket then closes, 1000).
Alignment (`chars`, `charStartTimesMs`, `charDurationsMs`): with `sync_alignment=true`
(LiveKit) times count from the start of the context's audio; without it (pipecat, the
SDK) each message's times restart at zero where the previous message's characters ended,
so that a client summing the spans (pipecat) gets the audio's times back.

Errors: before the socket opens, a refusal is an HTTP answer in ElevenLabs' shape (401 key,
400 output_format, 404 voice, 503 not ready); once open, `{"error", "message", "code",
"contextId"?}`: a refused context (429: `too_many_concurrent_requests`, with
`retry_after_s`) or a bad message (not a JSON object; `text` missing or null where the
protocol needs it: in every message of the single socket, on the multi one unless it
flushes, closes or keeps alive; a flag or `voice_settings` of the wrong type;
`flush`/`close_context` naming a context not open: `context_not_found`) is answered at
once, and leaves the socket open (its context, if any, then gets
`isFinal`); on the single socket, and for an oversized message or inactivity, the socket
then closes (1008; 1009 for an oversized message, 1013 for capacity).
"""

from __future__ import annotations

import json
from typing import Any

from app.client_json import quote
from app.errors import ApiError, InvalidRequest
from pipeline.alignment import CharTiming

CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TOO_BIG, CLOSE_TRY_AGAIN = 1000, 1008, 1009, 1013
# the message flags: each is a boolean when present
FLAGS = ("flush", "close_context", "close_socket", "keep_alive", "try_trigger_generation")


class Refused(Exception):
    """Refuse a message: its error goes to the client (`close`: then the socket closes)."""

    def __init__(self, error: ApiError, context_id: str | None = None, close: bool = False):
        super().__init__(error.message)
        self.error, self.context_id, self.close = error, context_id, close


def ws_alignment(
    chars: list[CharTiming], base_ms: int | None, end_s: float | None = None
) -> tuple[dict[str, list[Any]] | None, int | None]:
    """A message's alignment and the next message's base: times from the start of the
    context's audio (base None), or from `base_ms`, where the previous message's last
    character ended. Restarting, a character ends no later than its message's audio
    (`end_s`), where the next message's characters start: none then starts before its
    base, and the running sum of the spans is the audio's clock."""
    if not chars:
        return None, base_ms
    starts = [round(c.start_s * 1000) for c in chars]
    ends = [round(c.end_s * 1000) for c in chars]
    if base_ms is not None and end_s is not None:
        end_ms = round(end_s * 1000)
        ends = [min(end, max(s, end_ms)) for s, end in zip(starts, ends, strict=True)]
    durations = [end - start for start, end in zip(starts, ends, strict=True)]
    if base_ms is not None:
        starts = [max(0, s - base_ms) for s in starts]
        base_ms += starts[-1] + durations[-1]
    alignment = {"chars": [c.char for c in chars], "charStartTimesMs": starts}
    return {**alignment, "charDurationsMs": durations}, base_ms


def parse(message: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """A received socket message's JSON object; `Refused` for one over `max_bytes` (the
    socket then closes) or one that is not a JSON object."""
    text = message.get("text")
    size = len(text.encode()) if text is not None else len(message.get("bytes") or b"")
    if size > max_bytes:
        error = f"The message has {size} bytes; at most {max_bytes} are accepted."
        raise Refused(InvalidRequest(error, code="message_too_large"), close=True)
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        error = InvalidRequest("Each message must be a JSON object.", code="invalid_message")
        raise Refused(error)
    return data


def text_required(multi: bool) -> InvalidRequest:
    if multi:
        message = (
            'text is required (a string; "" keeps the context alive) unless the message '
            "flushes (flush), closes (close_context, close_socket) or keeps alive (keep_alive) "
            "a context."
        )
    else:
        message = (
            'text is required in every message (a string: " " first, then the text, "" '
            "to end), unless the message is close_socket."
        )
    return InvalidRequest(message, param="text", code="invalid_message")


def no_context(context_id: str, action: str) -> InvalidRequest:
    return InvalidRequest(
        f"{action}: no context {quote(context_id)} is open on this socket (it was never "
        "opened, or it ended with isFinal).",
        param="context_id",
        code="context_not_found",
    )

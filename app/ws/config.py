"""The `websocket:` section of the settings: the limits of every WebSocket, Playhead's own
(WS /v1/audio/speech/stream) and the ElevenLabs and Cartesia sockets (an utterance or a
context alike)."""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.validation import check_int, check_int_in, check_number_in, check_positive


@dataclass(frozen=True)
class WebSocketConfig:
    # The client's first message (session.config) must arrive within this many seconds.
    first_message_timeout_s: float = 10.0
    # No client message and no audio sent for this long (nothing being said): closed (1008).
    idle_timeout_s: float = 120.0
    # A larger client message gets an error event and close code 1009.
    max_message_bytes: int = 65536
    # Text of one utterance (a context's on the ElevenLabs and Cartesia sockets), summed over
    # its messages; more: an error (Playhead's socket then closes, 1008).
    max_text_chars: int = 16384
    # Contexts open at once on one ElevenLabs multi-context socket (ElevenLabs allows 5);
    # one more: an error, `max_active_contexts_exceeded`.
    max_contexts: int = 5

    def __post_init__(self) -> None:
        check_positive("first_message_timeout_s", self.first_message_timeout_s)
        check_number_in("first_message_timeout_s", self.first_message_timeout_s, (0, 3600), "s")
        check_positive("idle_timeout_s", self.idle_timeout_s)
        check_number_in("idle_timeout_s", self.idle_timeout_s, (0, 86400), "s")
        check_int_in("max_message_bytes", self.max_message_bytes, (1024, 16 * 1024 * 1024))
        check_int("max_text_chars", self.max_text_chars, 1)
        check_int_in("max_contexts", self.max_contexts, (1, 1024))

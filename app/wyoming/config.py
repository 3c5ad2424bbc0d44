"""The `wyoming:` section of the settings: the Wyoming TCP server (docs/wyoming.md)."""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.validation import (
    check_bool,
    check_int,
    check_int_in,
    check_number_in,
    check_positive,
    check_text,
)


@dataclass(frozen=True)
class WyomingConfig:
    # Serve the Wyoming protocol (Home Assistant's) beside HTTP, over the same engine.
    # `playhead serve --wyoming-port N` turns it on.
    enabled: bool = False
    # Listen address: the protocol has no authentication (server.api_key does not cover
    # it), so expose it only to a trusted network.
    host: str = "127.0.0.1"
    port: int = 10200
    # Text of one synthesis (a `synthesize`, or a streamed request's chunks together);
    # more: an error event, and the connection is closed.
    max_text_chars: int = 16384
    # No event from the client and nothing being said for this long: an error event, and
    # the connection is closed.
    idle_timeout_s: float = 120.0
    # The longest event header line (its JSON); longer: an error event, closed.
    max_line_bytes: int = 65536
    # The largest payload an event may carry (a TTS request has none: a smaller one is
    # skipped); larger: an error event, closed.
    max_payload_bytes: int = 1048576

    def __post_init__(self) -> None:
        check_bool("enabled", self.enabled)
        check_text("host", self.host)
        check_int_in("port", self.port, (1, 65535))
        check_int("max_text_chars", self.max_text_chars, 1)
        check_positive("idle_timeout_s", self.idle_timeout_s)
        check_number_in("idle_timeout_s", self.idle_timeout_s, (0, 86400), "s")
        check_int_in("max_line_bytes", self.max_line_bytes, (1024, 16 * 1024 * 1024))
        check_int_in("max_payload_bytes", self.max_payload_bytes, (0, 256 * 1024 * 1024))

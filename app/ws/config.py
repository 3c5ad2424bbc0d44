"""The `websocket:` section of the settings: limits of WS /v1/audio/speech/stream."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class WebSocketConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # The client's first message (session.config) must arrive within this many seconds.
    first_message_timeout_s: float = Field(10.0, gt=0, le=3600)
    # No client message and no audio sent for this long (nothing being said): closed (1008).
    idle_timeout_s: float = Field(120.0, gt=0, le=86400)
    # A larger client message gets an error event and close code 1009.
    max_message_bytes: int = Field(65536, ge=1024, le=16 * 1024 * 1024)
    # Text of one utterance, summed over its input.text messages; more: error and close 1008.
    max_text_chars: int = Field(16384, ge=1)

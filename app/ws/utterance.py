"""What a WebSocket session keeps of an utterance and of its voice (app/ws/session.py)."""

from __future__ import annotations

from dataclasses import dataclass

from app.audio import StreamEncoder
from pipeline import Stream
from pipeline.normalize import StreamNormalizer


@dataclass(eq=False)
class Utterance:
    """One utterance: an engine stream and its encoder."""

    index: int
    stream: Stream
    encoder: StreamEncoder
    text_chars: int
    # text as written -> spoken words, piece by piece (None: normalisation off)
    normalizer: StreamNormalizer | None = None
    alignment: bool = False  # send alignment events (session.config)
    text_closed: bool = False
    cancelled: bool = False
    sent_samples: int = 0  # at the encoder's output rate
    chars_sent: int = 0  # alignment cursors: characters and words sent in events
    words_sent: int = 0

    @property
    def audio_ms(self) -> float:
        return 1000.0 * self.sent_samples / self.encoder.output_rate_hz


@dataclass
class SessionVoice:
    voice_id: str
    sample_rate_hz: int
    response_format: str
    speed: float
    alignment: bool = False  # send alignment events

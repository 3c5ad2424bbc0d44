"""What a WebSocket session keeps of an utterance and of its voice (app/ws/session.py)."""

from __future__ import annotations

from dataclasses import dataclass

from app.audio import StreamEncoder, open_encoder
from app.settings import Settings
from pipeline import Engine, Stream
from pipeline.admission import Reservation
from pipeline.normalize import StreamNormalizer, normalizer_for


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


def open_utterance(
    engine: Engine,
    settings: Settings,
    voice: SessionVoice,
    index: int,
    text: str,
    *,
    reservation: Reservation,
) -> Utterance:
    """The utterance's encoder, normaliser and engine stream (its first text, more to
    come), submitted with its admitted reservation; Rejected / NotReady propagate."""
    resolved = engine.resolve_voice(voice.voice_id)
    encoder = open_encoder(
        voice.response_format,
        resolved.sample_rate_hz,
        voice.sample_rate_hz,
        encoding=settings.encoding,
    )
    rules = normalizer_for(resolved.language, settings.normalize)
    normalizer = StreamNormalizer(rules) if rules is not None else None
    spoken = normalizer.push(text) if normalizer is not None else text
    try:
        stream = engine.submit(
            spoken, voice=voice.voice_id, speed=voice.speed, final=False, reservation=reservation
        )
    except BaseException:
        encoder.close()
        raise
    return Utterance(
        index,
        stream,
        encoder,
        text_chars=len(text),
        normalizer=normalizer,
        alignment=voice.alignment,
    )

"""One ElevenLabs speech (an HTTP request, or a socket's context): one engine stream, its
encoder and its text, read back as `Piece`s of audio with the characters heard in them.

`admit` is the one place these protocols ask the engine for a slot (`Engine.reserve`, then
a start slot, `Reservation.wait_start`): refused, it raises Rejected (429 / an error
message), or NotReady while the engine stops.

A `Speech` takes text whole (`start(text, final=True)`) or live (`start(text,
final=False)`, then `append`, then `finish`): live text goes through a StreamNormalizer
(numbers, dates... spoken; pipeline/normalize) and the engine's segmenter, so its first
complete sentence speaks while more text arrives. `pieces()` yields the encoded audio as
the engine makes it and, with each piece, the characters whose start lies in it, of the
client's text and of the spoken (normalised) text (`stream.alignment`'s `chars` and
`spoken`, pipeline/alignment.py; empty lists where the backend gives none).
`interrupt()` stops the audio within the chunk being sent and frees the engine stream;
`close()` frees everything (idempotent) and is called by whoever owns the speech.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

import numpy as np

from app.audio import StreamEncoder
from app.elevenlabs.formats import OutputFormat
from app.settings import Settings
from app.streaming import EncoderThreads
from pipeline import Engine, PipelineError, Stream, StreamState, Voice
from pipeline.alignment import CharTiming
from pipeline.engine import Reservation
from pipeline.normalize import StreamNormalizer, normalizer_for


@dataclass(frozen=True, slots=True)
class Piece:
    """Encoded audio (maybe b"") and the characters that start in it (`chars`: the client's
    text's, `spoken`: the normalised text's); `end_s`: the audio so far, this piece's
    included; `last`: the piece that ends the speech (it always comes when the speech ends
    whole, with whatever the encoder and the alignment had left)."""

    audio: bytes
    chars: list[CharTiming]
    end_s: float
    last: bool = False
    spoken: list[CharTiming] = field(default_factory=list)


@dataclass(eq=False)
class Speech:
    engine: Engine
    voice: Voice
    output: OutputFormat
    settings: Settings
    threads: EncoderThreads
    speed: float = 1.0
    normalize: bool = True  # apply_text_normalization != "off"
    stream: Stream | None = None
    encoder: StreamEncoder | None = None
    text_chars: int = 0  # characters taken, as sent
    interrupted: bool = False
    failure: str | None = None  # why the audio ended early (the engine failed or stopped)
    _text_closed: bool = False
    _normalizer: StreamNormalizer | None = None
    _closed: bool = False
    # one encoder call at a time, close included (a chunk may be encoding in a thread
    # when the reading task is cancelled)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(
        self, text: str, *, final: bool, reservation: Reservation, normalized: bool = False
    ) -> None:
        """Open the encoder and submit the engine stream with its first text (`normalized`:
        the caller normalised it already). Raises ValueError for an output the encoder
        refuses, Rejected / NotReady from submit."""
        encoder = self.output.open(self.voice.sample_rate_hz, self.settings.encoding)
        rules = normalizer_for(self.voice.language, self.settings.normalize)
        if self.normalize and rules is not None:
            self._normalizer = StreamNormalizer(rules)
        pieces = [text] if normalized else self._spoken(text, final=final, flush=False)
        try:
            self.stream = self.engine.submit(
                pieces[0] if pieces else "",
                voice=self.voice.id,
                speed=self.speed,
                final=final and len(pieces) <= 1,
                reservation=reservation,
            )
        except BaseException:
            encoder.close()
            raise
        self.encoder = encoder
        self.text_chars = len(text)
        self._text_closed = final
        self._to_engine(pieces[1:], final=final)

    def _spoken(self, text: str, *, final: bool, flush: bool) -> list[str]:
        """The normalised pieces of `text`, each given to the engine as it is (a piece may
        be a SpokenText that says which characters of the client's text it stands for:
        joining pieces would lose that)."""
        normalizer = self._normalizer
        if normalizer is None:
            return [text] if text else []
        pieces = [normalizer.push(text)]
        if final or flush:
            pieces.append(normalizer.flush())
        # a piece that says nothing still carries its source (the alignment's text)
        return [piece for piece in pieces if piece or getattr(piece, "source", "")]

    def _to_engine(self, pieces: list[str], *, final: bool, flush: bool = False) -> None:
        assert self.stream is not None
        if (final or flush) and not pieces:
            pieces = [""]
        # ValueError: the stream ended under us (failed, the engine stopped): pieces() says
        with contextlib.suppress(ValueError):
            for i, piece in enumerate(pieces):
                last = i == len(pieces) - 1
                self.engine.append_text(
                    self.stream.id, piece, final=final and last, flush=flush and last
                )

    def append(self, text: str, *, final: bool = False, flush: bool = False) -> None:
        """More text (`final`: the last); `flush` speaks the text so far now, an unfinished
        sentence too (the words the normaliser holds back, the engine's segment cut)."""
        if self.stream is None or self._text_closed or self.interrupted:
            return
        pieces = self._spoken(text, final=final, flush=flush)
        self.text_chars += len(text)
        self._text_closed = final
        self._to_engine(pieces, final=final, flush=flush)

    def finish(self) -> None:
        """No more text: the rest is spoken, then pieces() ends."""
        self.append("", final=True)

    def interrupt(self) -> None:
        """Stop now: no more audio, the engine stream freed (its chunk in flight dropped)."""
        self.interrupted = True
        if self.stream is not None:
            self.engine.cancel(self.stream.id)

    def _encode_locked(self, encoder: StreamEncoder, pcm: np.ndarray | None) -> bytes:
        with self._lock:
            if self._closed:
                return b""
            return encoder.finish() if pcm is None else encoder.encode(pcm)

    async def _encode(self, encoder: StreamEncoder, pcm: np.ndarray) -> bytes:
        """Short chunks (and pcm, ulaw) on the loop, long mp3/opus ones in the encoders'
        thread pool, as app/streaming.py does."""
        inline_max = self.settings.encoding.inline_encode_max_s * self.voice.sample_rate_hz
        if encoder.raw or pcm.size <= inline_max:
            return self._encode_locked(encoder, pcm)
        return await self.threads.run(self._encode_locked, encoder, pcm)

    async def pieces(self) -> AsyncIterator[Piece]:
        """The audio and its characters, as the engine makes them; ends early (with
        `failure` set) if the engine fails or stops, and at once after `interrupt()`."""
        stream, encoder = self.stream, self.encoder
        assert stream is not None and encoder is not None
        alignment = stream.alignment
        cursor = spoken_cursor = 0
        samples = 0
        try:
            async with aclosing(stream.chunks()) as chunks:
                async for pcm in chunks:
                    if self.interrupted:
                        return
                    data = await self._encode(encoder, pcm)
                    if self.interrupted:
                        return
                    samples += pcm.size
                    end_s = samples / stream.sample_rate_hz
                    chars, cursor = alignment.chars_before(end_s, cursor)
                    spoken, spoken_cursor = alignment.spoken_before(end_s, spoken_cursor)
                    if data or chars or spoken:
                        yield Piece(data, chars, end_s, spoken=spoken)
        except PipelineError as exc:  # StreamFailed, or StreamCancelled (stopped, interrupted)
            if not self.interrupted:
                self.failure = str(exc)
            return
        if self.interrupted:
            return
        if stream.state is StreamState.CANCELLED:
            self.failure = "the server is shutting down"
            return
        tail = self._encode_locked(encoder, None)
        end_s = samples / stream.sample_rate_hz
        rest = list(alignment.chars[cursor:])
        yield Piece(tail, rest, end_s, True, list(alignment.spoken[spoken_cursor:]))

    def close(self) -> None:
        """Free the engine stream (a no-op once it ended) and the encoder (waiting for a
        chunk being encoded in a thread: a few ms at most)."""
        if self.stream is not None:
            self.engine.cancel(self.stream.id)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.encoder is not None:
                self.encoder.close()

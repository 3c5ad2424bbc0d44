"""One Wyoming connection: `describe`, one-shot and streamed synthesis (docs/wyoming.md).

Two tasks per connection; whichever ends first ends the other, and every stream of the
connection is cancelled (engine.cancel frees the engine's state):

- the receiver reads the client's events and acts at once: `describe` -> `info`;
  `synthesize` queues a synthesis whose text is complete; `synthesize-start` queues a
  streamed synthesis, each `synthesize-chunk` adds text to it (normalised piece by piece:
  pipeline/normalize's StreamNormalizer releases text at sentence ends) and
  `synthesize-stop` closes its text. The `synthesize` that Home Assistant sends inside a
  streamed request (the whole text once more, for servers without streaming) is not
  spoken. Other events are ignored, as the protocol asks of servers;
- the sender serves the syntheses in order: it waits, for a streamed one, until its
  first sentence is complete, passes admission (`admit`, as POST /v1/audio/speech does),
  submits to the engine (final=False while text is still coming: later text goes to
  engine.append_text, so the talker starts on the first sentence while the rest is being
  written) and sends `audio-start`, `audio-chunk`s (16-bit mono PCM at the voice's rate),
  `audio-stop`, and for a streamed request `synthesize-stopped`.

A refusal (bad input, admission, a failed stream) is an `error` event, after which the
connection closes (app/wyoming/protocol.py says why). A client that leaves (its end of
the connection closed, or reset) cancels its streams at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from contextlib import aclosing
from dataclasses import dataclass, field

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import Event, async_write_event
from wyoming.info import Describe, SelectProgram
from wyoming.ping import Ping, Pong
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)

from app.audio import open_encoder
from app.client_json import quote
from app.errors import ApiError, pipeline_api_error, shutting_down
from app.state import AppState
from app.text_input import normalized
from app.wyoming.protocol import (
    EventError,
    api_error,
    max_data_bytes,
    read_event,
    text_field,
    text_format_field,
)
from app.wyoming.voices import PROGRAM_NAME, VoiceRequest, build_info, select_voice
from pipeline import Engine, PipelineError, Rejected, Stream, StreamState, Voice
from pipeline.engine import Reservation
from pipeline.normalize import StreamNormalizer, normalizer_for, speakable

logger = logging.getLogger("playhead.wyoming")

SAMPLE_WIDTH_BYTES = 2  # audio-chunk: 16-bit signed little-endian
CHANNELS = 1
# After an error event: how long the client may go on sending before the connection is
# closed (its unread data would make the close a reset, which can drop the error event).
CLOSE_LINGER_S = 1.0


async def admit(state: AppState, voice: str | None = None) -> tuple[Engine, Reservation]:
    """Admission as every protocol has it (docs/admission.md): a slot now or a place in the
    one fair queue (Rejected, NotReady, or the 503 of a loading or draining server), then
    the wait in that queue. The caller submits with the reservation, then releases it (a
    no-op once used)."""
    engine = state.require_engine()
    started_s = time.perf_counter()
    try:
        reservation = engine.reserve(voice)
    except Rejected:
        state.metrics.rejection_s.observe(time.perf_counter() - started_s)
        raise
    try:
        await reservation.wait_start()
    except BaseException:
        reservation.release()
        raise
    return engine, reservation


@dataclass(eq=False)
class Synthesis:
    """One request's text and, once submitted, its engine stream."""

    streamed: bool
    voice: Voice
    # text not yet in the engine: a one-shot's text as written; a streamed one's
    # normalised pieces, until the submit (then its text goes to engine.append_text)
    text: list[str]
    normalizer: StreamNormalizer | None = None  # streamed: text as written -> spoken
    text_chars: int = 0  # as written
    closed: bool = False  # all its text is in
    engine: Engine | None = None
    stream: Stream | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # text came, or closed

    @property
    def kind(self) -> str:
        return "streamed" if self.streamed else "synthesize"


class Session:
    """The state of one connection; `run()` serves it until it closes."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: AppState
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._state = state
        self._settings = state.settings
        self._config = state.settings.wyoming
        self._queue: deque[Synthesis] = deque()  # for the sender, in order; [0] is sending
        self._queued = asyncio.Event()
        self._open: Synthesis | None = None  # the streamed synthesis taking text
        self._tasks: tuple[asyncio.Task[None], ...] = ()
        self._stopped = False
        self._last_audio_s = time.monotonic()  # when audio was last written

    def stop(self) -> None:
        """End the session (the server shuts down): `run` cancels its streams, closes the
        connection and returns."""
        self._stopped = True
        for task in self._tasks:
            task.cancel()

    async def run(self) -> None:
        """Serve the connection until it closes; every stream is freed on the way out."""
        refusal: EventError | None = None
        try:
            receiver = asyncio.create_task(self._receive_loop(), name="playhead-wyoming-receive")
            sender = asyncio.create_task(self._send_loop(), name="playhead-wyoming-send")
            self._tasks = (receiver, sender)
            if self._stopped:
                self.stop()
            try:
                done, _ = await asyncio.wait(
                    (receiver, sender), return_when=asyncio.FIRST_COMPLETED
                )
                refusal = _refusal(done)
                if self._stopped and self._queue:  # the server stops under a synthesis
                    refusal = api_error(shutting_down())
            finally:
                for task in (receiver, sender):
                    task.cancel()
                await asyncio.gather(receiver, sender, return_exceptions=True)
                for synthesis in self._queue:
                    self._cancel(synthesis)
                self._queue.clear()
            if refusal is not None:
                logger.info("wyoming: refused (%s): %s", refusal.code, refusal.text)
                await self._say_and_linger(refusal)
        finally:
            await self._close()

    async def _write(self, event: Event) -> None:
        try:
            await async_write_event(event, self._writer)
        except RuntimeError as exc:
            # uvloop's transport refuses a write once the client closed it: the client left
            if self._writer.transport.is_closing():
                raise ConnectionResetError("the client closed the connection") from exc
            raise

    async def _say_and_linger(self, refusal: EventError) -> None:
        """Send the error, then read what the client still sends for a moment (closing on
        unread data resets the connection, which can drop the error before it is read)."""
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(CLOSE_LINGER_S):  # a client that reads nothing
                await self._write(refusal.event())
            if self._writer.can_write_eof():
                self._writer.write_eof()
            async with asyncio.timeout(CLOSE_LINGER_S):
                while await self._reader.read(65536):
                    pass

    async def _close(self) -> None:
        writer = self._writer
        writer.close()
        try:
            async with asyncio.timeout(CLOSE_LINGER_S):
                await writer.wait_closed()
        except (OSError, TimeoutError):
            writer.transport.abort()  # a client that reads nothing keeps nothing open

    # Receiving.

    async def _receive_loop(self) -> None:
        """Returns when the client closed its end; raises EventError to refuse."""
        config = self._config
        limit = max_data_bytes(config.max_text_chars)
        while True:
            try:
                event = await read_event(
                    self._reader,
                    max_line_bytes=config.max_line_bytes,
                    max_data_bytes=limit,
                    max_payload_bytes=config.max_payload_bytes,
                    first_byte_timeout_s=config.idle_timeout_s,
                )
            except TimeoutError:
                audio_s_ago = time.monotonic() - self._last_audio_s
                if any(s.closed for s in self._queue) or audio_s_ago < config.idle_timeout_s:
                    continue  # something is still being said
                raise EventError(
                    f"No event and nothing being said for {config.idle_timeout_s:g} s: "
                    "the connection is closed.",
                    "idle_timeout",
                ) from None
            if event is None:
                return
            try:
                await self._handle(event)
            except ApiError as exc:
                raise api_error(exc) from None

    async def _handle(self, event: Event) -> None:
        kind, data = event.type, event.data
        if Describe.is_type(kind):
            engine = self._state.engine  # still listed while a shutdown drains
            if engine is None:
                raise self._state.not_ready_error()
            await self._write(build_info(engine.backend).event())
        elif Synthesize.is_type(kind):
            if self._open is not None:
                # Home Assistant's copy of a streamed request's text: said already
                logger.debug("wyoming: the synthesize inside a streamed request is not spoken")
                return
            self._enqueue(self._one_shot(data))
        elif SynthesizeStart.is_type(kind):
            self._start(data)
        elif SynthesizeChunk.is_type(kind):
            self._chunk(data)
        elif SynthesizeStop.is_type(kind):
            self._stop()
        elif Ping.is_type(kind):
            text = data.get("text")
            await self._write(Pong(text=text if isinstance(text, str) else None).event())
        elif SelectProgram.is_type(kind):
            name = data.get("name")
            if name != PROGRAM_NAME:
                raise EventError(
                    f"Unknown program {quote(str(name))}; this server has one: "
                    f"{PROGRAM_NAME!r} (tts).",
                    "program_not_found",
                )
        else:
            logger.debug("wyoming: ignored an event of type %s", quote(kind))

    def _voice(self, data: dict[str, object]) -> Voice:
        return select_voice(self._state.require_engine(), VoiceRequest.parse(data))

    def _check_length(self, chars: int) -> None:
        limit = self._config.max_text_chars
        if chars > limit:
            raise EventError(
                f"The text has {chars} characters; at most {limit} are accepted "
                "(wyoming.max_text_chars).",
                "text_too_long",
            )

    def _one_shot(self, data: dict[str, object]) -> Synthesis:
        text_format_field(data)
        text = text_field(data).strip()
        if not text:
            raise EventError("The text is empty: there is nothing to say.", "empty_text")
        self._check_length(len(text))
        voice = self._voice(data)
        return Synthesis(False, voice, [text], text_chars=len(text), closed=True)

    def _start(self, data: dict[str, object]) -> None:
        if self._open is not None:
            raise EventError(
                "A streamed synthesis is open already: send synthesize-stop first.",
                "synthesis_open",
            )
        text_format_field(data)
        voice = self._voice(data)
        rules = normalizer_for(voice.language, self._settings.normalize)
        normalizer = StreamNormalizer(rules) if rules is not None else None
        self._open = Synthesis(True, voice, [], normalizer=normalizer)
        self._enqueue(self._open)

    def _chunk(self, data: dict[str, object]) -> None:
        synthesis = self._open
        if synthesis is None:
            raise EventError("synthesize-chunk without synthesize-start.", "no_synthesis")
        text = text_field(data)
        synthesis.text_chars += len(text)
        self._check_length(synthesis.text_chars)
        normalizer = synthesis.normalizer
        self._add_text(synthesis, normalizer.push(text) if normalizer else text, final=False)

    def _stop(self) -> None:
        synthesis = self._open
        if synthesis is None:
            raise EventError("synthesize-stop without synthesize-start.", "no_synthesis")
        self._open = None
        normalizer = synthesis.normalizer
        synthesis.closed = True
        self._add_text(synthesis, normalizer.flush() if normalizer else "", final=True)

    def _add_text(self, synthesis: Synthesis, text: str, *, final: bool) -> None:
        stream, engine = synthesis.stream, synthesis.engine
        if stream is None or engine is None:  # not submitted yet: the sender takes it
            if text:
                synthesis.text.append(text)
            synthesis.changed.set()
            return
        try:
            engine.append_text(stream.id, text, final=final)
        except ValueError:
            # the stream ended under us (failed, or the engine stopped): the sender says so
            logger.debug("wyoming: stream %s takes no more text", stream.id)

    def _enqueue(self, synthesis: Synthesis) -> None:
        self._queue.append(synthesis)
        self._queued.set()

    # Sending.

    async def _send_loop(self) -> None:
        """Serves the syntheses in order; raises EventError to refuse."""
        while True:
            while not self._queue:
                self._queued.clear()
                await self._queued.wait()
            synthesis = self._queue[0]
            try:
                await self._speak(synthesis)
            finally:
                self._cancel(synthesis)  # a no-op once its stream finished
                self._queue.popleft()

    async def _speak(self, synthesis: Synthesis) -> None:
        if synthesis.streamed:
            # wait for a first complete sentence (or the end of the text)
            while not synthesis.closed and not speakable("".join(synthesis.text)):
                synthesis.changed.clear()
                await synthesis.changed.wait()
        else:
            synthesis.text = [await self._normalize(synthesis.text[0], synthesis.voice)]
        if not speakable("".join(synthesis.text)) and synthesis.closed:
            raise EventError(
                "Nothing speakable is left after text normalization (the text has no words "
                "or numbers, only punctuation, symbols or emoji).",
                "nothing_to_speak",
            )
        try:
            engine, reservation = await admit(self._state, synthesis.voice.id)
            try:
                # text that came while admission waited goes in too; no await from here
                # to the end of the submit, so the receiver sees the stream or the list
                text = "".join(synthesis.text)
                synthesis.text.clear()
                stream = engine.submit(
                    text, voice=synthesis.voice.id, final=synthesis.closed, reservation=reservation
                )
            finally:
                reservation.release()  # a no-op once submit used it
        except PipelineError as exc:
            raise api_error(pipeline_api_error(exc)) from None
        synthesis.engine, synthesis.stream = engine, stream
        await self._send_audio(synthesis, stream)

    async def _normalize(self, text: str, voice: Voice) -> str:
        return await normalized(text, voice.language, self._settings.normalize)

    async def _send_audio(self, synthesis: Synthesis, stream: Stream) -> None:
        encoder = open_encoder(
            "pcm", stream.sample_rate_hz, stream.sample_rate_hz, encoding=self._settings.encoding
        )
        rate_hz = encoder.output_rate_hz
        audio = {"rate": rate_hz, "width": SAMPLE_WIDTH_BYTES, "channels": CHANNELS}
        started = False
        sent_samples = 0

        async def send(data: bytes) -> None:
            nonlocal started, sent_samples
            if not started:
                started = True
                await self._write_audio(AudioStart(**audio, timestamp=0).event())
            if data:
                timestamp_ms = sent_samples * 1000 // rate_hz
                chunk = AudioChunk(**audio, audio=data, timestamp=timestamp_ms)
                await self._write_audio(chunk.event())
                sent_samples += len(data) // SAMPLE_WIDTH_BYTES

        try:
            async with aclosing(stream.chunks()) as chunks:
                async for pcm in chunks:
                    await send(encoder.encode(pcm))
            await send(encoder.finish())
        except PipelineError as exc:
            logger.error("wyoming: stream %s failed: %s", stream.id, exc)
            raise api_error(pipeline_api_error(exc)) from None
        finally:
            encoder.close()
        if stream.state is StreamState.CANCELLED:  # the engine stopped under it
            raise api_error(shutting_down())
        await self._write(AudioStop(timestamp=sent_samples * 1000 // rate_hz).event())
        if synthesis.streamed:
            await self._write(SynthesizeStopped().event())
        ttfa_s = stream.stats.ttfa_s
        logger.info(
            "wyoming %s: stream %s, voice %s, %d chars, %.2f s of audio, first audio %s",
            synthesis.kind,
            stream.id,
            synthesis.voice.id,
            synthesis.text_chars,
            sent_samples / rate_hz,
            f"{ttfa_s * 1000:.0f} ms" if ttfa_s is not None else "none",
        )

    async def _write_audio(self, event: Event) -> None:
        """Write, unless the client has taken nothing for wyoming.idle_timeout_s (a client
        that stopped reading would hold its engine stream for good)."""
        timeout_s = self._config.idle_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                await self._write(event)
            self._last_audio_s = time.monotonic()
        except TimeoutError:
            raise EventError(
                f"The client read no audio for {timeout_s:g} s: the connection is closed.",
                "idle_timeout",
            ) from None

    def _cancel(self, synthesis: Synthesis) -> None:
        if synthesis.stream is not None and synthesis.engine is not None:
            synthesis.engine.cancel(synthesis.stream.id)  # a no-op once it finished


def _refusal(done: set[asyncio.Task[None]]) -> EventError | None:
    """What to tell the client, from the task(s) that ended: an EventError's own event;
    nothing when the client left (its end closed, or the connection reset); an internal
    error for anything else."""
    errors = [task.exception() for task in done if not task.cancelled()]
    for exc in errors:
        if isinstance(exc, EventError):
            return exc
    for exc in errors:
        if exc is not None and not isinstance(exc, OSError):
            logger.error("wyoming: the connection failed", exc_info=exc)
            return EventError(
                "The server had an error while processing your event.", "internal_error"
            )
    return None

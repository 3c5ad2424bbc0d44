"""One WebSocket session: live text in, audio out, acks and barge-in (docs/websocket.md).

Two tasks per socket:

- the receiver (the route's own task) reads client messages and acts at once: the first
  input.text of an utterance submits an engine stream with final=False, later ones go to
  `engine.append_text` (the engine's Segmenter releases each fragment as it completes, so
  the talker starts on the first one while text still arrives), input.done closes the
  text, playback.position goes to `engine.ack_playback`, cancel goes to `engine.cancel`.
  While a new utterance waits in admission's queue it reads on through the socket's
  ClientWatch (app/disconnect.py): what comes is handled after the wait, in order, and a
  client that leaves gives its place back at once;
- the sender sends the utterances' audio in order: audio.start, binary frames (pcm or
  wav, through app/audio.py's encoder), audio.done.

One utterance is one engine stream, so its sentences share one playback horizon. An
utterance started while the previous one still plays is submitted at once (its talker
and vocoder work is not held back); its audio waits in its engine stream until the
previous utterance's audio has been sent, since the socket carries one audio stream.

Cancel drops the text, frames and audio of every utterance in progress (engine.cancel
frees the engine's state): the sender stops within the chunk it is sending and answers
audio.done with cancelled: true for each. A socket that closes or drops cancels them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import deque
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from app.disconnect import ClientWatch
from app.errors import ApiError
from app.routes import resolve_voice
from app.settings import Settings
from app.text_input import has_nul, words_apart
from app.ws.protocol import (
    CLOSE_GOING_AWAY,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_SERVER_ERROR,
    CLOSE_TOO_BIG,
    Cancel,
    InputDone,
    InputText,
    PlaybackPosition,
    ProtocolError,
    SessionClose,
    SessionConfig,
    alignment_event,
    at_capacity_error,
    error_event,
    not_running_error,
    parse_message,
)
from app.ws.utterance import SessionVoice, Utterance, open_utterance
from pipeline import Engine, NotReady, PipelineError, Rejected, StreamState
from pipeline.admission import wait_admitted

logger = logging.getLogger("playhead.ws")

# what the session reads ahead of its handling while an utterance waits in admission's
# queue (at least one message of websocket.max_message_bytes); then it stops reading
READ_AHEAD_BYTES = 1 << 20


class SessionEnded(Exception):
    """Close the socket with this code (after the error event, if any, was sent)."""

    def __init__(self, close_code: int) -> None:
        super().__init__(close_code)
        self.close_code = close_code


@dataclass
class Session:
    """The state of one socket; `run()` serves it until it closes."""

    websocket: WebSocket
    engine: Engine
    settings: Settings
    voice: SessionVoice | None = None
    next_index: int = 0
    current: Utterance | None = None  # the utterance taking text now
    rejected_open: bool = False  # the utterance taking text was refused: drop its text
    in_flight: list[Utterance] = field(default_factory=list)  # not yet audio.done
    _queue: deque[Utterance] = field(default_factory=deque)  # for the sender, in order
    _queued: asyncio.Event = field(default_factory=asyncio.Event)
    _drained: asyncio.Event = field(default_factory=asyncio.Event)  # the queue is empty
    _sending: Utterance | None = None
    _send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _last_audio_s: float = field(default_factory=time.monotonic)  # the last audio sent
    # the socket's receive channel (app/disconnect.py): the one reader of it, which also
    # watches for the client leaving while an utterance waits in admission's queue
    _client: ClientWatch = field(init=False)

    def __post_init__(self) -> None:
        read_ahead_bytes = max(READ_AHEAD_BYTES, self.settings.websocket.max_message_bytes)
        self._client = ClientWatch(
            self.websocket.receive,
            disconnect_type="websocket.disconnect",
            max_kept_bytes=read_ahead_bytes,
        )

    # Sending.

    async def send_json(self, event: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.websocket.send_text(json.dumps(event, separators=(",", ":")))

    async def _send_bytes(self, data: bytes) -> None:
        async with self._send_lock:
            await self.websocket.send_bytes(data)
        self._last_audio_s = time.monotonic()

    async def _sender(self) -> None:
        try:
            await self._send_loop()
        except (WebSocketDisconnect, OSError):
            pass  # the receiver sees the socket gone too
        except Exception:
            logger.exception("websocket sender failed")
            await self._close(CLOSE_SERVER_ERROR)

    async def _send_loop(self) -> None:
        while True:
            while not self._queue:
                self._drained.set()
                self._queued.clear()
                await self._queued.wait()
            self._drained.clear()
            utterance = self._queue[0]
            self._sending = utterance
            try:
                await self._send_utterance(utterance)
            finally:
                self._sending = None
                self._queue.popleft()
                self._finish(utterance)

    async def _send_alignment(self, utterance: Utterance, until_s: float) -> None:
        """The alignment event for the utterance's characters and words that start before
        `until_s` of its audio and were not sent yet (none when there are none)."""
        alignment = utterance.stream.alignment
        chars, utterance.chars_sent = alignment.chars_before(until_s, utterance.chars_sent)
        words, utterance.words_sent = alignment.words_before(until_s, utterance.words_sent)
        if chars or words:
            await self.send_json(alignment_event(utterance.index, chars, words))

    async def _send_utterance(self, utterance: Utterance) -> None:
        stream, encoder = utterance.stream, utterance.encoder
        started = False
        failure: str | None = None
        aligned = utterance.alignment
        audio_s = 0.0  # the engine's audio so far (its own clock: samples at its rate)
        try:
            async with aclosing(stream.chunks()) as chunks:
                async for pcm in chunks:
                    if utterance.cancelled:
                        break
                    audio_s += len(pcm) / stream.sample_rate_hz
                    data = encoder.encode(pcm)
                    if not started:
                        started = True
                        await self.send_json(
                            {
                                "type": "audio.start",
                                "utterance": utterance.index,
                                "sample_rate": encoder.output_rate_hz,
                                "format": encoder.response_format,
                            }
                        )
                    if aligned and not utterance.cancelled:
                        # what this chunk's audio says goes before it
                        await self._send_alignment(utterance, audio_s)
                    if data and not utterance.cancelled:
                        utterance.sent_samples = encoder.output_samples
                        await self._send_bytes(data)
        except PipelineError as exc:  # StreamFailed; after the engine rewrite also StreamCancelled
            if not utterance.cancelled:
                failure = str(exc)
        if not utterance.cancelled and failure is None and stream.state is StreamState.CANCELLED:
            failure = "the server is shutting down"
        if failure is not None:
            logger.error("utterance %d (stream %s) failed: %s", utterance.index, stream.id, failure)
            await self.send_json(
                error_event(
                    f"Speech generation failed: {failure}",
                    code="stream_failed",
                    error_type="server_error",
                    utterance=utterance.index,
                )
            )
        if aligned and not utterance.cancelled and failure is None:
            # the text's last characters (a trailing space, at the end of the audio)
            await self._send_alignment(utterance, math.inf)
        if not utterance.cancelled and failure is None:
            tail = encoder.finish()
            utterance.sent_samples = encoder.output_samples
            if tail:
                await self._send_bytes(tail)
        done: dict[str, Any] = {
            "type": "audio.done",
            "utterance": utterance.index,
            "audio_ms": round(utterance.audio_ms, 1),
        }
        if utterance.cancelled:
            done["cancelled"] = True
        await self.send_json(done)

    def _finish(self, utterance: Utterance) -> None:
        self.engine.cancel(utterance.stream.id)  # no-op once it finished
        utterance.encoder.close()
        if utterance in self.in_flight:
            self.in_flight.remove(utterance)
        if self.current is utterance:
            self.current = None

    # Receiving.

    async def run(self) -> None:
        """Serve the socket until it closes; everything is freed on the way out."""
        sender = asyncio.create_task(self._sender(), name="playhead-ws-sender")
        close_code: int | None = CLOSE_NORMAL  # None: the client is gone
        try:
            await self._receive_loop()
        except SessionEnded as ended:
            close_code = ended.close_code
        except WebSocketDisconnect:
            close_code = None
        except Exception:
            logger.exception("websocket session failed")
            close_code = CLOSE_SERVER_ERROR
            with contextlib.suppress(Exception):
                await self.send_json(
                    error_event(
                        "The server had an error while processing your message.",
                        code="internal_error",
                        error_type="server_error",
                    )
                )
        finally:
            for utterance in list(self.in_flight):
                self._cancel(utterance)
            if close_code is not None and not sender.done():
                # The sender answers each cancelled utterance with audio.done (cancelled).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._drained.wait()
            sender.cancel()
            with contextlib.suppress(BaseException):
                await sender
            for utterance in list(self.in_flight):
                self._finish(utterance)
        if close_code is not None:
            if close_code == CLOSE_NORMAL:
                with contextlib.suppress(Exception):
                    await self.send_json({"type": "session.closed"})
            await self._close(close_code)

    async def _close(self, code: int) -> None:
        if self.websocket.application_state is WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await self.websocket.close(code)

    async def _receive(self, timeout_s: float) -> str | None:
        """The next text message; None on a timeout. Raises WebSocketDisconnect, SessionEnded."""
        try:
            async with asyncio.timeout(timeout_s):
                message = await self._client.receive()
        except TimeoutError:
            return None
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        text = message.get("text")
        data = message.get("bytes")
        size = len(text.encode()) if text is not None else len(data or b"")
        limit = self.settings.websocket.max_message_bytes
        if size > limit:
            await self._refuse(
                ProtocolError(
                    f"The message has {size} bytes; at most {limit} are accepted.",
                    code="message_too_large",
                    close_code=CLOSE_TOO_BIG,
                )
            )
        if text is None:
            await self._refuse(
                ProtocolError(
                    "Binary messages are not accepted; send JSON text messages.",
                    code="invalid_type",
                )
            )
            return ""
        return text

    async def _refuse(self, error: ProtocolError, utterance: int | None = None) -> None:
        await self.send_json(error.event(utterance))
        if error.close_code is not None:
            raise SessionEnded(error.close_code)

    async def _receive_loop(self) -> None:
        """Returns on session.close; raises SessionEnded or WebSocketDisconnect otherwise."""
        ws_config = self.settings.websocket
        text = await self._receive(ws_config.first_message_timeout_s)
        if text is None:
            await self._refuse(
                ProtocolError(
                    f"No message within {ws_config.first_message_timeout_s:g} s of connecting.",
                    code="session_timeout",
                    close_code=CLOSE_POLICY,
                )
            )
        while True:
            if text:
                try:
                    message = parse_message(text)
                    if self.voice is None and not isinstance(message, SessionConfig):
                        raise ProtocolError(
                            "The first message must be a valid session.config.",
                            code="session_config_required",
                            close_code=CLOSE_POLICY,
                        )
                    if isinstance(message, SessionClose):
                        return
                    await self._handle(message)
                except ProtocolError as error:
                    await self._refuse(error, self.current.index if self.current else None)
            while True:
                text = await self._receive(ws_config.idle_timeout_s)
                if text is not None:
                    break
                if self._idle(ws_config.idle_timeout_s):
                    await self._refuse(
                        ProtocolError(
                            f"No message and no audio for {ws_config.idle_timeout_s:g} s: "
                            "the session is closed.",
                            code="idle_timeout",
                            close_code=CLOSE_POLICY,
                        )
                    )

    def _idle(self, timeout_s: float) -> bool:
        """Nothing for the client is under way: no utterance whose text is complete is
        still being sent, and no audio left for `timeout_s` (an utterance left open, its
        text said, waits for more text: that is idle)."""
        if any(u.text_closed for u in self.in_flight):
            return False
        return time.monotonic() - self._last_audio_s >= timeout_s

    async def _handle(self, message: object) -> None:
        if isinstance(message, SessionConfig):
            self.voice = self._configure(message)
        elif isinstance(message, InputText):
            await self._input_text(message.text)
        elif isinstance(message, InputDone):
            self._input_done()
        elif isinstance(message, PlaybackPosition):
            self._ack(message)
        elif isinstance(message, Cancel):
            self.rejected_open = False
            for utterance in list(self.in_flight):
                self._cancel(utterance)

    def _configure(self, config: SessionConfig) -> SessionVoice:
        try:
            voice = resolve_voice(self.engine, config.voice or self.engine.backend.default_voice())
        except ApiError as exc:
            code = exc.code or "invalid_value"
            raise ProtocolError(exc.message, code=code, param="voice") from None
        rate_hz = config.sample_rate or self.settings.server.default_sample_rate_hz
        return SessionVoice(
            voice.id, rate_hz, config.response_format, config.speed, config.alignment
        )

    async def _input_text(self, text: str) -> None:
        max_chars = self.settings.websocket.max_text_chars
        if self.rejected_open:
            return  # the rest of a refused utterance (its error event was sent)
        if has_nul(text):  # the text checks of every protocol (app/text_input.py)
            raise ProtocolError(
                "Invalid 'text': it contains a NUL character (U+0000), which is not text.",
                code="invalid_value",
                param="text",
            )
        text = words_apart(text)
        utterance = self.current
        used = utterance.text_chars if utterance is not None else 0
        if used + len(text) > max_chars:
            raise ProtocolError(
                f"The utterance's text passes the limit of {max_chars} characters.",
                code="text_too_long",
                close_code=CLOSE_POLICY,
            )
        if utterance is None:
            await self._start(text)
        else:
            utterance.text_chars += len(text)
            self._append(utterance, text, final=False)

    async def _start(self, text: str) -> None:
        """A new utterance: admitted as every protocol is (pipeline/admission.py), waiting
        in admission's queue (at most admission.queue_max_wait_s) before its stream; the
        client leaving meanwhile ends the wait (WebSocketDisconnect)."""
        voice = self.voice
        assert voice is not None
        index = self.next_index
        self.next_index += 1
        try:
            reservation = self.engine.reserve(voice.voice_id)
        except Rejected as exc:
            self.rejected_open = True
            raise at_capacity_error(exc, index) from exc
        except NotReady as exc:
            raise not_running_error() from exc
        try:
            # the loop reads on while it waits (what comes is kept, handled after it, in
            # order), so that a client who leaves meanwhile gives its place back at once
            if not await wait_admitted(reservation, self._client.gone()):
                raise WebSocketDisconnect(CLOSE_GOING_AWAY)
            utterance = open_utterance(
                self.engine, self.settings, voice, index, text, reservation=reservation
            )
        except Rejected as exc:  # waited admission.queue_max_wait_s
            self.rejected_open = True
            raise at_capacity_error(exc, index) from exc
        except NotReady as exc:
            raise not_running_error() from exc
        finally:
            reservation.release()  # a no-op once submit used it
        self.current = utterance
        self.in_flight.append(utterance)
        self._queue.append(utterance)
        self._drained.clear()
        self._queued.set()

    def _input_done(self) -> None:
        if self.rejected_open:
            self.rejected_open = False
            return
        utterance = self.current
        if utterance is None:
            raise ProtocolError(
                "input.done without an utterance: send input.text first.", code="no_utterance"
            )
        utterance.text_closed = True
        self.current = None
        self._append(utterance, "", final=True)

    def _append(self, utterance: Utterance, text: str, *, final: bool) -> None:
        normalizer = utterance.normalizer
        if normalizer is not None:
            text = normalizer.push(text)
            if final:
                text += normalizer.flush()
        try:
            self.engine.append_text(utterance.stream.id, text, final=final)
        except ValueError:
            # The stream ended under us (it failed, or the engine stopped): the sender
            # reports that with an error event.
            logger.debug("utterance %d takes no more text", utterance.index)

    def _ack(self, position: PlaybackPosition) -> None:
        if position.utterance is None:
            utterance = self._sending
        elif not 0 <= position.utterance < self.next_index:
            # a finished utterance's late position is quiet; one never started is an error
            raise ProtocolError(
                f"playback.position names utterance {position.utterance}, which this socket "
                f"never started (utterances so far: {self.next_index}).",
                code="no_utterance",
                param="utterance",
            )
        else:
            utterance = next((u for u in self.in_flight if u.index == position.utterance), None)
        if utterance is not None and not utterance.cancelled:
            # Beyond what was sent is a client error; the engine's horizon must stay sane.
            played_s = min(position.played_ms, utterance.audio_ms) / 1000.0
            self.engine.ack_playback(utterance.stream.id, played_s)

    def _cancel(self, utterance: Utterance) -> None:
        utterance.cancelled = True
        if self.current is utterance:
            self.current = None
        self.engine.cancel(utterance.stream.id)

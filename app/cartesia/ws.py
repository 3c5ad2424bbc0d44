"""WS /tts/websocket: Cartesia's contexts over one socket (docs/cartesia.md).

Every client message is JSON: a generation request (`context_id`, `transcript`, `voice`,
`output_format`, `continue`, `flush`, `add_timestamps`, ...) or `{"context_id": ..,
"cancel": true}`. The first request of a new context_id opens a context: one engine
stream, admitted as POST /v1/audio/speech is (app/cartesia/speech.py: `Engine.reserve`
now, a 429-shaped `error` message at once when refused; the wait for a start slot and the
submit in the context's own task, so the socket keeps reading meanwhile). Later requests on
the same context append their transcript (`continue: true`: the engine's Segmenter speaks
each sentence as soon as it is complete); `continue: false` closes its text. After
`max_buffer_delay_ms` without more text (0: at once) the text so far counts as complete
(app/cartesia/context.py): a sentence mark at its end ends the sentence, as pipecat and
LiveKit send whole sentences without the space after them. Contexts run
side by side, each in its own task, and share the socket's send lock.

Server messages, each with `type` and `context_id`: `chunk` (base64 audio, `flush_id`),
`timestamps` (`word_timestamps` of the words whose audio has been sent, with
`add_timestamps`), `flush_done` (once the text before a `flush` has been heard, or at the
context's end), `done` (the context's audio is complete; it is then forgotten), `error`
(with Cartesia's fields; `context_id` null for a message that named none). `cancel` stops a
context's audio within the chunk being sent and frees its engine stream; nothing more is
sent for it, and later text on that context_id is dropped until a `continue: false`. A
cancel of a context that is done is quiet (pipecat cancels on every interruption); one
naming a context never opened on the socket is an `error` (`context_not_found`).

The socket closes on the client's close (every context cancelled), after an error event on
a message larger than websocket.max_message_bytes (1009), or after websocket.idle_timeout_s
without a message while no context is open (1008).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import time
import uuid
from collections import OrderedDict
from contextlib import aclosing
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from app.cartesia.audio import open_output
from app.cartesia.context import Context, join_spoken
from app.cartesia.schema import (
    CartesiaError,
    Generation,
    check_model,
    invalid,
    parse_generation,
)
from app.cartesia.speech import PROTOCOL, WordCursor, pipeline_error, resolve_voice
from app.client_json import ClientJsonError, load_client_json, quote
from app.metrics import Metrics
from app.settings import Settings
from pipeline import Engine, PipelineError, Stream
from pipeline.normalize import StreamNormalizer, normalizer_for

logger = logging.getLogger("playhead.cartesia")

CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
DEAD_IDS_KEPT = 1024  # refused or cancelled context ids whose later text is dropped
SEEN_IDS_KEPT = 4096  # ids of contexts opened on a socket (a cancel of one done is no error)


class CartesiaSocket:
    """One socket; `run()` serves it until it closes, and frees every context."""

    def __init__(
        self, websocket: WebSocket, engine: Engine, settings: Settings, metrics: Metrics
    ) -> None:
        self.websocket = websocket
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.request_id = str(uuid.uuid4())
        self.contexts: dict[str, Context] = {}
        self._dead: OrderedDict[str, None] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()  # every context id opened
        self._send_lock = asyncio.Lock()

    # Sending.

    async def send(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.websocket.send_text(json.dumps(message, separators=(",", ":")))

    async def send_error(self, error: CartesiaError, context_id: str | None) -> None:
        await self.send(error.event(self.request_id, context_id))

    def _message(self, kind: str, context: Context, **fields: Any) -> dict[str, Any]:
        done = kind == "done"
        return {
            "type": kind,
            "context_id": context.id,
            "done": done,
            "status_code": 200 if done else 206,
            **fields,
        }

    # The socket.

    async def run(self) -> None:
        close_code: int | None = CLOSE_NORMAL
        try:
            await self._receive_loop()
        except WebSocketDisconnect:
            close_code = None
        except _Close as close:
            close_code = close.code
        except Exception:
            logger.exception("cartesia socket failed")
            close_code = 1011
            error = CartesiaError(
                "The server had an error.", error_code="internal_error", status_code=500
            )
            with contextlib.suppress(Exception):
                await self.send_error(error, None)
        finally:
            contexts = list(self.contexts.values())
            for context in contexts:
                self._cancel(context)
            tasks = [c.task for c in contexts if c.task is not None]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        if close_code is not None and self.websocket.application_state is WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await self.websocket.close(close_code)

    async def _receive_loop(self) -> None:
        limits = self.settings.websocket
        while True:
            try:
                async with asyncio.timeout(limits.idle_timeout_s):
                    message = await self.websocket.receive()
            except TimeoutError:
                if self.contexts:
                    continue
                error = CartesiaError(
                    f"No message for {limits.idle_timeout_s:g} s: the socket is closed.",
                    error_code="idle_timeout",
                )
                await self.send_error(error, None)
                raise _Close(CLOSE_POLICY) from None
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", CLOSE_NORMAL))
            text = message.get("text")
            size = len(text.encode()) if text is not None else len(message.get("bytes") or b"")
            if size > limits.max_message_bytes:
                error = CartesiaError(
                    f"The message has {size} bytes; at most {limits.max_message_bytes} are "
                    "accepted.",
                    error_code="message_too_large",
                    status_code=413,
                )
                await self.send_error(error, None)
                raise _Close(CLOSE_TOO_BIG)
            context_id: str | None = None
            try:
                if text is None:
                    raise invalid("Binary messages are not accepted; send JSON text.")
                data = _load(text)
                raw_id = data.get("context_id")
                context_id = raw_id if isinstance(raw_id, str) else None
                self._handle(data)
            except CartesiaError as error:
                await self.send_error(error, context_id)

    # Client messages.

    def _handle(self, data: dict[str, Any]) -> None:
        if "cancel" in data:
            if data["cancel"] is not True or not isinstance(data.get("context_id"), str):
                raise invalid('A cancel message is {"context_id": "...", "cancel": true}.')
            self._cancel_id(data["context_id"])
            return
        generation = parse_generation(data, socket=True, containers=("raw",))
        context_id = generation.context_id
        assert context_id is not None
        if context_id in self._dead:
            if not generation.continue_:  # the client's end of that context
                del self._dead[context_id]
            return
        context = self.contexts.get(context_id)
        try:
            if context is None:
                try:
                    self._open(generation)
                except CartesiaError as error:
                    if error.status_code == 429:
                        self.metrics.protocol_streams.labels(PROTOCOL, "rejected").inc()
                    raise
            else:
                self._more(context, generation)
        except CartesiaError:
            # the context ends with its error (`done: true`): its later text is dropped
            if context is not None:
                self._cancel(context)
            if generation.continue_ or (context is not None and not context.text_closed):
                self._bury(context_id)
            raise

    def _check_length(self, context: Context | None, text: str) -> None:
        limit = self.settings.websocket.max_text_chars
        used = context.chars if context is not None else 0
        if used + len(text) > limit:
            raise invalid(
                f"The context's transcript passes the limit of {limit} characters.",
                "transcript_too_long",
            )

    def _open(self, generation: Generation) -> None:
        check_model(generation.model_id, self.settings.server.accepted_model_ids)
        self._check_length(None, generation.transcript)
        voice = resolve_voice(self.engine, generation.voice_id)
        encoder = open_output(
            generation.output_format, voice.sample_rate_hz, self.settings.encoding
        )
        try:
            reservation = self.engine.reserve(voice.id)
        except PipelineError as exc:  # Rejected (429) or NotReady (503)
            encoder.close()
            raise pipeline_error(exc) from None
        rules = normalizer_for(voice.language, self.settings.normalize)
        context = Context(
            id=generation.context_id or "",
            voice=voice,
            speed=generation.speed,
            timestamps=generation.add_timestamps,
            encoder=encoder,
            normalizer=StreamNormalizer(rules) if rules is not None else None,
            reservation=reservation,
        )
        if generation.max_buffer_delay_ms is not None:
            context.buffer_delay_s = generation.max_buffer_delay_ms / 1000.0
        self.contexts[context.id] = context
        self._seen[context.id] = None
        while len(self._seen) > SEEN_IDS_KEPT:
            self._seen.popitem(last=False)
        self._take_text(context, generation)
        context.task = asyncio.create_task(self._run(context), name=f"cartesia-{context.id}")

    def _more(self, context: Context, generation: Generation) -> None:
        if context.text_closed:
            if not generation.transcript and not generation.continue_:
                return  # a second close: nothing to do
            raise invalid(
                f"Context {generation.context_id!r} was closed (continue: false); "
                "use a new context_id.",
                "context_closed",
            )
        self._check_length(context, generation.transcript)
        self._take_text(context, generation)

    def _take_text(self, context: Context, generation: Generation) -> None:
        context.chars += len(generation.transcript)
        final = not generation.continue_
        if context.stream is None:
            context.pending.append((generation.transcript, generation.flush, False))
        else:
            spoken = context.spoken(generation.transcript, generation.flush, final)
            self._append(context, spoken, final, flush=generation.flush)
        context.text_closed = final
        self._arm_release(context)

    def _append(self, context: Context, spoken: str, final: bool, *, flush: bool = False) -> None:
        """Text for the context's stream; `flush` (a flush, the buffer delay's release)
        speaks the text so far without waiting for its sentence to end."""
        assert context.stream is not None
        try:
            self.engine.append_text(context.stream.id, spoken, final=final, flush=flush)
        except ValueError:  # the stream ended under us: its task reports it
            logger.debug("context %s takes no more text", context.id)

    def _arm_release(self, context: Context) -> None:
        """Cartesia's buffering: once `max_buffer_delay_ms` passed without more text (at
        once for 0), the text so far counts as complete (`_release`)."""
        if context.timer is not None:
            context.timer.cancel()
            context.timer = None
        if context.text_closed or context.cancelled:
            return
        if context.buffer_delay_s <= 0:
            self._release(context)
        else:
            loop = asyncio.get_running_loop()
            context.timer = loop.call_later(context.buffer_delay_s, self._release, context)

    def _release(self, context: Context) -> None:
        context.timer = None
        if context.text_closed or context.cancelled:
            return
        if context.stream is None:
            context.pending.append(("", False, True))
        else:
            self._append(context, context.spoken("", False, False, release=True), False, flush=True)

    def _bury(self, context_id: str) -> None:
        self._dead[context_id] = None
        while len(self._dead) > DEAD_IDS_KEPT:
            self._dead.popitem(last=False)

    def _cancel_id(self, context_id: str) -> None:
        context = self.contexts.get(context_id)
        if context is None:
            if context_id in self._seen or context_id in self._dead:
                return  # done already (pipecat cancels on every interruption): nothing to stop
            raise CartesiaError(
                f"cancel: no context {quote(context_id)} was opened on this socket.",
                error_code="context_not_found",
            )
        self._cancel(context)
        if not context.text_closed:
            self._bury(context_id)

    def _cancel(self, context: Context) -> None:
        context.cancelled = True
        if context.timer is not None:
            context.timer.cancel()
        if self.contexts.get(context.id) is context:
            del self.contexts[context.id]
        if context.stream is not None:
            self.engine.cancel(context.stream.id)
        elif context.task is not None:
            context.task.cancel()  # still waiting for a start slot

    # A context's task.

    async def _run(self, context: Context) -> None:
        reservation = context.reservation
        try:
            try:
                assert reservation is not None
                await reservation.wait_start()
                spoken: str | None = None
                for i, (text, flush, release) in enumerate(context.pending):
                    final = context.text_closed and i == len(context.pending) - 1
                    piece = context.spoken(text, flush, final, release=release)
                    spoken = piece if spoken is None else join_spoken(spoken, piece)
                # the text before the stream ended at a flush (or the buffer delay's release):
                # spoken now, its unfinished sentence too
                cut = bool(context.pending) and any(context.pending[-1][1:])
                context.pending.clear()
                context.stream = self.engine.submit(
                    spoken or "",
                    voice=context.voice.id,
                    speed=context.speed,
                    final=context.text_closed,
                    reservation=reservation,
                )
                if cut and not context.text_closed:
                    self._append(context, "", False, flush=True)
            except PipelineError as exc:  # refused while waiting for a start slot
                if pipeline_error(exc).status_code == 429:
                    self.metrics.protocol_streams.labels(PROTOCOL, "rejected").inc()
                if not context.cancelled:
                    if not context.text_closed:
                        self._bury(context.id)
                    await self.send_error(pipeline_error(exc), context.id)
                return
            self.metrics.protocol_streams.labels(PROTOCOL, "admitted").inc()
            await self._send_audio(context, context.stream)
        except (WebSocketDisconnect, OSError, asyncio.CancelledError):
            pass  # the socket is going: run() cancels every context
        except Exception:
            logger.exception("cartesia context %s failed", context.id)
            error = CartesiaError(
                "The server had an error.", error_code="internal_error", status_code=500
            )
            with contextlib.suppress(Exception):
                await self.send_error(error, context.id)
        finally:
            if reservation is not None:
                reservation.release()  # a no-op once submit used it
            if context.stream is not None:
                self.engine.cancel(context.stream.id)  # a no-op once it finished
            context.encoder.close()
            if context.timer is not None:
                context.timer.cancel()
            if self.contexts.get(context.id) is context:
                del self.contexts[context.id]

    async def _send_audio(self, context: Context, stream: Stream) -> None:
        encoder = context.encoder
        words = WordCursor(stream.alignment, context.breaks)
        sent_s = 0.0
        last_s = time.perf_counter()
        try:
            async with aclosing(stream.chunks()) as chunks:
                async for pcm in chunks:
                    if context.cancelled:
                        return
                    data = encoder.encode(pcm)
                    sent_s += pcm.size / stream.sample_rate_hz
                    now_s = time.perf_counter()
                    if data:
                        await self._send_chunk(context, data, 1000.0 * (now_s - last_s))
                    last_s = now_s
                    await self._progress(context, words, sent_s)
        except PipelineError as exc:  # StreamFailed; StreamCancelled after a cancel
            if context.cancelled:
                return
            logger.error("context %s (stream %s) failed: %s", context.id, stream.id, exc)
            await self.send_error(pipeline_error(exc), context.id)
            return
        if context.cancelled:
            return
        tail = encoder.finish()
        if tail:
            await self._send_chunk(context, tail, 0.0)
        await self._progress(context, words, math.inf)
        await self.send(self._message("done", context))

    async def _send_chunk(self, context: Context, data: bytes, step_ms: float) -> None:
        flush_id = context.flushes[0][0] if context.flushes else context.flush_id
        audio = base64.b64encode(data).decode()
        message = self._message(
            "chunk", context, data=audio, step_time=round(step_ms, 1), flush_id=flush_id
        )
        await self.send(message)

    async def _progress(self, context: Context, words: WordCursor, sent_s: float) -> None:
        """The timestamps of the words now sent, and the flushes now heard (all at the end)."""
        if context.timestamps and (taken := words.take(sent_s)) is not None:
            await self.send(self._message("timestamps", context, word_timestamps=taken))
        heard = words.heard_chars(sent_s)
        while context.flushes and (sent_s == math.inf or heard >= context.flushes[0][1]):
            flush_id, _ = context.flushes.popleft()
            await self.send(
                self._message("flush_done", context, flush_done=True, flush_id=flush_id)
            )


class _Close(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _load(text: str) -> dict[str, Any]:
    try:
        data = load_client_json(text)
    except ClientJsonError as exc:
        raise invalid(f"The message is not valid JSON. {exc.message}", "invalid_json") from None
    if not isinstance(data, dict):
        raise invalid("A message must be a JSON object.")
    return data

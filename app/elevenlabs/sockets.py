"""ElevenLabs' text-to-speech sockets (docs/elevenlabs.md):

    WS /v1/text-to-speech/{voice_id}/stream-input          one context (the official SDK)
    WS /v1/text-to-speech/{voice_id}/multi-stream-input    contexts by id (pipecat, LiveKit)

A context is one engine stream (app/elevenlabs/speech.py): admitted (`admit`) and submitted
at its first words, spoken from its first complete sentence while text still arrives.

The messages, their checks, errors and close codes: app/elevenlabs/socket_messages.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from app.elevenlabs import errors
from app.elevenlabs.formats import OutputFormat
from app.elevenlabs.http import PROTOCOL, output_format, resolve_voice
from app.elevenlabs.socket_messages import (
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    CLOSE_TRY_AGAIN,
    FLAGS,
    Refused,
    no_context,
    parse,
    text_required,
    ws_alignment,
)
from app.elevenlabs.speech import Piece, Speech
from app.errors import ApiError, InvalidRequest, pipeline_api_error, to_api_error
from app.security import check_credentials
from app.state import AppState
from app.text_input import has_nul, words_apart
from pipeline import Engine, NotReady, Rejected, Voice
from pipeline.admission import admit

logger = logging.getLogger("playhead.elevenlabs")

router = APIRouter()
DEFAULT_CONTEXT = "default"  # the single socket's context, and a multi message's without id
INACTIVITY_TIMEOUT_RANGE_S = (1, 180)  # ElevenLabs' inactivity_timeout (default 20 s)


@dataclass(eq=False)
class Context:
    id: str
    speech: Speech
    pending: str = ""  # text before the stream exists (waiting for admission)
    text_done: bool = False  # the text ended (graceful close_context, or the single EOS)
    end_flushed: bool = False  # the last message was a flush without text
    pending_flush: bool = False  # the text pending before its stream ended at a flush
    task: asyncio.Task[None] | None = None
    base_ms: int | None = None  # relative alignment: where the last message's chars ended
    spoken_base_ms: int | None = None  # the same, for the normalised (spoken) characters


@dataclass(eq=False)
class Connection:
    websocket: WebSocket
    state: AppState
    engine: Engine
    voice: Voice
    output: OutputFormat
    multi: bool
    sync_alignment: bool
    auto_mode: bool  # each text message is a complete phrase (pipecat's and LiveKit's default)
    normalize: bool
    inactivity_s: float
    contexts: dict[str, Context] = field(default_factory=dict)
    _send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _last_activity_s: float = field(default_factory=time.monotonic)
    _finished: asyncio.Event = field(default_factory=asyncio.Event)  # single: isFinal sent

    async def send(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.websocket.send_text(json.dumps(message, separators=(",", ":")))

    async def send_error(self, error: ApiError, context_id: str | None = None) -> None:
        await self.send(errors.socket_error(error, context_id if self.multi else None))

    # Contexts.

    def _new_context(self, context_id: str, settings: Any) -> Context:
        max_contexts = self.state.settings.websocket.max_contexts
        if len(self.contexts) >= max_contexts:
            raise Refused(
                InvalidRequest(
                    f"At most {max_contexts} contexts may be open on one socket; close one "
                    "(close_context) first.",
                    code="max_active_contexts_exceeded",
                ),
                context_id,
            )
        speed = settings.get("speed") if isinstance(settings, dict) else None
        if speed is not None and not (
            isinstance(speed, int | float) and not isinstance(speed, bool) and 0.25 <= speed <= 4
        ):
            raise Refused(
                InvalidRequest(
                    "voice_settings.speed must be a number from 0.25 to 4.",
                    param="voice_settings.speed",
                    code="invalid_voice_settings",
                ),
                context_id,
            )
        speech = Speech(
            self.engine,
            self.voice,
            self.output,
            self.state.settings,
            self.state.encoder_threads,
            speed=float(speed or 1.0),
            normalize=self.normalize,
        )
        base_ms = None if self.sync_alignment else 0
        context = Context(context_id, speech, base_ms=base_ms, spoken_base_ms=base_ms)
        self.contexts[context_id] = context
        return context

    def _text(self, context: Context, text: str, flush: bool) -> None:
        max_chars = self.state.settings.websocket.max_text_chars
        if context.speech.text_chars + len(context.pending) + len(text) > max_chars:
            self._interrupt(context)
            raise Refused(
                InvalidRequest(
                    f"The context's text passes the limit of {max_chars} characters; the "
                    "context is closed.",
                    param="text",
                    code="max_character_limit_exceeded",
                ),
                context.id,
            )
        context.end_flushed = flush and not text.strip()
        if self.auto_mode and text.strip():
            # a complete phrase (pipecat sends "It ends." without the space that would say
            # so): it is not held back for what follows, and a space separates it from it
            flush = True
            if not text[-1].isspace():
                text += " "
        if context.speech.stream is not None:
            context.speech.append(text, flush=flush)
            return
        if not context.pending and not text.strip():
            return  # a context opens at its first words: leading blanks are not its text
        context.pending += text
        context.pending_flush = flush  # the text so far ends at a flush: cut there
        if context.task is None:
            context.task = asyncio.create_task(self._run(context), name="playhead-el-context")

    def _end_text(self, context: Context) -> None:
        context.text_done = True
        if context.speech.stream is not None:
            context.speech.finish()
        elif context.task is None:  # no words at all: nothing to say
            context.task = asyncio.create_task(self._run(context), name="playhead-el-context")

    def _interrupt(self, context: Context) -> None:
        context.speech.interrupt()
        if context.task is None:
            context.task = asyncio.create_task(self._run(context), name="playhead-el-context")
        elif context.speech.stream is None:
            context.task.cancel()  # still waiting for admission: give the slot back

    async def _run(self, context: Context) -> None:
        """A context's life: admission, submit, its audio, isFinal; then it is gone."""
        speech = context.speech
        try:
            if context.pending.strip() and not speech.interrupted:
                await self._speak(context)
        except asyncio.CancelledError:
            if not speech.interrupted:
                raise
        except (WebSocketDisconnect, OSError, RuntimeError):
            speech.interrupt()  # the socket is gone: the receiver ends the connection
        except Exception as exc:
            logger.exception("context %s failed", context.id)
            speech.interrupt()
            with contextlib.suppress(Exception):
                await self.send_error(to_api_error(exc), context.id)
        finally:
            speech.close()
            self.contexts.pop(context.id, None)
        final: dict[str, Any] = {"isFinal": True}
        if self.multi:
            final["contextId"] = context.id
        with contextlib.suppress(Exception):
            await self.send(final)
        if not self.multi:
            self._finished.set()

    async def _speak(self, context: Context) -> None:
        speech = context.speech
        try:
            reservation = await admit(self.engine, voice=speech.voice.id)
        except (Rejected, NotReady) as exc:
            self.state.metrics.protocol_streams.labels(PROTOCOL, "rejected").inc()
            await self.send_error(pipeline_api_error(exc), context.id)
            return
        try:
            speech.start(context.pending, final=context.text_done, reservation=reservation)
        except (ValueError, Rejected, NotReady) as exc:
            await self.send_error(to_api_error(exc), context.id)
            return
        finally:
            reservation.release()  # a no-op once submit used it
        if context.pending_flush and not context.text_done:
            speech.append("", flush=True)
        context.pending = ""
        if speech.interrupted:  # interrupted while it was admitted
            return
        self.state.metrics.protocol_streams.labels(PROTOCOL, "admitted").inc()
        async for piece in speech.pieces():
            await self._send_piece(context, piece)
            self._last_activity_s = time.monotonic()
        if speech.failure is not None:
            logger.error("context %s failed: %s", context.id, speech.failure)
            await self.send_error(
                ApiError(f"Speech generation failed: {speech.failure}", code="stream_failed"),
                context.id,
            )

    async def _send_piece(self, context: Context, piece: Piece) -> None:
        if not piece.audio and not piece.chars and not piece.spoken:
            return
        alignment, context.base_ms = ws_alignment(piece.chars, context.base_ms, piece.end_s)
        normalized, context.spoken_base_ms = ws_alignment(
            piece.spoken, context.spoken_base_ms, piece.end_s
        )
        message: dict[str, Any] = {
            "audio": base64.b64encode(piece.audio).decode() if piece.audio else None,
            "alignment": alignment,
            "normalizedAlignment": normalized,  # the spoken text's ("five", not "5")
        }
        if self.multi:
            message["contextId"] = context.id
        if not context.speech.interrupted:
            await self.send(message)

    # Receiving.

    async def run(self) -> None:
        close_code = CLOSE_NORMAL
        try:
            close_code = await self._receive_loop()
        except WebSocketDisconnect:
            close_code = 0
        except Exception:
            logger.exception("elevenlabs socket failed")
            close_code = 1011
            with contextlib.suppress(Exception):
                await self.send_error(ApiError("The server had an error with this socket."))
        finally:
            # whatever ends the socket ends its contexts (each answers isFinal while it can)
            for context in list(self.contexts.values()):
                self._interrupt(context)
            tasks = [c.task for c in self.contexts.values() if c.task is not None]
            if tasks:
                await asyncio.wait(tasks, timeout=2.0)
            for context in list(self.contexts.values()):
                if context.task is not None:
                    context.task.cancel()
                context.speech.close()
        if close_code and self.websocket.application_state is WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await self.websocket.close(close_code)

    async def _receive(self) -> dict[str, Any] | None:
        """The next message as a dict; None when the single socket's speech ended."""
        while True:
            receive = asyncio.ensure_future(self.websocket.receive())
            waits: set[asyncio.Future[Any]] = {receive}
            finished = None
            if not self.multi:
                finished = asyncio.ensure_future(self._finished.wait())
                waits.add(finished)
            done, _ = await asyncio.wait(
                waits, timeout=self.inactivity_s / 4, return_when=asyncio.FIRST_COMPLETED
            )
            if finished is not None:
                finished.cancel()
            if receive not in done:
                receive.cancel()
                with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect):
                    await receive
                if finished is not None and finished in done:
                    return None
                if self._idle():
                    raise Refused(
                        InvalidRequest(
                            f"No message for {self.inactivity_s:g} s (inactivity_timeout): "
                            "the socket is closed.",
                            code="input_timeout_exceeded",
                        ),
                        close=True,
                    )
                continue
            message = receive.result()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            self._last_activity_s = time.monotonic()
            return parse(message, self.state.settings.websocket.max_message_bytes)

    def _idle(self) -> bool:
        speaking = any(c.text_done and c.task is not None for c in self.contexts.values())
        return not speaking and time.monotonic() - self._last_activity_s >= self.inactivity_s

    async def _receive_loop(self) -> int:
        """Handles messages until the socket should close; returns the close code."""
        while True:
            try:
                data = await self._receive()
                if data is None:
                    return CLOSE_NORMAL  # the single socket's isFinal was sent
                if data.get("close_socket") is True:
                    for context in list(self.contexts.values()):
                        self._interrupt(context)
                    return CLOSE_NORMAL
                self._handle(data)
            except Refused as refused:
                await self.send_error(refused.error, refused.context_id)
                if refused.close or not self.multi:
                    if refused.error.code == "message_too_large":
                        return CLOSE_TOO_BIG
                    code = refused.error.status_code
                    return CLOSE_TRY_AGAIN if code == 429 else CLOSE_POLICY

    def _handle(self, data: dict[str, Any]) -> None:
        context_id = data.get("context_id", DEFAULT_CONTEXT) if self.multi else DEFAULT_CONTEXT
        if not isinstance(context_id, str) or not context_id:
            error = InvalidRequest(
                "context_id must be a non-empty string.", param="context_id", code="invalid_message"
            )
            raise Refused(error)
        for name in FLAGS:
            if data.get(name) is not None and not isinstance(data[name], bool):
                error = InvalidRequest(
                    f"{name} must be true or false.", param=name, code="invalid_message"
                )
                raise Refused(error, context_id)
        settings = data.get("voice_settings")
        if settings is not None and not isinstance(settings, dict):
            error = InvalidRequest(
                "voice_settings must be an object.", param="voice_settings", code="invalid_message"
            )
            raise Refused(error, context_id)
        text = data.get("text")
        if text is not None and not isinstance(text, str):
            error = InvalidRequest("text must be a string.", param="text", code="invalid_message")
            raise Refused(error, context_id)
        if text is not None and has_nul(text):
            error = InvalidRequest(
                "text contains a NUL character.", param="text", code="invalid_text"
            )
            raise Refused(error, context_id)
        if text:
            text = words_apart(text)  # a form feed, a bell: a space, as over HTTP
        flush = data.get("flush") is True
        context = self.contexts.get(context_id)
        if data.get("close_context") is True:
            if context is None:
                raise Refused(no_context(context_id, "close_context"), context_id)
            if context.end_flushed or context.text_done:
                self._end_text(context)
            else:
                self._interrupt(context)
            return
        if text is None:
            # every message of the single socket carries text (" " first, "" last); on the
            # multi-context socket, one that flushes, closes or keeps a context alive
            if not self.multi or not (flush or data.get("keep_alive") is True):
                raise Refused(text_required(self.multi), context_id)
            if not flush:
                return  # keep_alive: the socket's activity was noted
        if self.multi and text == "" and not flush:
            return  # a keep-alive (of a context or of the socket)
        if context is None:
            if not text:
                if self.multi:  # a flush of a context that is not open
                    raise Refused(no_context(context_id, "flush"), context_id)
                return  # the single socket's end of a text that never began: nothing to say
            context = self._new_context(context_id, settings)
        elif context.text_done or context.speech.interrupted:
            raise Refused(
                InvalidRequest(f"The context {context_id!r} is closed.", code="context_closed"),
                context_id,
            )
        if not self.multi and text == "":
            self._end_text(context)  # the single socket's end of text
            return
        self._text(context, text or "", flush)


def _flag(websocket: WebSocket, name: str, default: bool) -> bool:
    value = websocket.query_params.get(name)
    return default if value is None else value.lower() in ("true", "1")


async def _serve(websocket: WebSocket, voice_id: str, *, multi: bool) -> None:
    state: AppState = websocket.app.state.playhead
    try:
        check_credentials(state.settings.server.api_key, websocket.headers)
        engine = state.ready_engine
        if engine is None:
            raise state.not_ready_error()
        voice = resolve_voice(engine, voice_id)
        output = output_format(websocket.query_params.get("output_format"))
        inactivity = websocket.query_params.get("inactivity_timeout", "20")
        low, high = INACTIVITY_TIMEOUT_RANGE_S
        if not (inactivity.isdigit() and low <= int(inactivity) <= high):
            raise InvalidRequest(
                f"inactivity_timeout must be {low} to {high} seconds.", param="inactivity_timeout"
            )
    except ApiError as exc:
        await websocket.send_denial_response(errors.error_response(exc))
        return
    await websocket.accept()
    await Connection(
        websocket,
        state,
        engine,
        voice,
        output,
        multi=multi,
        sync_alignment=_flag(websocket, "sync_alignment", False),
        auto_mode=_flag(websocket, "auto_mode", False),
        normalize=websocket.query_params.get("apply_text_normalization") != "off",
        inactivity_s=float(inactivity),
    ).run()


@router.websocket("/v1/text-to-speech/{voice_id}/stream-input")
async def stream_input(websocket: WebSocket, voice_id: str) -> None:
    await _serve(websocket, voice_id, multi=False)


@router.websocket("/v1/text-to-speech/{voice_id}/multi-stream-input")
async def multi_stream_input(websocket: WebSocket, voice_id: str) -> None:
    await _serve(websocket, voice_id, multi=True)

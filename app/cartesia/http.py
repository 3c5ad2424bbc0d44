"""Cartesia's HTTP routes: POST /tts/bytes, POST /tts/sse, GET /voices, GET /voices/{id}.

/tts/bytes streams the audio as it is made (raw, wav or mp3), through app/streaming.py's
body and response (a client gone cancels the engine stream; a failure after the first
byte cuts the transfer). /tts/sse sends Cartesia's events: `chunk` (base64 audio), then
`timestamps` once the words' audio was sent (with `add_timestamps`), `done` last, or an
`error` event when the stream fails after the response started. Every refusal before the
response is a status code with Cartesia's error body (app/cartesia/schema.py); the API key
was checked by app/security.py (X-API-Key or Authorization), in Cartesia's shape too.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from app.audio import EncoderClosed, EncoderError
from app.cartesia.audio import open_output
from app.cartesia.schema import (
    CONTAINERS,
    CartesiaError,
    Generation,
    check_model,
    check_version,
    invalid,
    parse_generation,
)
from app.cartesia.speech import PROTOCOL, WordCursor, pipeline_error, resolve_voice
from app.client_json import ClientJsonError, load_client_json
from app.disconnect import client_watch
from app.errors import ApiError, RequestTooLarge
from app.routes import read_body, start_unless_client_gone
from app.state import AppState, StateDep
from app.streaming import SSE_CONTENT_TYPE, SpeechBody, SpeechResponse
from app.text_input import normalized, words_apart
from pipeline import Engine, PipelineError, Voice
from pipeline.admission import admit
from pipeline.normalize import language_code, speakable

logger = logging.getLogger("playhead.cartesia")


cartesia_router = APIRouter(include_in_schema=False)


def error_json(exc: CartesiaError, request_id: str) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
    return JSONResponse(exc.body(request_id), status_code=exc.status_code, headers=headers)


def render_api_error(exc: ApiError) -> JSONResponse:
    """An app error (the 401 of app/security.py) in Cartesia's shape."""
    code = "unauthorized" if exc.status_code == 401 else (exc.code or "error")
    error = CartesiaError(exc.message, error_code=code, status_code=exc.status_code)
    response = error_json(error, str(uuid.uuid4()))
    response.headers.update(exc.headers)
    return response


def clean_transcript(transcript: str, max_chars: int) -> str:
    """Control characters separate words like a space; empty or too long: 400."""
    text = words_apart(transcript).strip()
    if not text:
        raise invalid("Invalid 'transcript': it is empty.", "empty_transcript")
    if len(text) > max_chars:
        raise invalid(
            f"Invalid 'transcript': {len(text)} characters, at most {max_chars} allowed.",
            "transcript_too_long",
        )
    return text


async def read_generation(request: Request, state: AppState, *, sse: bool) -> Generation:
    check_version(request.headers.get("cartesia-version"))
    server = state.settings.server
    try:
        raw = await read_body(request, server.max_request_bytes)
        data = load_client_json(raw)
    except RequestTooLarge as exc:
        raise CartesiaError(exc.message, error_code="request_too_large", status_code=413) from None
    except ClientJsonError as exc:
        raise invalid(f"The body is not valid JSON. {exc.message}", "invalid_json") from None
    generation = parse_generation(data, socket=False, containers=("raw",) if sse else CONTAINERS)
    check_model(generation.model_id, server.accepted_model_ids)
    return generation


async def speech_response(request: Request, state: AppState, *, sse: bool) -> Response:
    request_id = str(uuid.uuid4())
    try:
        generation = await read_generation(request, state, sse=sse)
        text = clean_transcript(generation.transcript, state.settings.server.max_input_chars)
        engine = state.ready_engine
        if engine is None:
            raise CartesiaError(
                state.not_ready_error().message, error_code="not_ready", status_code=503
            )
        voice = resolve_voice(engine, generation.voice_id)
        # a client that leaves while queued gives its place back at once
        reservation = await admit(
            engine, client_watch(request.scope, request.receive).gone(), voice=voice.id
        )
        if reservation is None:
            raise ClientDisconnect()
        try:
            body = await _open_body(state, engine, generation, text, voice, reservation, sse)
        finally:
            reservation.release()  # a no-op once submit used it
        try:
            await start_unless_client_gone(request, body)
        except BaseException:
            body.close()
            raise
    except (CartesiaError, PipelineError) as exc:
        # PipelineError: Rejected, NotReady, StreamFailed before the first audio
        error = exc if isinstance(exc, CartesiaError) else pipeline_error(exc)
        if error.status_code == 429:
            state.metrics.protocol_streams.labels(PROTOCOL, "rejected").inc()
        return error_json(error, request_id)
    state.metrics.protocol_streams.labels(PROTOCOL, "admitted").inc()
    headers = {"Cache-Control": "no-cache", "X-Request-Id": request_id}
    if sse:
        headers["X-Accel-Buffering"] = "no"
    media_type = SSE_CONTENT_TYPE if sse else body.content_type
    return SpeechResponse(body, media_type=media_type, headers=headers)


async def _open_body(
    state: AppState,
    engine: Engine,
    generation: Generation,
    text: str,
    voice: Voice,
    reservation: Any,
    sse: bool,
) -> CartesiaBody:
    spoken = await normalized(text, voice.language, state.settings.normalize)
    if not speakable(spoken):
        raise invalid(
            "Invalid 'transcript': nothing speakable is left after text normalization.",
            "nothing_to_speak",
        )
    encoder = open_output(generation.output_format, voice.sample_rate_hz, state.settings.encoding)
    try:
        stream = engine.submit(
            spoken, voice=voice.id, speed=generation.speed, reservation=reservation
        )
    except BaseException:
        encoder.close()
        raise
    return CartesiaBody(
        engine,
        stream,
        encoder,
        sse=sse,
        input_chars=len(text),
        inline_encode_max_s=state.settings.encoding.inline_encode_max_s,
        encoder_threads=state.encoder_threads,
        context_id=generation.context_id,
        timestamps=generation.add_timestamps,
        content_type=encoder.content_type,
    )


def sse_event(payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload, separators=(",", ":"))
    return f"event: {payload['type']}\ndata: {data}\n\n".encode()


class CartesiaBody(SpeechBody):
    """SpeechBody with Cartesia's SSE events (the audio body is SpeechBody's own)."""

    def __init__(
        self,
        *args: Any,
        context_id: str | None,
        timestamps: bool,
        content_type: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.context_id = context_id
        self.timestamps = timestamps
        self.content_type = content_type

    def _event(self, kind: str, **fields: Any) -> bytes:
        done = kind == "done"
        status = 200 if done else 206
        payload = {"type": kind, "done": done, "status_code": status, **fields}
        if self.context_id is not None:
            payload["context_id"] = self.context_id
        return sse_event(payload)

    def _chunk(self, data: bytes, step_ms: float) -> bytes:
        audio = base64.b64encode(data).decode()
        return self._event("chunk", data=audio, step_time=round(step_ms, 1))

    async def iter_bytes(self) -> AsyncGenerator[bytes, None]:
        if not self._sse:
            async for data in super().iter_bytes():
                yield data
            return
        stream = self._stream
        words = WordCursor(stream.alignment) if self.timestamps else None
        sent_s = 0.0
        last_s = time.perf_counter()
        try:
            async with aclosing(self._chunks), aclosing(self._pcm()) as chunks:
                async for pcm in chunks:
                    data = await self._encode(pcm)
                    sent_s += pcm.size / stream.sample_rate_hz
                    now_s = time.perf_counter()
                    if data:
                        yield self._chunk(data, 1000 * (now_s - last_s))
                    last_s = now_s
                    if words is not None and (taken := words.take(sent_s)) is not None:
                        yield self._event("timestamps", word_timestamps=taken)
            tail = self._call_encoder(self._encoder.finish)
        except (PipelineError, EncoderError, EncoderClosed, ValueError) as exc:
            logger.error("stream %s failed after the response started: %s", self.stream_id, exc)
            error = (
                pipeline_error(exc)
                if isinstance(exc, PipelineError)
                else CartesiaError(f"Audio encoding failed: {exc}", error_code="encoding_failed",
                                   status_code=500)
            )  # fmt: skip
            yield sse_event(error.event(self.stream_id, self.context_id))
            return
        if tail:
            yield self._chunk(tail, 0.0)
        if words is not None and (taken := words.take(math.inf)) is not None:
            yield self._event("timestamps", word_timestamps=taken)
        yield self._event("done")


@cartesia_router.post("/tts/bytes", response_model=None)
async def tts_bytes(request: Request, state: StateDep) -> Response:
    return await speech_response(request, state, sse=False)


@cartesia_router.post("/tts/sse", response_model=None)
async def tts_sse(request: Request, state: StateDep) -> Response:
    return await speech_response(request, state, sse=True)


def _voice_entry(state: AppState, voice: Voice) -> dict[str, Any]:
    created = datetime.fromtimestamp(state.created_s, UTC).isoformat()
    language = language_code(voice.language)
    return {
        "id": voice.id,
        "name": voice.name,
        "description": f"Playhead voice {voice.id} ({voice.language}, {voice.sample_rate_hz} Hz)",
        "tagline": "",
        "language": language,
        "locales": [{"locale": voice.language.replace("_", "-"), "is_native": True}],
        "is_owner": True,
        "access": "public",
        "visibility": "all",
        "created_at": created,
    }


@cartesia_router.get("/voices", response_model=None)
async def list_voices(request: Request, state: StateDep) -> Response:
    """Every voice in one page; `starting_after` / `ending_before` page as Cartesia's do."""
    engine = state.ready_engine
    if engine is None:
        error = CartesiaError(
            "The model is not loaded yet.", error_code="not_ready", status_code=503
        )
        return error_json(error, str(uuid.uuid4()))
    voices = engine.backend.voices()
    ids = [v.id for v in voices]
    after = request.query_params.get("starting_after")
    before = request.query_params.get("ending_before")
    if after in ids:
        voices = voices[ids.index(after) + 1 :]
    elif before in ids:
        voices = voices[: ids.index(before)]
    return JSONResponse(
        {"data": [_voice_entry(state, v) for v in voices], "has_more": False, "next_page": None}
    )


@cartesia_router.get("/voices/{voice_id}", response_model=None)
async def get_voice(voice_id: str, state: StateDep) -> Response:
    engine = state.ready_engine
    request_id = str(uuid.uuid4())
    if engine is None:
        error = CartesiaError(
            "The model is not loaded yet.", error_code="not_ready", status_code=503
        )
        return error_json(error, request_id)
    for voice in engine.backend.voices():
        if voice.id == voice_id:
            return JSONResponse(_voice_entry(state, voice))
    error = CartesiaError(f"Voice {voice_id!r} not found.", error_code="not_found", status_code=404)
    return error_json(error, request_id)


__all__ = ["PROTOCOL", "cartesia_router", "render_api_error"]

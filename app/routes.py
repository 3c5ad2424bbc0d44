"""HTTP routes (docs/api.md). The WebSocket endpoint (/v1/audio/speech/stream) and
the page at / are in app/ws/ (docs/websocket.md).

POST /v1/audio/speech validates everything, opens the encoder and submits to the engine
before the first byte, so every refusal (400, 404, 413, 429, 503) is a real status code;
only then does the streamed body start. Its body is read with a size limit
(`server.max_request_bytes`): a larger Content-Length is refused before anything is read,
and a body without one (chunked) is refused as soon as it passes the limit.

Routes get the AppState through the `StateDep` dependency (app/state.py). The pipeline's
exceptions propagate to the one handler (app/errors.py), which maps them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from app.admission_gate import RESERVATION_KEY
from app.audio import UnsupportedFormat, UnsupportedSampleRate, open_encoder
from app.client_json import quote
from app.disconnect import client_watch
from app.errors import (
    InvalidRequest,
    NotFound,
    RequestTooLarge,
    ServiceUnavailable,
    pipeline_api_error,
)
from app.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from app.request_id import REQUEST_ID_HEADER
from app.schemas import SpeechRequest, is_openai_voice, model_accepted, parse_speech_request
from app.state import AppState, StateDep
from app.streaming import SSE_CONTENT_TYPE, SpeechBody, SpeechResponse
from app.text_input import has_nul, normalized, words_apart
from pipeline import Engine, Rejected, StreamFailed, StreamStats, UnknownVoice, Voice
from pipeline.engine import Reservation
from pipeline.normalize import speakable

logger = logging.getLogger("playhead.app")


def _too_large(max_bytes: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"The request body is larger than the limit of {max_bytes} bytes.",
        code="request_too_large",
        # The rest of the body is never read: the connection cannot serve another request.
        headers={"Connection": "close"},
    )


async def capped_body(request: Request, max_bytes: int) -> AsyncIterator[bytes]:
    """The request body in the pieces it arrives in; RequestTooLarge once it is known to
    exceed `max_bytes` (at once when its Content-Length says so), the rest unread."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    received = 0
    async for part in request.stream():
        received += len(part)
        if received > max_bytes:
            raise _too_large(max_bytes)
        yield part


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, or RequestTooLarge once it is known to exceed `max_bytes`."""
    return b"".join([part async for part in capped_body(request, max_bytes)])


v1_router = APIRouter(prefix="/v1")
open_router = APIRouter()


def resolve_voice(engine: Engine, name: str) -> Voice:
    """A Playhead voice id, else an OpenAI voice name (-> the default voice), else 400."""
    try:
        return engine.resolve_voice(name)
    except UnknownVoice as exc:
        if is_openai_voice(name):
            return engine.resolve_voice(engine.backend.default_voice())
        raise pipeline_api_error(exc) from exc


async def start_unless_client_gone(request: Request, body: SpeechBody) -> None:
    """`await body.start()`, unless the client disconnects first: then ClientDisconnect.

    The request body was read already, so the request's watch (app/disconnect.py) sees
    only its http.disconnect; without this a client that left before the first audio
    would keep its stream until the first chunk was vocoded. Errors of `body.start()`
    propagate as they are."""
    await client_watch(request.scope, request.receive).unless_gone(body.start())


@v1_router.post("/audio/speech", response_model=None)
async def create_speech(request: Request, state: StateDep) -> Response:
    started_s = time.perf_counter()
    try:
        return await _create_speech(request, state)
    except Rejected:
        # how long a refusal took in here (app/admission_gate.py refuses most earlier)
        state.metrics.rejection_s.observe(time.perf_counter() - started_s)
        raise


async def _create_speech(request: Request, state: StateDep) -> Response:
    server = state.settings.server
    speech = parse_speech_request(await read_body(request, server.max_request_bytes))
    if not model_accepted(speech.model, server.accepted_model_ids):
        raise NotFound(
            f"The model {quote(speech.model)} does not exist. Available models: "
            f"{', '.join(server.accepted_model_ids)} (and any tts-1* or gpt-4o-mini-tts* id).",
            param="model",
            code="model_not_found",
        )
    if has_nul(speech.input):
        raise InvalidRequest(
            "Invalid 'input': it contains a NUL character (U+0000), which is not text.",
            param="input",
            code="invalid_value",
        )
    # other control characters (a form feed, a bell) separate words like a space
    text = words_apart(speech.input).strip()
    if not text:
        raise InvalidRequest(
            "Invalid 'input': it must contain at least 1 character after trimming whitespace.",
            param="input",
            code="string_below_min_length",
        )
    if len(text) > server.max_input_chars:
        raise InvalidRequest(
            f"Invalid 'input': {len(text)} characters, at most {server.max_input_chars} allowed.",
            param="input",
            code="string_above_max_length",
        )
    engine = state.require_engine()
    voice = resolve_voice(engine, speech.voice_id)
    # Admission was decided before the slow part (normalising in a thread, opening the
    # encoder), by app/admission_gate.py, which holds the reservation in the scope until
    # submit (so a burst cannot pass the check before any of its streams exist). None:
    # the gate found no engine ready (it became ready since): 503, retry shortly.
    reservation = request.scope.get(RESERVATION_KEY)
    if reservation is None:
        raise ServiceUnavailable(
            "The model is loading; retry shortly.",
            code="model_loading",
            headers={"Retry-After": "1"},
        )
    try:
        return await _admitted_speech(request, state, engine, speech, text, voice, reservation)
    finally:
        reservation.release()  # a no-op once submit used it


async def _admitted_speech(
    request: Request,
    state: AppState,
    engine: Engine,
    speech: SpeechRequest,
    text: str,
    voice: Voice,
    reservation: Reservation,
) -> Response:
    server = state.settings.server
    spoken = await normalized(text, voice.language, state.settings.normalize)
    if not speakable(spoken, voice.language):
        raise InvalidRequest(
            "Invalid 'input': nothing speakable is left after text normalization (the input "
            "has no words or numbers, only punctuation, symbols or emoji, or only a script "
            f"the voice's language ({voice.language}) cannot read).",
            param="input",
            code="nothing_to_speak",
        )
    sample_rate_hz = speech.sample_rate or server.default_sample_rate_hz
    try:
        encoder = open_encoder(
            speech.response_format,
            voice.sample_rate_hz,
            sample_rate_hz,
            encoding=state.settings.encoding,
        )
    except UnsupportedFormat as exc:
        raise InvalidRequest(str(exc), param="response_format", code="invalid_value") from exc
    except UnsupportedSampleRate as exc:
        raise InvalidRequest(str(exc), param="sample_rate", code="invalid_value") from exc
    try:
        # Rejected (429) and NotReady (503) propagate to the error handler
        stream = engine.submit(spoken, voice=voice.id, speed=speech.speed, reservation=reservation)
    except BaseException:
        encoder.close()
        raise
    sse = speech.stream_format == "sse"
    body = SpeechBody(
        engine,
        stream,
        encoder,
        sse=sse,
        input_chars=len(text),
        inline_encode_max_s=state.settings.encoding.inline_encode_max_s,
        encoder_threads=state.encoder_threads,
    )
    try:
        await start_unless_client_gone(request, body)
    except StreamFailed as exc:
        body.close()
        logger.error("stream %s failed before its first audio: %s", stream.id, exc)
        raise
    except BaseException:
        body.close()
        raise
    headers = {
        "Cache-Control": "no-cache",
        "X-Playhead-Stream-Id": stream.id,
        REQUEST_ID_HEADER: stream.id,
        "Server-Timing": server_timing(stream.stats),
    }
    if sse:
        headers["X-Accel-Buffering"] = "no"
    return SpeechResponse(
        body, media_type=SSE_CONTENT_TYPE if sse else encoder.content_type, headers=headers
    )


def server_timing(stats: StreamStats) -> str:
    """The `Server-Timing` header of a speech response (sent with its first audio): the
    wait for a start slot, then submit -> first audio, in ms."""
    timings = [f"start-wait;dur={stats.start_wait_s * 1000:.1f}"]
    if stats.ttfa_s is not None:
        timings.append(f"first-audio;dur={stats.ttfa_s * 1000:.1f}")
    return ", ".join(timings)


def _model_entry(state: AppState, model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": state.created_s, "owned_by": "playhead"}


@v1_router.get("/models")
async def list_models(state: StateDep) -> dict[str, Any]:
    ids = state.settings.server.accepted_model_ids
    return {"object": "list", "data": [_model_entry(state, model_id) for model_id in ids]}


@v1_router.get("/models/{model_id}")
async def get_model(state: StateDep, model_id: str) -> dict[str, Any]:
    if not model_accepted(model_id, state.settings.server.accepted_model_ids):
        raise NotFound(
            f"The model {quote(model_id)} does not exist.", param="model", code="model_not_found"
        )
    return _model_entry(state, model_id)


@v1_router.get("/audio/models")
async def list_audio_models(state: StateDep) -> dict[str, Any]:
    ids = state.settings.server.accepted_model_ids
    return {"models": [{"id": model_id} for model_id in ids]}


@v1_router.get("/audio/voices")
async def list_voices(state: StateDep) -> dict[str, Any]:
    engine = state.require_engine()
    voices = [
        {"id": v.id, "name": v.name, "language": v.language, "sample_rate": v.sample_rate_hz}
        for v in engine.backend.voices()
    ]
    return {"voices": voices}


@open_router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@open_router.get("/ready", response_model=None)
async def ready(state: StateDep) -> JSONResponse:
    if not state.ready:
        raise state.not_ready_error()
    return JSONResponse({"status": "ready"})


@open_router.get("/metrics")
async def metrics(state: StateDep) -> Response:
    engine = state.ready_engine
    stats = engine.stats() if engine is not None else None
    return Response(state.metrics.render(stats), media_type=METRICS_CONTENT_TYPE)

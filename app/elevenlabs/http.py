"""ElevenLabs' HTTP API (docs/elevenlabs.md):

    POST /v1/text-to-speech/{voice_id}[/stream]                   audio, streamed
    POST /v1/text-to-speech/{voice_id}/with-timestamps            one JSON: audio + alignment
    POST /v1/text-to-speech/{voice_id}/stream/with-timestamps     a JSON line per audio piece
    GET  /v1/voices, /v2/voices, /v1/voices/{voice_id}, /v1/models

Everything is checked before the first byte (400, 401, 404, 413, 429 with Retry-After,
503), answered in ElevenLabs' shape (app/elevenlabs/errors.py). Audio leaves as the engine
makes it; the alignment's times are seconds from the start of the request's audio.
GET /v1/models answers the OpenAI list unless the caller is an ElevenLabs client (it sent
`xi-api-key`, or is ElevenLabs' SDK): the two APIs share the path.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import suppress
from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

from app.disconnect import client_watch
from app.elevenlabs import errors
from app.elevenlabs.formats import BadOutputFormat, OutputFormat, parse_output_format
from app.elevenlabs.speech import Piece, Speech
from app.errors import (
    ApiError,
    InvalidRequest,
    NotFound,
    to_api_error,
    validation_error,
)
from app.routes import (
    list_models,
    read_body,
    start_unless_client_gone,
)
from app.state import AppState, StateDep
from app.streaming import SpeechResponse, StreamAborted
from app.text_input import has_nul, normalized, words_apart
from pipeline import Engine, UnknownVoice, Voice
from pipeline.admission import admit
from pipeline.alignment import CharTiming
from pipeline.normalize import speakable

logger = logging.getLogger("playhead.elevenlabs")

router = APIRouter()
PROTOCOL = "elevenlabs"
# ElevenLabs' own voice ids (20 letters and digits): one that is not a Playhead voice is
# spoken by the default voice, as OpenAI's voice names are (clients ship such defaults)
ELEVENLABS_VOICE_ID = re.compile(r"[A-Za-z0-9]{20}")
# ElevenLabs' text-to-speech models: all are served by the engine's voices
MODEL_IDS = (
    "eleven_flash_v2_5",
    "eleven_turbo_v2_5",
    "eleven_multilingual_v2",
    "eleven_flash_v2",
    "eleven_turbo_v2",
    "eleven_monolingual_v1",
)


class VoiceSettings(BaseModel):
    """Only speed changes the audio; stability, similarity_boost, style and
    use_speaker_boost are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")
    speed: float | None = Field(default=None, ge=0.25, le=4.0)
    stability: float | None = None
    similarity_boost: float | None = None
    style: float | None = None
    use_speaker_boost: bool | None = None


class TtsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # seed, previous_text, ...: accepted, unused
    text: str
    model_id: str | None = None
    language_code: str | None = None
    voice_settings: VoiceSettings | None = None
    apply_text_normalization: Literal["auto", "on", "off"] | None = None


def is_elevenlabs_client(headers: Mapping[str, str]) -> bool:
    return (
        "xi-api-key" in headers
        or headers.get("x-fern-sdk-name") == "elevenlabs"
        or headers.get("user-agent", "").startswith("elevenlabs")
    )


def resolve_voice(engine: Engine, voice_id: str) -> Voice:
    """A Playhead voice (id or name), else an ElevenLabs voice id -> the default voice,
    else 404 voice_not_found."""
    try:
        return engine.resolve_voice(voice_id)
    except UnknownVoice as exc:
        if ELEVENLABS_VOICE_ID.fullmatch(voice_id):
            return engine.resolve_voice(engine.backend.default_voice())
        raise NotFound(
            f"A voice with voice_id {voice_id!r} was not found. Available voices: "
            f"{', '.join(exc.available)} (ElevenLabs voice ids map to the default voice).",
            param="voice_id",
            code="voice_not_found",
        ) from exc


def output_format(value: str | None) -> OutputFormat:
    try:
        return parse_output_format(value)
    except BadOutputFormat as exc:
        raise InvalidRequest(str(exc), param="output_format", code="invalid_output_format") from exc


def clean_text(text: str, max_chars: int) -> str:
    """The text to speak (control characters as spaces, trimmed), or 400."""
    if has_nul(text):
        raise InvalidRequest("text contains a NUL character.", param="text", code="invalid_text")
    text = words_apart(text).strip()
    if not text:
        raise InvalidRequest("text must not be empty.", param="text", code="invalid_text")
    if len(text) > max_chars:
        raise InvalidRequest(
            f"text has {len(text)} characters; at most {max_chars} are accepted.",
            param="text",
            code="string_above_max_length",
        )
    return text


def http_alignment(chars: list[CharTiming], end_s: float | None) -> dict[str, list[Any]] | None:
    """Seconds from the start of the audio; `end_s` (the last piece's): the last character
    lasts to the end of the audio (pipecat starts its next request's clock there)."""
    if not chars:
        return None
    ends = [c.end_s for c in chars]
    if end_s is not None:
        ends[-1] = max(ends[-1], end_s)
    return {
        "characters": [c.char for c in chars],
        "character_start_times_seconds": [round(c.start_s, 3) for c in chars],
        "character_end_times_seconds": [round(end, 3) for end in ends],
    }


def timestamped(
    audio: bytes, chars: list[CharTiming], spoken: list[CharTiming], end_s: float | None
) -> dict[str, Any]:
    """`alignment`: the client's characters; `normalized_alignment`: the spoken text's
    ("five dollars" for "$5"), as ElevenLabs sends them."""
    return {
        "audio_base64": base64.b64encode(audio).decode(),
        "alignment": http_alignment(chars, end_s),
        "normalized_alignment": http_alignment(spoken, end_s),
    }


async def guarded(state: AppState, work: Awaitable[Response]) -> Response:
    """`work`'s response, or its error in ElevenLabs' shape (counted by protocol)."""
    try:
        return await work
    except ClientDisconnect:
        raise
    except Exception as exc:
        error = to_api_error(exc)
        if error.status_code >= 500 and not isinstance(exc, ApiError):
            logger.exception("elevenlabs request failed")
        if error.status_code == 429:
            state.metrics.protocol_streams.labels(PROTOCOL, "rejected").inc()
        return errors.error_response(error)


async def _speech(request: Request, state: AppState, voice_id: str) -> Speech:
    """Parse, check, admit and submit: the request's Speech, its stream under way."""
    server = state.settings.server
    raw = await read_body(request, server.max_request_bytes)
    try:
        body = TtsRequest.model_validate_json(raw)
    except ValidationError as exc:
        if any(e.get("type") == "json_invalid" for e in exc.errors()):
            message = "The request body is not valid JSON."
            raise InvalidRequest(message, code="invalid_json") from exc
        raise validation_error(exc.errors()) from exc
    output = output_format(request.query_params.get("output_format"))
    text = clean_text(body.text, server.max_input_chars)
    engine = state.require_engine()
    voice = resolve_voice(engine, voice_id)
    normalize = body.apply_text_normalization != "off"
    spoken = text
    if normalize:
        spoken = await normalized(text, voice.language, state.settings.normalize)
    if not speakable(spoken):
        raise InvalidRequest(
            "Nothing speakable is left after text normalization (no words or numbers).",
            param="text",
            code="invalid_text",
        )
    speed = body.voice_settings.speed if body.voice_settings else None
    speech = Speech(
        engine, voice, output, state.settings, state.encoder_threads, speed=speed or 1.0
    )
    # a client that leaves while queued gives its place back at once
    reservation = await admit(
        engine, client_watch(request.scope, request.receive).gone(), voice=voice.id
    )
    if reservation is None:
        raise ClientDisconnect()
    try:
        speech.start(spoken, final=True, reservation=reservation, normalized=True)
    except ValueError as exc:  # the encoder refused the format (checked above: a bug)
        code = "invalid_output_format"
        raise InvalidRequest(str(exc), param="output_format", code=code) from exc
    finally:
        reservation.release()  # a no-op once submit used it
    state.metrics.protocol_streams.labels(PROTOCOL, "admitted").inc()
    speech.text_chars = len(text)
    return speech


class PiecesBody:
    """A response body over a Speech's pieces, for app/streaming.py's SpeechResponse: the
    first piece is awaited before the response starts (a failure is still a status)."""

    def __init__(self, speech: Speech, render: Callable[[Piece], bytes]) -> None:
        self._speech = speech
        self._render = render
        self._pieces = speech.pieces()
        self._first: Piece | None = None

    @property
    def stream_id(self) -> str:
        return self._speech.stream.id if self._speech.stream is not None else "-"

    async def start(self) -> None:
        with suppress(StopAsyncIteration):
            self._first = await anext(self._pieces)
        if self._first is None and self._speech.failure is not None:
            raise ApiError(f"Speech generation failed: {self._speech.failure}")

    async def iter_bytes(self) -> AsyncGenerator[bytes, None]:
        try:
            if self._first is not None:
                first, self._first = self._first, None
                yield self._render(first)
            async for piece in self._pieces:
                data = self._render(piece)
                if data:
                    yield data
        finally:
            await self._pieces.aclose()
        if self._speech.failure is not None:
            logger.error("stream %s failed mid-way: %s", self.stream_id, self._speech.failure)
            raise StreamAborted(self._speech.failure)

    def close(self) -> None:
        self._speech.close()


def _ndjson(piece: Piece) -> bytes:
    if not piece.audio and not piece.chars and not piece.spoken:
        return b""
    line = timestamped(piece.audio, piece.chars, piece.spoken, piece.end_s if piece.last else None)
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


async def _streamed(request: Request, state: AppState, voice_id: str, lines: bool) -> Response:
    speech = await _speech(request, state, voice_id)
    body = PiecesBody(speech, _ndjson if lines else (lambda piece: piece.audio))
    try:
        await start_unless_client_gone(request, body)  # type: ignore[arg-type]
    except BaseException:
        body.close()
        raise
    assert speech.stream is not None
    headers = {
        "Cache-Control": "no-cache",
        "request-id": speech.stream.id,
        "x-character-count": str(speech.text_chars),
    }
    media_type = "application/json" if lines else speech.output.content_type
    return SpeechResponse(body, media_type=media_type, headers=headers)  # type: ignore[arg-type]


async def _whole_with_timestamps(request: Request, state: AppState, voice_id: str) -> Response:
    speech = await _speech(request, state, voice_id)
    audio, chars, spoken, end_s = bytearray(), [], [], 0.0
    try:
        async for piece in speech.pieces():
            audio += piece.audio
            chars += piece.chars
            spoken += piece.spoken
            end_s = piece.end_s
    finally:
        speech.close()
    if speech.failure is not None:
        raise ApiError(f"Speech generation failed: {speech.failure}")
    assert speech.stream is not None
    headers = {"request-id": speech.stream.id, "x-character-count": str(speech.text_chars)}
    return JSONResponse(timestamped(bytes(audio), chars, spoken, end_s), headers=headers)


@router.post("/v1/text-to-speech/{voice_id}", response_model=None)
@router.post("/v1/text-to-speech/{voice_id}/stream", response_model=None)
async def text_to_speech(request: Request, state: StateDep, voice_id: str) -> Response:
    return await guarded(state, _streamed(request, state, voice_id, lines=False))


@router.post("/v1/text-to-speech/{voice_id}/stream/with-timestamps", response_model=None)
async def stream_with_timestamps(request: Request, state: StateDep, voice_id: str) -> Response:
    return await guarded(state, _streamed(request, state, voice_id, lines=True))


@router.post("/v1/text-to-speech/{voice_id}/with-timestamps", response_model=None)
async def with_timestamps(request: Request, state: StateDep, voice_id: str) -> Response:
    return await guarded(state, _whole_with_timestamps(request, state, voice_id))


def voice_entry(voice: Voice) -> dict[str, Any]:
    return {
        "voice_id": voice.id,
        "name": voice.name,
        "category": "premade",
        "labels": {"language": voice.language},
        "description": f"Playhead voice ({voice.language}, {voice.sample_rate_hz} Hz)",
        "preview_url": None,
        "available_for_tiers": [],
        "settings": None,
        "high_quality_base_model_ids": list(MODEL_IDS),
    }


async def _voices(state: AppState) -> Response:
    voices = [voice_entry(v) for v in state.require_engine().backend.voices()]
    return JSONResponse(
        {"voices": voices, "has_more": False, "total_count": len(voices), "next_page_token": None}
    )


@router.get("/v1/voices", response_model=None)
@router.get("/v2/voices", response_model=None)
async def get_voices(state: StateDep) -> Response:
    return await guarded(state, _voices(state))


async def _voice(state: AppState, voice_id: str) -> Response:
    engine = state.require_engine()
    try:
        voice = engine.resolve_voice(voice_id)
    except UnknownVoice as exc:
        raise NotFound(
            f"A voice with voice_id {voice_id!r} was not found.",
            param="voice_id",
            code="voice_not_found",
        ) from exc
    return JSONResponse(voice_entry(voice))


@router.get("/v1/voices/{voice_id}", response_model=None)
async def get_voice(state: StateDep, voice_id: str) -> Response:
    return await guarded(state, _voice(state, voice_id))


def model_entry(model_id: str, max_chars: int, languages: list[str]) -> dict[str, Any]:
    return {
        "model_id": model_id,
        "name": model_id,
        "can_be_finetuned": False,
        "can_do_text_to_speech": True,
        "can_do_voice_conversion": False,
        "can_use_style": False,
        "can_use_speaker_boost": False,
        "serves_pro_voices": False,
        "token_cost_factor": 1.0,
        "description": "Served by Playhead's voices (GET /v1/voices).",
        "requires_alpha_access": False,
        "maximum_text_length_per_request": max_chars,
        "languages": [{"language_id": code, "name": code} for code in languages],
    }


@router.get("/v1/models", response_model=None)
async def get_models(request: Request, state: StateDep) -> Any:
    if not is_elevenlabs_client(request.headers):
        return await list_models(state)
    engine = state.ready_engine
    voices = engine.backend.voices() if engine is not None else []
    languages = sorted({v.language.split("_")[0] for v in voices})
    max_chars = state.settings.server.max_input_chars
    return JSONResponse([model_entry(m, max_chars, languages) for m in MODEL_IDS])

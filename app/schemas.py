"""Request models of the HTTP API (docs/api.md), validated strictly.

The body is parsed here rather than by FastAPI so that a missing or odd Content-Type,
malformed JSON, a non-object body, an unknown field and a wrong type all become the same
400 envelope naming the field. Rules that depend on settings or on the loaded voices
(model ids, input length, voice names) are checked by the route.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.client_json import ClientJsonError, load_client_json
from app.errors import InvalidRequest, json_type_name, validation_error

OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "onyx",
    "nova",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)
# OpenAI's model families: any id of the family (dated snapshots, "-hd") is accepted.
OPENAI_MODEL_FAMILIES = ("tts-1", "gpt-4o-mini-tts")
MAX_INSTRUCTIONS_CHARS = 4096
MIN_SPEED = 0.25
MAX_SPEED = 4.0
MIN_SAMPLE_RATE_HZ = 8000
MAX_SAMPLE_RATE_HZ = 48000

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
StreamFormat = Literal["audio", "sse"]


class VoiceRef(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    id: str


class SpeechRequest(BaseModel):
    """POST /v1/audio/speech. `sample_rate` None means the server's default."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    input: str
    voice: str | VoiceRef
    instructions: str | None = Field(default=None, max_length=MAX_INSTRUCTIONS_CHARS)
    response_format: ResponseFormat = "mp3"
    speed: float = Field(default=1.0, ge=MIN_SPEED, le=MAX_SPEED)
    stream_format: StreamFormat = "audio"
    sample_rate: int | None = Field(default=None, ge=MIN_SAMPLE_RATE_HZ, le=MAX_SAMPLE_RATE_HZ)

    @property
    def voice_id(self) -> str:
        return self.voice if isinstance(self.voice, str) else self.voice.id


def model_accepted(model_id: str, listed: tuple[str, ...] | list[str]) -> bool:
    """A listed id (exact), or an id of an OpenAI family: `tts-1*`, `gpt-4o-mini-tts*`."""
    return model_id in listed or any(
        model_id == family or model_id.startswith(family + "-") for family in OPENAI_MODEL_FAMILIES
    )


def is_openai_voice(name: str) -> bool:
    """OpenAI's voice names, in any case ("Nova", "ALLOY")."""
    return name.strip().lower() in OPENAI_VOICES


def parse_speech_request(body: bytes) -> SpeechRequest:
    """Bytes of a request body -> SpeechRequest, or InvalidRequest naming the field."""
    try:
        data = load_client_json(body)
    except ClientJsonError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request. {exc.message}", code=exc.code
        ) from None
    if not isinstance(data, dict):
        raise validation_error([{"type": "model_type", "loc": (), "input": data}])
    # An explicit null for an optional field means "not given", as OpenAI treats it.
    data = {key: value for key, value in data.items() if not (value is None and key in _NULLABLE)}
    try:
        return SpeechRequest.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None


_NULLABLE = frozenset({"instructions", "response_format", "speed", "stream_format", "sample_rate"})


def _first_error(exc: ValidationError) -> InvalidRequest:
    errors = exc.errors(include_url=False)
    if errors[0]["loc"][:1] != ("voice",) or len(errors[0]["loc"]) < 2:
        return validation_error(errors)
    # voice is a union (a name or {"id": ...}): pydantic reports one error per member,
    # located under the member's name. An object gets the object's own error.
    for err in errors:
        loc = err["loc"]
        if loc[:2] == ("voice", "VoiceRef") and len(loc) > 2:
            return validation_error([{**err, "loc": ("voice", *loc[2:])}])
    return InvalidRequest(
        "Invalid type for 'voice': expected a voice name or an object {\"id\": <voice id>}, "
        f"but got {json_type_name(errors[0]['input'])} instead.",
        param="voice",
        code="invalid_type",
    )

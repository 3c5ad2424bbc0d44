"""The body of POST /v1/audio/jobs: JSON shaped like the speech request, or the file.

JSON: `input` (the text), `voice`, and optionally `model`, `response_format` (mp3, opus,
aac, flac, wav, pcm), `speed`, `sample_rate`, `title`, `finish_by` (an ISO 8601 time with
a zone, or unix seconds). A file: the body is the text (UTF-8; text/plain or
text/markdown), the same options in the query string (`?voice=...&title=...`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.client_json import ClientJsonError, load_client_json
from app.errors import InvalidRequest, validation_error
from app.schemas import (
    MAX_SAMPLE_RATE_HZ,
    MAX_SPEED,
    MIN_SAMPLE_RATE_HZ,
    MIN_SPEED,
    ResponseFormat,
    VoiceRef,
)

MAX_TITLE_CHARS = 300


class _JobBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    input: str
    voice: str | VoiceRef
    response_format: ResponseFormat = "mp3"
    speed: float = Field(default=1.0, ge=MIN_SPEED, le=MAX_SPEED)
    sample_rate: int | None = Field(default=None, ge=MIN_SAMPLE_RATE_HZ, le=MAX_SAMPLE_RATE_HZ)
    title: str | None = Field(default=None, max_length=MAX_TITLE_CHARS)
    finish_by: str | float | None = None


@dataclass(frozen=True, slots=True)
class JobRequest:
    input: str
    voice: str
    response_format: str
    speed: float
    sample_rate: int | None
    title: str | None
    finish_by_s: float | None  # unix seconds


def _finish_by_s(value: str | float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and value > 0:
            return float(value)
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed.timestamp()
    raise InvalidRequest(
        "Invalid 'finish_by': expected an ISO 8601 time with a zone "
        "(2026-12-05T18:00:00Z) or unix seconds.",
        param="finish_by",
        code="invalid_value",
    )


def _request(data: dict[str, Any]) -> JobRequest:
    data = {k: v for k, v in data.items() if v is not None or k == "input"}
    try:
        body = _JobBody.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False)) from None
    voice = body.voice if isinstance(body.voice, str) else body.voice.id
    return JobRequest(
        input=body.input,
        voice=voice,
        response_format=body.response_format,
        speed=body.speed,
        sample_rate=body.sample_rate,
        title=body.title.strip() or None if body.title is not None else None,
        finish_by_s=_finish_by_s(body.finish_by),
    )


def parse_job_request(body: bytes) -> JobRequest:
    try:
        data = load_client_json(body)
    except ClientJsonError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request. {exc.message}", code=exc.code
        ) from None
    if not isinstance(data, dict):
        raise validation_error([{"type": "model_type", "loc": (), "input": data}])
    return _request(data)


_NUMBERS = {"speed": float, "sample_rate": int}


def parse_job_upload(body: bytes, query: dict[str, str]) -> JobRequest:
    """A text file as the body, the options from the query string."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"The uploaded file is not UTF-8 text (byte {exc.start} is not): send a .txt or "
            ".md file.",
            param="file",
            code="invalid_file",
        ) from None
    if "\x00" in text:
        raise InvalidRequest(
            "The uploaded file contains NUL bytes: a binary file is not text.",
            param="file",
            code="invalid_file",
        )
    data: dict[str, Any] = {"input": text.removeprefix("\ufeff")}
    for key, value in query.items():
        if key in ("input",):
            raise InvalidRequest("'input' is the body itself.", param="input")
        if key in _NUMBERS:
            try:
                data[key] = _NUMBERS[key](value)
            except ValueError:
                raise InvalidRequest(f"Invalid '{key}': {value!r}.", param=key) from None
        elif key == "finish_by":
            try:
                data[key] = float(value)
            except ValueError:
                data[key] = value
        else:
            data[key] = value
    return _request(data)

"""/v1/audio/jobs: long texts rendered as jobs (docs/jobs.md).

POST (JSON like the speech request, or the file itself as a text/plain or text/markdown
body with the options in the query) -> 202 with the job; GET (a page), GET one, GET its
audio (what is made, then following; a Range once done), GET its timestamps, DELETE.
Errors in OpenAI's envelope (app/errors.py). A job is visible only to the API key that
created it (a digest of the key is its owner); without a key, to everyone.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse

from app.audio import UnsupportedFormat, UnsupportedSampleRate, encoded_rate_hz
from app.client_json import quote
from app.errors import ApiError, InvalidRequest, NotFound, RateLimited
from app.jobs.audio import JobGone, encoded_audio, write_final
from app.jobs.job import Job, JobState, JobStoreError, new_job_id
from app.jobs.runner import JobRunner
from app.jobs.schema import JobRequest, parse_job_request, parse_job_upload
from app.jobs.store import JobStore
from app.jobs.text import chapters, cut_segments
from app.jobs.upload import checked_upload, parse_multipart_job, upload_limit_bytes
from app.routes import read_body, resolve_voice
from app.security import CREDENTIAL_HEADERS
from app.state import AppState, StateDep
from app.text_input import has_nul
from scheduling.jobs import JobDemand, check_finish_by, promised_rate

jobs_router = APIRouter(prefix="/v1/audio/jobs")

MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
PAGE_MAX = 100


class InsufficientStorage(ApiError):
    status_code = 507
    error_type = "server_error"


class JobConflict(ApiError):
    status_code = 409
    error_type = "invalid_request_error"


def runner_of(state: AppState) -> JobRunner:
    runner = next((s for s in state.services if isinstance(s, JobRunner)), None)
    if runner is None or runner.store is None:
        raise NotFound("Jobs are not served here.", code="jobs_disabled")
    return runner


def owner_of(request: Request, state: AppState) -> str:
    if state.settings.server.api_key is None:
        return ""
    for header, extract in CREDENTIAL_HEADERS.items():
        key = extract(request.headers.get(header, ""))
        if key:
            return hashlib.sha256(key.encode()).hexdigest()
    return ""


def _job_or_404(store: JobStore, job_id: str, owner: str) -> Job:
    try:
        job = store.get(job_id) if len(job_id) <= 64 else None
    except JobStoreError as exc:
        raise JobConflict(
            f"The job {quote(job_id)} cannot be read: {exc}.", code="job_corrupt"
        ) from None
    if job is None or job.owner != owner:  # another key's job is not found, not forbidden
        raise NotFound(f"No job {quote(job_id)}.", param="job_id", code="job_not_found")
    return job


def _iso(unix_s: float | None) -> str | None:
    if unix_s is None or not math.isfinite(unix_s):
        return None
    return datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _capacity_view(
    state: AppState, runner: JobRunner, exclude: str | None
) -> tuple[float, float, float]:
    """(capacity, live streams with work left, rate promised to deadline jobs)."""
    engine = state.ready_engine
    if engine is None:
        return 0.0, 0.0, 0.0
    live = sum(1 for load in engine.book.loads(0.0) if load.units == 1.0)
    store = runner.store
    assert store is not None
    demands = []
    for job_id in store.ids():
        job = store.get(job_id)
        if job is None or job.state.finished or job.finish_by_s is None or job_id == exclude:
            continue
        demands.append(JobDemand(_audio_left_s(store, runner, job), job.finish_by_s))
    return engine.capacity(), float(live), promised_rate(demands, time.time())


def _audio_left_s(store: JobStore, runner: JobRunner, job: Job) -> float:
    progress = store.progress(job.id)
    chars_left = job.text_chars - progress.chars_done
    return max(0.0, chars_left * runner.audio_s_per_char / job.speed)


def _view(state: AppState, runner: JobRunner, job: Job) -> dict[str, Any]:
    """The job as the API shows it; a job whose rows do not read is failed, with why."""
    try:
        return _view_of(state, runner, job)
    except JobStoreError as exc:
        store = runner.store
        assert store is not None
        if not job.state.finished or job.error is None:
            store.set_state(job.id, JobState.FAILED, error=str(exc), at_s=time.time())
        failed = store.get(job.id) or job
        return {
            "id": job.id,
            "object": "audio.job",
            "title": job.title,
            "state": JobState.FAILED.value,
            "created_at": _iso(job.created_s),
            "finished_at": _iso(failed.finished_s),
            "error": failed.error,
        }


def _view_of(state: AppState, runner: JobRunner, job: Job) -> dict[str, Any]:
    store = runner.store
    assert store is not None
    progress = store.progress(job.id)
    made = store.made(job.id)
    segments = store.segments(job.id)
    starts = {m.index: m.start_sample / job.sample_rate_hz for m in made}
    predicted = None
    if job.state is JobState.DONE:
        predicted = job.finished_s
    elif not job.state.finished:
        capacity, live, promised = _capacity_view(state, runner, job.id)
        left_s = _audio_left_s(store, runner, job)
        if left_s > 0:
            check = check_finish_by(
                audio_s=left_s,
                finish_by_s=None,
                now_s=time.time(),
                capacity_audio_s_per_s=capacity,
                live_streams=live,
                promised_audio_s_per_s=promised,
            )
            predicted = check.predicted_finish_s
    base = f"/v1/audio/jobs/{job.id}"
    return {
        "id": job.id,
        "object": "audio.job",
        "title": job.title,
        "state": job.state.value,
        "voice": job.voice,
        "speed": job.speed,
        "response_format": job.response_format,
        "sample_rate": job.output_rate_hz,
        "created_at": _iso(job.created_s),
        "finish_by": _iso(job.finish_by_s),
        "finished_at": _iso(job.finished_s),
        "predicted_finish_at": _iso(predicted),
        "error": job.error,
        "progress": {
            "characters": job.text_chars,
            "characters_done": progress.chars_done,
            "segments": progress.segments,
            "segments_done": progress.made,
            "audio_seconds": round(progress.samples / job.sample_rate_hz, 3),
        },
        "chapters": [
            {
                "title": chapter.title,
                "character": segments[chapter.segment].start,
                "start_s": round(starts[chapter.segment], 3) if chapter.segment in starts else None,
            }
            for chapter in chapters(segments)
        ],
        "audio_url": f"{base}/audio",
        "timestamps_url": f"{base}/timestamps",
    }


@jobs_router.post("", response_model=None, status_code=202)
async def create_job(request: Request, state: StateDep) -> JSONResponse:
    runner = runner_of(state)
    config = runner.config
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "multipart/form-data":
        job_request = await parse_multipart_job(request, config)
    elif content_type in ("text/plain", "text/markdown", "text/x-markdown"):
        body = await read_body(request, upload_limit_bytes(config))
        job_request = checked_upload(parse_job_upload(body, dict(request.query_params)), config)
    elif content_type in ("application/json", ""):
        job_request = parse_job_request(await read_body(request, config.max_request_bytes))
    else:
        raise ApiError(
            f"Content-Type {quote(content_type)} is not taken: send JSON, a .txt or .md file "
            "as multipart/form-data (field 'file', the options as form fields), or the file "
            "itself as text/plain or text/markdown with the options in the query string.",
            code="unsupported_media_type",
            status_code=415,
        )
    return await _create(request, state, runner, job_request)


async def _create(
    request: Request, state: AppState, runner: JobRunner, job_request: JobRequest
) -> JSONResponse:
    config = runner.config
    store = runner.store
    assert store is not None
    text = job_request.input
    if has_nul(text):
        raise InvalidRequest(
            "Invalid 'input': it contains a NUL character: a binary file is not text.",
            param="input",
            code="invalid_value",
        )
    if not text.strip():
        raise InvalidRequest("Invalid 'input': it is empty.", param="input", code="empty_input")
    if len(text) > config.max_text_chars:
        raise InvalidRequest(
            f"Invalid 'input': {len(text)} characters, at most {config.max_text_chars} allowed "
            "(jobs.max_text_chars).",
            param="input",
            code="string_above_max_length",
        )
    engine = state.require_engine()
    voice = resolve_voice(engine, job_request.voice)
    server = state.settings.server
    try:
        output_rate_hz = encoded_rate_hz(
            job_request.response_format, job_request.sample_rate or server.default_sample_rate_hz
        )
    except (UnsupportedFormat, UnsupportedSampleRate) as exc:
        raise InvalidRequest(str(exc), param="response_format", code="invalid_value") from exc
    owner = owner_of(request, state)
    if store.count(owner) >= config.jobs_per_key:
        raise RateLimited(
            f"This API key holds {config.jobs_per_key} jobs, the most allowed "
            "(jobs.jobs_per_key): delete one first.",
            retry_after_s=60,
            code="too_many_jobs",
        )
    used = store.disk_bytes()
    if used >= config.max_disk_gb * 1e9:
        raise InsufficientStorage(
            f"The jobs' disk limit is reached ({used / 1e9:.2f} GB of jobs.max_disk_gb = "
            f"{config.max_disk_gb:g}): delete finished jobs first.",
            code="insufficient_storage",
        )
    now_s = time.time()
    finish_by_s = job_request.finish_by_s
    if finish_by_s is not None:
        if finish_by_s <= now_s:
            raise InvalidRequest(
                f"Invalid 'finish_by': {_iso(finish_by_s)} is not in the future.",
                param="finish_by",
                code="invalid_value",
            )
        capacity, live, promised = _capacity_view(state, runner, None)
        audio_s = len(text) * runner.audio_s_per_char / job_request.speed
        check = check_finish_by(
            audio_s=audio_s,
            finish_by_s=finish_by_s,
            now_s=now_s,
            capacity_audio_s_per_s=capacity,
            live_streams=live,
            promised_audio_s_per_s=promised,
            headroom=state.settings.admission.capacity_headroom,
        )
        if not check.feasible:
            when = _iso(check.predicted_finish_s) or "never (no capacity is left)"
            raise InvalidRequest(
                f"Invalid 'finish_by': {_iso(finish_by_s)} cannot be met; about {audio_s:.0f} s "
                f"of audio at the {check.spare_rate:.2f}x the capacity leaves would finish at "
                f"{when}.",
                param="finish_by",
                code="finish_by_unreachable",
            )
    segments = cut_segments(text, config.segment_chars)
    job = Job(
        id=new_job_id(),
        owner=owner,
        title=job_request.title,
        state=JobState.QUEUED,
        voice=voice.id,
        speed=job_request.speed,
        response_format=job_request.response_format,
        sample_rate_hz=voice.sample_rate_hz,
        output_rate_hz=output_rate_hz,
        finish_by_s=finish_by_s,
        created_s=now_s,
        finished_s=None,
        text_chars=len(text),
        error=None,
    )
    await _to_thread(store.create, job, text, segments)
    runner.wake()
    return JSONResponse(
        _view(state, runner, job),
        status_code=202,
        headers={"Location": f"/v1/audio/jobs/{job.id}"},
    )


async def _to_thread(function: Any, *args: Any) -> Any:
    return await asyncio.to_thread(function, *args)


@jobs_router.get("", response_model=None)
async def list_jobs(
    request: Request, state: StateDep, limit: int = 20, after: str | None = None
) -> JSONResponse:
    runner = runner_of(state)
    store = runner.store
    assert store is not None
    if not 1 <= limit <= PAGE_MAX:
        raise InvalidRequest(f"limit must be 1..{PAGE_MAX}.", param="limit", code="invalid_value")
    owner = owner_of(request, state)
    if after is not None:
        _job_or_404(store, after, owner)
    ids = store.page(owner, after, limit + 1)
    data = []
    for job_id in ids[:limit]:
        try:
            job = store.get(job_id)
        except JobStoreError:
            continue
        if job is not None:
            data.append(_view(state, runner, job))
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "has_more": len(ids) > limit,
            "last_id": data[-1]["id"] if data else None,
        }
    )


@jobs_router.get("/{job_id}", response_model=None)
async def get_job(job_id: str, request: Request, state: StateDep) -> JSONResponse:
    runner = runner_of(state)
    assert runner.store is not None
    job = _job_or_404(runner.store, job_id, owner_of(request, state))
    return JSONResponse(_view(state, runner, job))


@jobs_router.get("/{job_id}/timestamps", response_model=None)
async def get_timestamps(job_id: str, request: Request, state: StateDep) -> JSONResponse:
    runner = runner_of(state)
    store = runner.store
    assert store is not None
    job = _job_or_404(store, job_id, owner_of(request, state))
    words = []
    for made in store.made(job.id):
        offset_s = made.start_sample / job.sample_rate_hz
        for word, start, end, start_s, end_s in made.words:  # type: ignore[misc]
            words.append(
                {
                    "word": word,
                    "start_index": start,
                    "end_index": end,
                    "start_s": round(offset_s + start_s, 4),
                    "end_s": round(offset_s + end_s, 4),
                }
            )
    return JSONResponse(
        {
            "object": "audio.job.timestamps",
            "id": job.id,
            "complete": job.state is JobState.DONE,
            "words": words,
        }
    )


@jobs_router.get("/{job_id}/audio", response_model=None)
async def get_audio(
    job_id: str, request: Request, state: StateDep, offset_bytes: int = 0
) -> Response:
    runner = runner_of(state)
    store = runner.store
    assert store is not None
    job = _job_or_404(store, job_id, owner_of(request, state))
    if job.state is JobState.FAILED:
        raise JobConflict(f"The job failed: {job.error}", code="job_failed")
    if offset_bytes < 0:
        raise InvalidRequest("offset_bytes must be >= 0.", param="offset_bytes")
    media_type = MEDIA_TYPES[job.response_format]
    encoding = state.settings.encoding
    if job.state is JobState.DONE and offset_bytes == 0:
        problem = store.check_files(job)
        if problem is not None and not store.final_path(job.id, job.response_format).exists():
            store.set_state(job.id, JobState.FAILED, error=problem, at_s=time.time())
            raise JobConflict(f"The job's audio is lost: {problem}.", code="job_failed")
        final = await write_final(store, job, encoding)
        return FileResponse(final, media_type=media_type)

    async def body() -> Any:
        skip = offset_bytes
        # a listener from the start: its player runs dry once it played all that is made
        with runner.listening(job.id, 0.0):
            try:
                async for data in encoded_audio(
                    store, job.id, encoding, changed=lambda: runner.changed(job.id)
                ):
                    if skip >= len(data):
                        skip -= len(data)
                        continue
                    yield data[skip:]
                    skip = 0
            except (JobGone, JobStoreError) as exc:
                # after the first byte an error cannot be a status: the body is cut
                raise RuntimeError(f"job {job.id}: {exc}") from exc

    return StreamingResponse(body(), media_type=media_type, headers={"X-Playhead-Job-Id": job.id})


@jobs_router.delete("/{job_id}", response_model=None)
async def delete_job(job_id: str, request: Request, state: StateDep) -> JSONResponse:
    runner = runner_of(state)
    store = runner.store
    assert store is not None
    job = _job_or_404(store, job_id, owner_of(request, state))
    await runner.cancel(job.id)
    try:
        await _to_thread(store.delete, job.id)
    finally:
        runner.deleted(job.id)  # its downloads end (cut: they cannot become a status now)
    return JSONResponse({"id": job.id, "object": "audio.job.deleted", "deleted": True})

"""What a job is, as the store keeps it: its state, its row, the segments made and its
progress, the database's tables (app/jobs/store.py reads and writes them), and its id.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass

BYTES_PER_SAMPLE = 2  # s16le


class JobState(enum.Enum):
    QUEUED = "queued"  # accepted; no segment rendered yet
    RENDERING = "rendering"  # some segments made, more to come
    DONE = "done"  # every segment made and durable
    FAILED = "failed"  # stopped with `error` (disk full, a file deleted, a corrupt row ...)

    @property
    def finished(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED)


class JobStoreError(RuntimeError):
    """The store cannot serve a job (its row or its files are not what they should be)."""


# the database: one row per job, per segment of its text, per segment made
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,           -- a digest of the API key that created it ('' without keys)
    title TEXT,
    state TEXT NOT NULL,
    voice TEXT NOT NULL,
    speed REAL NOT NULL,
    response_format TEXT NOT NULL,
    sample_rate_hz INTEGER NOT NULL,  -- of the stored PCM (the voice's)
    output_rate_hz INTEGER NOT NULL,  -- of the encoded audio
    finish_by_s REAL,              -- unix time, or NULL: best effort
    created_s REAL NOT NULL,
    finished_s REAL,
    text TEXT NOT NULL,
    error TEXT,
    runner TEXT,                   -- the runner that renders it (several replicas share a store)
    lease_until_s REAL             -- ... until then (unix time); renewed while it renders
);
CREATE TABLE IF NOT EXISTS segments (
    job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    text_start INTEGER NOT NULL,
    text_end INTEGER NOT NULL,
    chapter TEXT,
    PRIMARY KEY (job_id, idx)
);
CREATE TABLE IF NOT EXISTS made (
    job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    start_sample INTEGER NOT NULL,  -- where this segment starts in the job's audio
    samples INTEGER NOT NULL,
    words TEXT NOT NULL,            -- JSON [[word, start_index, end_index, start_s, end_s]]
    PRIMARY KEY (job_id, idx)
);
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs(owner, created_s);
"""


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    owner: str
    title: str | None
    state: JobState
    voice: str
    speed: float
    response_format: str
    sample_rate_hz: int
    output_rate_hz: int
    finish_by_s: float | None
    created_s: float
    finished_s: float | None
    text_chars: int
    error: str | None


@dataclass(frozen=True, slots=True)
class MadeSegment:
    index: int
    start_sample: int
    samples: int
    words: list[list[object]]


@dataclass(frozen=True, slots=True)
class Progress:
    segments: int  # segments in all
    made: int  # segments made and durable
    chars_done: int  # characters of the text through the last segment made
    samples: int  # audio made, in samples at the job's sample_rate_hz


def new_job_id() -> str:
    """128 random bits: a job id cannot be guessed."""
    return "job_" + secrets.token_urlsafe(16)

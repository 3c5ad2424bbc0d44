"""The jobs' durable state: one SQLite database (WAL, synchronous=FULL) and audio files.

Layout of `jobs.dir`:

    jobs.sqlite3              the database (jobs, their segments, the audio made)
    audio/<job id>/NNNNNN.pcm one file per segment made: s16le mono at the voice's rate
    audio/<job id>/NNNNNN.<runner>.part the segment being made (written as it comes, never
                              trusted; named by its runner: replicas may share a store)
    audio/<job id>/final.<fmt> the whole job encoded once it is done (for byte ranges)

The rename rule (STYLE.md): a segment's audio goes to `.part` as it is made; at the
segment's end the file is fsynced, renamed to `.pcm`, the directory fsynced, and only then
the `made` row is committed (one short transaction). A crash leaves either the old state
(no row: the segment is rendered again) or the new one, never a row that points at half a
file. `reconcile` (at start) removes `.part` files and `.pcm` files without a row (of jobs
no other runner holds a lease on), and
takes a job that is not finished back to its last whole segment when a file is missing or
short; a finished job whose file is gone fails with an error that says so.

Thread-safe (one lock): the runner commits from a worker thread (an fsync must not stall
the event loop), the routes read from the loop (WAL: readers never wait on the writer).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from app.jobs.job import (
    BYTES_PER_SAMPLE,
    SCHEMA,
    Job,
    JobState,
    JobStoreError,
    MadeSegment,
    Progress,
)
from app.jobs.text import Segment


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JobStore:
    """See the module doc."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.audio_dir = directory / "audio"
        self.audio_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(
            directory / "jobs.sqlite3", check_same_thread=False, isolation_level=None
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # Jobs.

    def create(self, job: Job, text: str, segments: list[Segment]) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,NULL,NULL)",
                (
                    job.id,
                    job.owner,
                    job.title,
                    job.state.value,
                    job.voice,
                    job.speed,
                    job.response_format,
                    job.sample_rate_hz,
                    job.output_rate_hz,
                    job.finish_by_s,
                    job.created_s,
                    job.finished_s,
                    text,
                    job.error,
                ),
            )
            db.executemany(
                "INSERT INTO segments VALUES (?,?,?,?,?)",
                [(job.id, i, s.start, s.end, s.chapter) for i, s in enumerate(segments)],
            )
        (self.audio_dir / job.id).mkdir(exist_ok=True)

    _JOB_COLUMNS = (
        "id, owner, title, state, voice, speed, response_format, sample_rate_hz, "
        "output_rate_hz, finish_by_s, created_s, finished_s, length(text), error"
    )

    def _job(self, row: tuple[object, ...]) -> Job:
        """A row as a Job; a row that does not read as one (a corrupt row) -> JobStoreError."""
        try:
            fields = list(row)
            fields[3] = JobState(fields[3])
            job = Job(*fields)  # type: ignore[arg-type]
            if not (isinstance(job.sample_rate_hz, int) and job.sample_rate_hz > 0):
                raise ValueError(f"sample_rate_hz {job.sample_rate_hz!r}")
            if not (isinstance(job.speed, float) and job.speed > 0):
                raise ValueError(f"speed {job.speed!r}")
            return job
        except (ValueError, TypeError) as exc:
            raise JobStoreError(f"the job's row is corrupt: {exc}") from None

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {self._JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
        return None if row is None else self._job(row)

    def ids(self, owner: str | None = None) -> list[str]:
        with self._lock:
            if owner is None:
                rows = self._db.execute("SELECT id FROM jobs ORDER BY created_s, id").fetchall()
            else:
                rows = self._db.execute(
                    "SELECT id FROM jobs WHERE owner = ? ORDER BY created_s, id", (owner,)
                ).fetchall()
        return [r[0] for r in rows]

    def page(self, owner: str, after: str | None, limit: int) -> list[str]:
        """Ids of `owner`'s jobs, oldest first, after the job `after` (a cursor)."""
        with self._lock:
            if after is None:
                rows = self._db.execute(
                    "SELECT id FROM jobs WHERE owner = ? ORDER BY created_s, id LIMIT ?",
                    (owner, limit),
                ).fetchall()
            else:
                rows = self._db.execute(
                    "SELECT j.id FROM jobs j, jobs a WHERE a.id = ? AND j.owner = ? AND "
                    "(j.created_s, j.id) > (a.created_s, a.id) ORDER BY j.created_s, j.id LIMIT ?",
                    (after, owner, limit),
                ).fetchall()
        return [r[0] for r in rows]

    def count(self, owner: str) -> int:
        with self._lock:
            return int(
                self._db.execute("SELECT count(*) FROM jobs WHERE owner = ?", (owner,)).fetchone()[
                    0
                ]
            )

    def count_state(self, state: JobState) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT count(*) FROM jobs WHERE state = ?", (state.value,)
            ).fetchone()
        return int(row[0])

    def text(self, job_id: str) -> str:
        with self._lock:
            row = self._db.execute("SELECT text FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None or not isinstance(row[0], str):
            raise JobStoreError("the job's text is missing or corrupt")
        return row[0]

    def segments(self, job_id: str) -> list[Segment]:
        with self._lock:
            rows = self._db.execute(
                "SELECT idx, text_start, text_end, chapter FROM segments WHERE job_id = ? "
                "ORDER BY idx",
                (job_id,),
            ).fetchall()
        if [r[0] for r in rows] != list(range(len(rows))):
            raise JobStoreError("the job's segment rows are corrupt")
        return [Segment(r[1], r[2], r[3]) for r in rows]

    def made(self, job_id: str) -> list[MadeSegment]:
        with self._lock:
            rows = self._db.execute(
                "SELECT idx, start_sample, samples, words FROM made WHERE job_id = ? ORDER BY idx",
                (job_id,),
            ).fetchall()
        made = []
        expected_start = 0
        for position, (index, start, samples, words) in enumerate(rows):
            if index != position or start != expected_start or samples < 0:
                raise JobStoreError(f"the job's row of segment {index} is corrupt")
            try:
                decoded = json.loads(words)
            except (TypeError, ValueError):
                raise JobStoreError(
                    f"the job's timestamps of segment {index} are corrupt"
                ) from None
            made.append(MadeSegment(index, start, samples, decoded))
            expected_start = start + samples
        return made

    def progress(self, job_id: str) -> Progress:
        segments = self.segments(job_id)
        made = self.made(job_id)
        chars = segments[len(made) - 1].end if made else 0
        samples = made[-1].start_sample + made[-1].samples if made else 0
        return Progress(len(segments), len(made), chars, samples)

    def set_state(
        self, job_id: str, state: JobState, *, error: str | None = None, at_s: float | None = None
    ) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE jobs SET state = ?, error = ?, finished_s = ? WHERE id = ?",
                (state.value, error, at_s if state.finished else None, job_id),
            )

    def delete(self, job_id: str) -> None:
        """The job's rows, then its files (a crash between them leaves files without a
        row: `reconcile` removes them)."""
        with self._transaction() as db:
            db.execute("DELETE FROM made WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM segments WHERE job_id = ?", (job_id,))
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
        self._remove_dir(self.audio_dir / job_id)

    def expired(self, before_s: float) -> list[str]:
        """Finished jobs that ended before `before_s`."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id FROM jobs WHERE finished_s IS NOT NULL AND finished_s < ?",
                (before_s,),
            ).fetchall()
        return [r[0] for r in rows]

    # Audio files.

    def segment_path(self, job_id: str, index: int) -> Path:
        return self.audio_dir / job_id / f"{index:06d}.pcm"

    def part_path(self, job_id: str, index: int, runner: str) -> Path:
        return self.audio_dir / job_id / f"{index:06d}.{runner}.part"

    # Leases: which runner renders a job (replicas of a cluster share the store).

    def claim(self, job_id: str, runner: str, now_s: float, lease_s: float) -> bool:
        """Take (or renew) the job for `runner` until `now_s + lease_s`, unless another
        runner holds a lease that has not run out."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE jobs SET runner = ?, lease_until_s = ? WHERE id = ? AND "
                "(runner IS NULL OR runner = ? OR lease_until_s < ?)",
                (runner, now_s + lease_s, job_id, runner, now_s),
            )
            return cursor.rowcount == 1

    def release(self, runner: str) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE jobs SET runner = NULL, lease_until_s = NULL WHERE runner = ?", (runner,)
            )

    def release_all(self) -> None:
        """Every lease void (the one runner of a store starts: the holders are dead)."""
        with self._transaction() as db:
            db.execute("UPDATE jobs SET runner = NULL, lease_until_s = NULL")

    def lease_holder(self, job_id: str, now_s: float) -> str | None:
        """The runner whose lease on the job has not run out, if any."""
        with self._lock:
            row = self._db.execute(
                "SELECT runner, lease_until_s FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
        if row is None or row[0] is None or row[1] is None or row[1] < now_s:
            return None
        return str(row[0])

    def final_path(self, job_id: str, response_format: str) -> Path:
        return self.audio_dir / job_id / f"final.{response_format}"

    def commit_segment(
        self,
        job_id: str,
        index: int,
        start_sample: int,
        samples: int,
        words: list[list[object]],
        runner: str,
    ) -> None:
        """The segment's `.part` (complete, `samples` long) made durable by the rename
        rule, then recorded. OSError (disk full ...) propagates, nothing recorded."""
        part = self.part_path(job_id, index, runner)
        final = self.segment_path(job_id, index)
        with open(part, "rb+") as file:
            size = os.fstat(file.fileno()).st_size
            if size != samples * BYTES_PER_SAMPLE:
                raise JobStoreError(
                    f"segment {index} has {size} bytes on disk, {samples * BYTES_PER_SAMPLE} made"
                )
            os.fsync(file.fileno())
        os.replace(part, final)
        _fsync_dir(final.parent)
        with self._transaction() as db:
            db.execute(
                "INSERT INTO made VALUES (?,?,?,?,?)",
                (job_id, index, start_sample, samples, json.dumps(words)),
            )
            db.execute(
                "UPDATE jobs SET state = ? WHERE id = ? AND state = ?",
                (JobState.RENDERING.value, job_id, JobState.QUEUED.value),
            )

    def write_final(self, job_id: str, response_format: str, data_path: Path) -> None:
        """`data_path` (a complete encoding, in the job's directory) becomes the job's
        final file by the rename rule."""
        final = self.final_path(job_id, response_format)
        with open(data_path, "rb+") as file:
            os.fsync(file.fileno())
        os.replace(data_path, final)
        _fsync_dir(final.parent)

    def disk_bytes(self) -> int:
        total = 0
        for root, _, files in os.walk(self.audio_dir):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.stat(os.path.join(root, name)).st_size
        return total

    def _remove_dir(self, path: Path) -> None:
        if not path.is_dir():
            return
        for child in path.iterdir():
            with contextlib.suppress(FileNotFoundError):
                child.unlink()
        with contextlib.suppress(OSError):
            path.rmdir()

    def check_files(self, job: Job) -> str | None:
        """Why the job's made audio is not all on disk (None: it is)."""
        for segment in self.made(job.id):
            path = self.segment_path(job.id, segment.index)
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                return f"the audio file of segment {segment.index} is missing"
            if size != segment.samples * BYTES_PER_SAMPLE:
                return f"the audio file of segment {segment.index} has the wrong size"
        return None

    def reconcile(self, at_s: float) -> list[str]:
        """At start: leftovers removed, unfinished jobs taken back to their last whole
        segment, finished ones whose audio is gone failed. Returns one line per repair."""
        repairs: list[str] = []
        known = set(self.ids())
        for path in self.audio_dir.iterdir():
            if path.is_dir() and path.name not in known:
                self._remove_dir(path)
                repairs.append(f"{path.name}: files without a job removed")
        for job_id in sorted(known):
            if self.lease_holder(job_id, at_s) is not None:  # another replica renders it
                continue
            try:
                job = self.get(job_id)
                assert job is not None
                repairs += self._reconcile_job(job, at_s)
            except JobStoreError as exc:
                self._fail_corrupt(job_id, str(exc), at_s)
                repairs.append(f"{job_id}: failed: {exc}")
        return repairs

    def _fail_corrupt(self, job_id: str, error: str, at_s: float) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE jobs SET state = ?, error = ?, finished_s = ? WHERE id = ?",
                (JobState.FAILED.value, error, at_s, job_id),
            )

    def _reconcile_job(self, job: Job, at_s: float) -> list[str]:
        repairs = []
        directory = self.audio_dir / job.id
        directory.mkdir(exist_ok=True)
        made = self.made(job.id)
        made_names = {self.segment_path(job.id, m.index).name for m in made}
        for path in directory.iterdir():
            stray = path.suffix == ".part" or (
                path.suffix == ".pcm" and path.name not in made_names
            )
            if stray or path.name.startswith("final.tmp"):
                path.unlink()
                repairs.append(f"{job.id}: {path.name} removed (not committed)")
        if job.state.finished:
            if job.state is JobState.DONE and (problem := self.check_files(job)):
                self.set_state(job.id, JobState.FAILED, error=problem, at_s=at_s)
                repairs.append(f"{job.id}: failed: {problem}")
            return repairs
        for segment in made:  # back to the last whole segment
            path = self.segment_path(job.id, segment.index)
            size = path.stat().st_size if path.exists() else -1
            if size != segment.samples * BYTES_PER_SAMPLE:
                with self._transaction() as db:
                    db.execute(
                        "DELETE FROM made WHERE job_id = ? AND idx >= ?", (job.id, segment.index)
                    )
                for later in made[segment.index :]:
                    with contextlib.suppress(FileNotFoundError):
                        self.segment_path(job.id, later.index).unlink()
                repairs.append(f"{job.id}: back to segment {segment.index} (its file was bad)")
                break
        return repairs

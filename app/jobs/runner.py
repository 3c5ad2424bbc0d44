"""The job runner: renders jobs segment by segment through the engine, durably.

One task, opened and closed with the app (a Service of app/state.py). It takes the most
urgent job (scheduling/jobs.py: a listened-to job first, then the earliest `finish_by`,
then the oldest) and renders its next segments, two in flight so the stages never wait
between segments, each one an engine stream (`Engine.submit_job`) scheduled by the job's
virtual player: rate 0 (best effort: only the turns live listeners leave) or the rate its
deadline needs, or 1x behind a listener. Each segment's audio goes to its `.part` file as
the engine makes it; at its end the store makes it durable and records it, in order
(app/jobs/store.py). Between segments it looks again: a more urgent job goes first.

A stop (SIGTERM, or the app closing) cancels the segments in flight: their `.part`
files are dropped at the next start, and the job resumes at its last whole segment. A
failure of one job (disk full, its audio deleted, a corrupt row, the voice failing) fails
that job with a sentence saying why; the runner goes on with the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.jobs.config import JobsConfig
from app.jobs.job import BYTES_PER_SAMPLE, Job, JobState, JobStoreError
from app.jobs.metrics import JobMetrics
from app.jobs.store import JobStore
from app.jobs.text import Segment, spoken_form
from app.text_input import normalized, words_apart
from pipeline import Engine, NotReady, StreamFailed
from pipeline.normalize import speakable
from scheduling.jobs import job_key, job_rate, listener_horizon_s, segment_pace

log = logging.getLogger("playhead.jobs")

SEGMENTS_IN_FLIGHT = 2  # a job's next segment talks while the one before it is vocoded
AUDIO_S_PER_CHAR = 0.065  # a first guess of audio per character, before a job has made any
DAY_S = 86400.0
# replicas sharing a store: a runner holds its job this long, renewed every third of it
# while it renders (a dead replica's job is taken over after at most this long)
LEASE_S = 60.0


@dataclass
class _Listener:
    since_s: float  # engine clock, when its reading began
    from_s: float  # the audio position it began at


@dataclass
class _Running:
    job_id: str
    task: asyncio.Task[None]
    streams: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class _SegmentAudio:
    samples: int
    words: list[list[object]]


class JobFailed(Exception):
    """This job cannot go on (the message says why); others can."""


class JobRunner:
    """See the module doc."""

    def __init__(
        self,
        config: JobsConfig,
        directory: Path,
        *,
        engine: Callable[[], Engine | None],
        wait_loaded: Callable[[], object],
        normalize: object,
        metrics: JobMetrics,
        wall_clock: Callable[[], float] = time.time,
        shared: bool = False,
    ) -> None:
        """`shared`: other runners (the replicas of a cluster) use the same store."""
        self.shared = shared
        self.config = config
        self.directory = directory
        self._engine = engine
        self._wait_loaded = wait_loaded
        self._normalize = normalize
        self.metrics = metrics
        self._wall = wall_clock
        self.store: JobStore | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._running: _Running | None = None
        self._listeners: dict[str, list[_Listener]] = {}
        self.made_event: dict[str, asyncio.Event] = {}
        self.audio_s_per_char = AUDIO_S_PER_CHAR
        self._deleting: set[str] = set()  # cancelled, about to be deleted: not picked again
        # this runner's name in the store's leases (replicas of a cluster share a store)
        self.runner_id = uuid.uuid4().hex[:12]

    # Lifecycle (a Service of app/state.py).

    def bind(self) -> None:
        """Claim the jobs directory before the server starts (`playhead serve`): one that
        cannot be made or written is the CLI's one line, not a failed startup's traceback."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / f".write-probe-{self.runner_id}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise OSError(exc.errno, f"cannot keep jobs in {self.directory}: {why}") from None

    async def open(self) -> None:
        self.store = await asyncio.to_thread(JobStore, self.directory)
        if not self.shared:  # the store's only runner: leases of an earlier process are void
            await asyncio.to_thread(self.store.release_all)
        repairs = await asyncio.to_thread(self.store.reconcile, self._wall())
        for line in repairs:
            log.warning("jobs store: %s", line)
        self.metrics.watch(self.store)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="playhead-jobs")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.release(self.runner_id)
            self.store.close()

    def wake(self) -> None:
        self._wake.set()

    def changed(self, job_id: str) -> asyncio.Event:
        """Set whenever the job made a segment or ended (a follower waits on it)."""
        return self.made_event.setdefault(job_id, asyncio.Event())

    def _notify(self, job_id: str) -> None:
        event = self.made_event.pop(job_id, None)
        if event is not None:
            event.set()

    # Listening and cancelling (from the routes).

    @contextlib.contextmanager
    def listening(self, job_id: str, from_s: float) -> Iterator[None]:
        """While a client reads the job's audio as it is made: the job is paced by it."""
        engine = self._engine()
        now_s = time.monotonic() if engine is None else _engine_now(engine)
        listener = _Listener(now_s, from_s)
        self._listeners.setdefault(job_id, []).append(listener)
        self._repace(job_id)
        self.wake()
        try:
            yield
        finally:
            listeners = self._listeners.get(job_id, [])
            if listener in listeners:
                listeners.remove(listener)
            if not listeners:
                self._listeners.pop(job_id, None)
            self._repace(job_id)

    async def cancel(self, job_id: str) -> None:
        """Stop rendering the job now, for good: it is about to be deleted (`deleted`)."""
        self._deleting.add(job_id)
        running = self._running
        if running is not None and running.job_id == job_id:
            running.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await running.task
        self._notify(job_id)
        self.wake()

    def deleted(self, job_id: str) -> None:
        """The job's rows and files are gone: its followers learn it, the loop looks again."""
        self._deleting.discard(job_id)
        self._notify(job_id)
        self.wake()

    # The loop.

    async def _run(self) -> None:
        await self._wait_loaded()  # type: ignore[misc]
        store = self.store
        assert store is not None
        while True:
            self._wake.clear()
            await self._expire(store)
            job = self._next_job(store)
            if job is None:
                # asyncio.timeout, not wait_for: 3.11's wait_for may swallow a cancel that
                # comes as the event is set
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(60.0):  # the expiry of old jobs is checked
                        await self._wake.wait()
                continue
            engine = self._engine()
            if engine is None or not engine.ready:
                await asyncio.sleep(0.5)
                continue
            task = asyncio.get_running_loop().create_task(self._render(store, engine, job))
            self._running = _Running(job.id, task)
            try:
                await task
            except asyncio.CancelledError:
                if self._task is None or self._task.cancelling():
                    raise
            except NotReady:
                await asyncio.sleep(0.5)  # the engine stops: the job resumes at the next start
            finally:
                self._running = None

    async def _expire(self, store: JobStore) -> None:
        before_s = self._wall() - self.config.keep_days * DAY_S
        for job_id in store.expired(before_s):
            await asyncio.to_thread(store.delete, job_id)
            log.info(
                "job %s deleted: finished more than %g days ago", job_id, self.config.keep_days
            )

    def _next_job(self, store: JobStore) -> Job | None:
        best: tuple[tuple[float, float, float], Job] | None = None
        now_s = time.monotonic()
        for job_id in store.ids():
            try:
                job = store.get(job_id)
            except JobStoreError as exc:
                store.set_state(job_id, JobState.FAILED, error=str(exc), at_s=self._wall())
                self.metrics.ended(JobState.FAILED)
                log.error("job %s failed: %s", job_id, exc)
                continue
            if job is None or job.state.finished or job_id in self._deleting:
                continue
            holder = store.lease_holder(job_id, self._wall())
            if holder is not None and holder != self.runner_id:
                continue  # another replica's runner renders it
            key = job_key(self._listener_horizon_s(job_id, now_s), job.finish_by_s, job.created_s)
            if best is None or key < best[0]:
                best = (key, job)
        if best is None:
            return None
        job = best[1]
        if not store.claim(job.id, self.runner_id, self._wall(), LEASE_S):
            return None  # another replica's runner has it; look again after a wake
        return job

    def _listener_horizon_s(self, job_id: str, now_s: float) -> float | None:
        """The wall time its first listener runs dry (None: nobody listens)."""
        listeners = self._listeners.get(job_id)
        if not listeners or self.store is None:
            return None
        made_s = self._made_s(job_id)
        horizon = min(listener_horizon_s(x.since_s, x.from_s, made_s) for x in listeners)
        return self._wall() + (horizon - now_s)

    def _made_s(self, job_id: str) -> float:
        assert self.store is not None
        job = self.store.get(job_id)
        if job is None:
            return 0.0
        return self.store.progress(job_id).samples / job.sample_rate_hz

    # One job.

    async def _render(self, store: JobStore, engine: Engine, job: Job) -> None:
        started_wall_s = self._wall()
        try:
            await self._render_segments(store, engine, job)
        except JobFailed as exc:
            await self._finish(store, job, JobState.FAILED, str(exc), started_wall_s)
        except JobStoreError as exc:
            await self._finish(store, job, JobState.FAILED, str(exc), started_wall_s)

    async def _finish(
        self, store: JobStore, job: Job, state: JobState, error: str | None, started_s: float
    ) -> None:
        now_s = self._wall()
        await asyncio.to_thread(store.set_state, job.id, state, error=error, at_s=now_s)
        made_s = store.progress(job.id).samples / job.sample_rate_hz
        self.metrics.ended(state)
        self._notify(job.id)
        if state is JobState.DONE:
            log.info(
                "job %s done: %d chars, %.1f s of audio, created %.1f s ago (this run %.1f s)",
                job.id,
                job.text_chars,
                made_s,
                now_s - job.created_s,
                now_s - started_s,
            )
        else:
            log.error("job %s failed after %.1f s of audio: %s", job.id, made_s, error)

    async def _render_segments(self, store: JobStore, engine: Engine, job: Job) -> None:
        text = store.text(job.id)
        segments = store.segments(job.id)
        made = store.made(job.id)
        problem = store.check_files(job)
        if problem is not None:
            raise JobFailed(problem)
        start_sample = made[-1].start_sample + made[-1].samples if made else 0
        next_index = len(made)
        pending: deque[tuple[int, asyncio.Task[_SegmentAudio]]] = deque()
        horizon_s = time.monotonic()  # the virtual player's, engine clock (monotonic)
        try:
            while next_index < len(segments) or pending:
                while len(pending) < SEGMENTS_IN_FLIGHT and next_index < len(segments):
                    if next_index > len(made) and self._preempted(store, job):
                        break
                    await self._check_disk(store)
                    rate, horizon_s = self._pace(job, segments, next_index, horizon_s, store)
                    task = asyncio.get_running_loop().create_task(
                        self._render_segment(
                            store,
                            engine,
                            job,
                            next_index,
                            text,
                            segments[next_index],
                            rate,
                            horizon_s,
                        )
                    )
                    pending.append((next_index, task))
                    next_index += 1
                if not pending:
                    return  # preempted: the loop picks the more urgent job
                index, task = pending.popleft()
                audio = await task
                try:
                    await asyncio.to_thread(
                        store.commit_segment,
                        job.id,
                        index,
                        start_sample,
                        audio.samples,
                        audio.words,
                        self.runner_id,
                    )
                except OSError as exc:
                    raise JobFailed(_disk_error(exc)) from exc
                start_sample += audio.samples
                self.metrics.made(
                    audio.samples / job.sample_rate_hz, time.monotonic(), engine.capacity()
                )
                done = segments[index].end
                if done:
                    self.audio_s_per_char = (start_sample / job.sample_rate_hz) / done * job.speed
                self._notify(job.id)
        finally:
            for _, task in pending:
                task.cancel()
            for _, task in pending:
                with contextlib.suppress(BaseException):
                    await task
        await self._finish(store, job, JobState.DONE, None, self._wall())

    def _preempted(self, store: JobStore, job: Job) -> bool:
        other = self._next_job(store)
        return other is not None and other.id != job.id

    async def _check_disk(self, store: JobStore) -> None:
        used = await asyncio.to_thread(store.disk_bytes)
        limit = self.config.max_disk_gb * 1e9
        if used >= limit:
            raise JobFailed(
                f"the jobs' disk limit (jobs.max_disk_gb = {self.config.max_disk_gb:g}) is "
                f"reached: {used / 1e9:.2f} GB in use"
            )

    def _pace(
        self, job: Job, segments: list[Segment], index: int, horizon_s: float, store: JobStore
    ) -> tuple[float, float]:
        """The rate and the starting horizon (engine clock) of the job's next segment."""
        now_s = time.monotonic()
        listened = self._listener_horizon_s(job.id, now_s)
        if listened is not None:
            return 1.0, now_s + (listened - self._wall())
        chars_left = segments[-1].end - segments[index].start
        audio_left_s = chars_left * self.audio_s_per_char / job.speed
        return segment_pace(job_rate(audio_left_s, job.finish_by_s, self._wall()), horizon_s, now_s)

    def _repace(self, job_id: str) -> None:
        """A listener came or went: the job's streams in flight get its new pace."""
        running, engine = self._running, self._engine()
        if running is None or running.job_id != job_id or engine is None or self.store is None:
            return
        now_s = _engine_now(engine)
        listened = self._listener_horizon_s(job_id, now_s)
        for stream_id in list(running.streams):
            if listened is not None:
                engine.pace_job(stream_id, now_s + (listened - self._wall()), 1.0)
            else:
                engine.pace_job(stream_id, math.inf, 0.0)

    async def _render_segment(
        self,
        store: JobStore,
        engine: Engine,
        job: Job,
        index: int,
        text: str,
        segment: Segment,
        rate: float,
        horizon_s: float,
    ) -> _SegmentAudio:
        part = store.part_path(job.id, index, self.runner_id)
        piece = text[segment.start : segment.end]
        voice = engine.resolve_voice(job.voice)
        spoken = await normalized(words_apart(spoken_form(piece)), voice.language, self._normalize)  # type: ignore[arg-type]
        try:
            file = open(part, "wb")  # noqa: SIM115 (closed below)
        except OSError as exc:
            raise JobFailed(_disk_error(exc)) from exc
        samples = 0
        with file:
            if not speakable(spoken):
                return _SegmentAudio(0, [])
            stream = engine.submit_job(
                spoken, voice=job.voice, speed=job.speed, horizon_s=horizon_s, rate=rate
            )
            running = self._running
            if running is not None:
                running.streams.add(stream.id)
            renewed_s = time.monotonic()
            try:
                async for pcm in stream.chunks():
                    if self.shared and time.monotonic() - renewed_s > LEASE_S / 3:
                        renewed_s = time.monotonic()
                        await asyncio.to_thread(
                            store.claim, job.id, self.runner_id, self._wall(), LEASE_S
                        )
                    data = _to_s16(pcm)
                    try:
                        file.write(data)
                    except OSError as exc:
                        raise JobFailed(_disk_error(exc)) from exc
                    samples += len(data) // BYTES_PER_SAMPLE
                file.flush()
            except StreamFailed as exc:
                raise JobFailed(f"the voice failed on segment {index}: {exc}") from exc
            finally:
                engine.cancel(stream.id)  # a no-op once its audio was all read
                if running is not None:
                    running.streams.discard(stream.id)
        words = [
            [
                piece[w.start_index : w.end_index],
                w.start_index + segment.start,
                w.end_index + segment.start,
                round(w.start_s, 4),
                round(w.end_s, 4),
            ]
            for w in stream.alignment.words
        ]
        return _SegmentAudio(samples, words)


def _to_s16(pcm: np.ndarray) -> bytes:
    return (np.clip(pcm, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def _engine_now(engine: Engine) -> float:
    return time.monotonic()


def _disk_error(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "the disk is full: its audio could not be written"
    return f"its audio could not be written: {exc.strerror or exc}"

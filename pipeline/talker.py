"""The talker stage: step-wise, continuously batched, deadline-ordered.

Each turn of the loop:

1. the book's talker queue (scheduling.TalkerQueue, the indexed form of
   scheduling.plan_talker_step) ranks the streams that want talker work (text waiting or
   a segment open) by when their audio runs out, and takes up to `talker.batch` of them;
   a stream more than `talker.high_water_s` ahead of its playback sits the step out
   without losing its open segment, and parked streams are not candidates; when no stream
   under the mark wants the step and the vocoder is not busy, it goes to those above it
   (`talker.run_ahead`: the machine does not idle while a stream has text; at most
   `high_water_s` of frames not yet vocoded per stream); while the vocoder is busy, a
   stream with more than `talker.busy_max_queued_s` of frames waiting for it sits out;
2. the chosen streams without an open segment get their next text segment opened;
3. one call in the talker thread closes the segments of streams that ended (orphans),
   opens the new segments (`backend.open_segment`), hands the backend the next segment
   of a stream it just opened one for, to prepare in the background
   (`backend.prepare_segment`, while at most `talker.prepare_ahead_streams` streams have
   work: a lone request's next sentence is then encoded on the core its first chunks
   leave idle), runs one `backend.step` over the whole batch, and closes the segments
   that ended;
4. back on the event loop, each segment's new frames go to the stream book.

Streams join and leave the batch between steps: that is continuous batching. A backend
whose steps may run side by side (Piper: each segment keeps its own state; not a codec LM
with one shared cache) gets a second lane with its own thread: while the first lane is busy,
the second takes streams with no audio yet, so a newcomer never
waits behind a long step for others (a barge-in's next request, say). With
nothing to step the loop waits on its wake event (set by the book on new text, a first
audio, an ack, an unpark, a cancel), or until the first stream held back by the
high-water mark falls under it.

Errors: `open_segment` failing fails its stream only; `step` failing fails the streams
of that step; their segments are closed either way. A call that hangs past the stage's
`engine.call_timeout_s` fails the streams of its batch (pipeline/executor.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from pipeline.backend import Backend, TalkRequest, TalkStep
from pipeline.book import OpenSegment, StreamBook
from pipeline.capacity import CapacityEstimate
from pipeline.config import TalkerConfig
from pipeline.errors import BackendError
from pipeline.events import EngineEvents
from pipeline.executor import StageExecutor
from scheduling import SchedulingConfig, TalkerOrderConfig

log = logging.getLogger("playhead.engine")


def talker_order(talker: TalkerConfig, scheduling: SchedulingConfig) -> TalkerOrderConfig:
    """The talker's ordering knobs, from the talker and scheduling sections (the engine's
    and the simulator's one source)."""
    return TalkerOrderConfig(
        batch=talker.batch,
        high_water_s=talker.high_water_s,
        run_ahead=talker.run_ahead,
        busy_max_queued_s=talker.busy_max_queued_s or None,
        first_chunk_s=scheduling.first_chunk_ms / 1000.0,
        safety_margin_s=scheduling.safety_margin_ms / 1000.0,
    )


@dataclass(slots=True)
class _StepOutcome:
    """What one talker-thread call did."""

    stepped: list[OpenSegment]
    results: list[TalkStep]
    open_errors: list[tuple[OpenSegment, Exception]]
    step_error: Exception | None


class Talker:
    """The talker loop over a stream book; see the module doc."""

    def __init__(
        self,
        book: StreamBook,
        backend: Backend,
        stage: StageExecutor,
        order: TalkerOrderConfig,
        *,
        clock: Callable[[], float],
        events: EngineEvents,
        capacity_window_s: float,
        initial_capacity_audio_s_per_s: float = 0.0,
        urgent_stage: StageExecutor | None = None,
        prepare_ahead_streams: int = 0,
    ) -> None:
        """`urgent_stage`: a second talker lane (its own thread) that takes streams with no
        audio yet while the first lane is busy; only for a
        backend whose talker steps may run side by side
        (`capabilities.concurrent_talker_steps`).
        `prepare_ahead_streams`: while at most this many streams have work, a segment
        opened for a stream with more text has its next one prepared
        (`backend.prepare_segment`, where `capabilities.prepares_segments`; 0: never)."""
        self._book = book
        self._backend = backend
        self._stage = stage
        self._urgent_stage = urgent_stage
        self._order = order
        self._clock = clock
        self._events = events
        self.wake = asyncio.Event()
        self.rate = CapacityEstimate(capacity_window_s, initial_capacity_audio_s_per_s)
        self.steps = 0  # talker steps run
        self.urgent_steps = 0  # of those, run by the second lane
        self.idle_waits = 0  # times the loop found nothing to do and waited
        self.lanes_busy = 0  # talker calls running now
        # next segments are prepared only where the backend can (its capabilities)
        prepares = backend.capabilities.prepares_segments
        self._prepare: Callable[[TalkRequest], Future[Any] | None] | None = (
            backend.prepare_segment if prepares and prepare_ahead_streams > 0 else None
        )
        self._drop_prepared: Callable[[], None] | None = backend.drop_prepared if prepares else None
        self._prepare_ahead_streams = prepare_ahead_streams
        self._prepared_out = False  # segments handed to prepare_segment, maybe not opened
        self._loop: asyncio.AbstractEventLoop | None = None
        self.prepares = 0  # next segments given to backend.prepare_segment
        self.prepare_drops = 0  # times they were dropped (more streams came)

    async def run(self) -> None:
        book = self._book
        self._loop = asyncio.get_running_loop()
        async with asyncio.TaskGroup() as lanes:
            main: asyncio.Task[None] | None = None
            urgent: asyncio.Task[None] | None = None
            while True:
                self.wake.clear()
                if self._prepared_out and len(book) > self._prepare_ahead_streams:
                    self._drop_prepares()
                now_s = self._clock()
                retry_in_s: float | None = None
                if main is None or main.done():
                    orphans = book.take_orphans()
                    plan = book.plan_talker(now_s, self._order)
                    if plan.step_ids or orphans:
                        batch, prepare = self._dispatch(plan.step_ids)
                        self.lanes_busy += 1  # from here: its orphans are no longer listed
                        main = lanes.create_task(self._lane(self._stage, batch, orphans, prepare))
                        continue
                    retry_in_s = plan.retry_in_s
                elif self._urgent_stage is not None and (urgent is None or urgent.done()):
                    fresh = book.plan_first_audio_talker(now_s, self._order)
                    if fresh:
                        batch, prepare = self._dispatch(fresh)
                        self.urgent_steps += 1
                        self.lanes_busy += 1
                        urgent = lanes.create_task(
                            self._lane(self._urgent_stage, batch, [], prepare)
                        )
                        continue
                if main is None or main.done():
                    self.idle_waits += 1  # nothing to do at all (not just a lane busy)
                if retry_in_s is None:
                    await self.wake.wait()
                else:  # a stream above the high-water mark falls back under it by then
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(retry_in_s, 0.0)):
                            await self.wake.wait()

    def _dispatch(
        self, step_ids: Sequence[str]
    ) -> tuple[list[OpenSegment], list[tuple[str, TalkRequest]]]:
        """The segments of the next step, opened where new and marked in flight, and the
        next segments to prepare (`prepare_ahead_streams`)."""
        book = self._book
        batch: list[OpenSegment] = []
        prepare: list[tuple[str, TalkRequest]] = []
        for stream_id in step_ids:
            record = book.record(stream_id)
            assert record is not None, "a talker candidate is a live stream"
            if record.talking is not None:
                batch.append(record.talking)
                continue
            batch.append(book.open_segment(record))
            if self._prepare is not None and len(book) <= self._prepare_ahead_streams:
                ahead = book.next_request(record)
                if ahead is not None:
                    prepare.append((stream_id, ahead))
                    book.prepare_started(record, ahead.segment_index)  # until it ends
                    self.prepares += 1
                    self._prepared_out = True
        book.talk_steps_started(batch)
        if step_ids:
            self._events.talker_step(step_ids)
        return batch, prepare

    def _watch_prepare(
        self, stream_id: str, segment_index: int, done: Future[object] | None
    ) -> None:
        """Talker thread: book the preparation's end on the event loop once `done` is
        (at once without a future: nothing was started)."""
        loop = self._loop
        assert loop is not None, "the talker runs"

        def ended(_: object = None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing to book
                loop.call_soon_threadsafe(self._book.prepare_ended, stream_id, segment_index)

        if done is None:
            ended()
        else:
            done.add_done_callback(ended)

    def _drop_prepares(self) -> None:
        """More streams have work than prepare_ahead_streams: the backend gives up what it
        prepares (its helper thread runs at a low priority and could wait long for a core
        while a talker lane waits for it). Not a model call: it sets a flag and returns."""
        self._prepared_out = False
        if self._drop_prepared is not None:
            self.prepare_drops += 1
            try:
                self._drop_prepared()
            except Exception:
                log.exception("drop_prepared failed")

    async def _lane(
        self,
        stage: StageExecutor,
        batch: list[OpenSegment],
        orphans: list[OpenSegment],
        prepare: list[tuple[str, TalkRequest]],
    ) -> None:
        book = self._book
        # a stream with no frames yet: this step makes its first audio (vocoder workers
        # with streams well buffered leave the cores to it: vocoder.yield_slack_s)
        first = book.first_audio_yield and any(o.record.stream.stats.frames == 0 for o in batch)
        if first:
            book.first_audio_started()
        try:
            await self._step(stage, batch, orphans, prepare)
        finally:
            if first:
                book.first_audio_ended()
            self.lanes_busy -= 1
            book.talk_steps_ended(batch)
            self.wake.set()  # the lane is free: plan again

    async def _step(
        self,
        stage: StageExecutor,
        batch: list[OpenSegment],
        orphans: list[OpenSegment],
        prepare: list[tuple[str, TalkRequest]],
    ) -> None:
        book = self._book
        try:
            timed = await stage.run_timed(self._in_thread, batch, orphans, prepare)
        except asyncio.CancelledError:
            for opened in batch:
                opened.cancelled = True
            raise
        except Exception as error:  # the call hung (StageTimeout): its streams fail
            for opened in batch:
                # its segments stay with the abandoned call: never closed from another thread
                opened.closed = opened.cancelled = True
                book.fail(opened.record, error)
            return
        outcome = timed.result
        for opened, error in outcome.open_errors:
            book.fail(opened.record, error)
        if outcome.step_error is not None:
            for opened in outcome.stepped:
                book.fail(opened.record, outcome.step_error)
            outcome.stepped = []
        audio_s = 0.0
        for opened, result in zip(outcome.stepped, outcome.results, strict=True):
            voice = opened.record.stream.voice
            audio_s += len(result.frames) * voice.samples_per_frame / voice.sample_rate_hz
            book.talked(opened, result.frames, result.done, result.timing)
        for opened in batch:
            if opened.cancelled:
                book.orphan(opened)  # closed in the next call if the thread did not
        self.steps += 1
        if outcome.stepped:
            self.rate.record(timed.started_s, timed.finished_s, audio_s)
            self._events.talker_call(timed.seconds)

    def _in_thread(
        self,
        batch: list[OpenSegment],
        orphans: list[OpenSegment],
        prepare: list[tuple[str, TalkRequest]],
    ) -> _StepOutcome:
        """Runs in the talker thread: close orphans, open new segments, have the next ones
        prepared, step, close ended."""
        backend = self._backend
        for opened in orphans:
            self._close(opened)
        open_errors: list[tuple[OpenSegment, Exception]] = []
        for opened in batch:
            if opened.state is None and not opened.cancelled:
                try:
                    opened.state = backend.open_segment(opened.request)
                except Exception as error:
                    open_errors.append((opened, error))
        if prepare and self._prepare is not None:  # after the opens: they come first
            for stream_id, request in prepare:
                done: Future[object] | None = None
                try:
                    done = self._prepare(request)
                except Exception:  # only time is lost: open_segment does the work
                    log.exception("prepare_segment failed")
                self._watch_prepare(stream_id, request.segment_index, done)
        failed = {id(opened) for opened, _ in open_errors}
        stepped = [
            o for o in batch if o.state is not None and not o.cancelled and id(o) not in failed
        ]
        results: list[TalkStep] = []
        step_error: Exception | None = None
        if stepped:
            try:
                results = list(backend.step([o.state for o in stepped]))
                if len(results) != len(stepped):
                    raise BackendError(
                        f"step returned {len(results)} results for {len(stepped)} segments"
                    )
            except Exception as error:
                step_error, results = error, []
        for index, opened in enumerate(stepped):
            if step_error is not None or results[index].done or opened.cancelled:
                self._close(opened)
        for opened in batch:  # cancelled while opening: nothing will step it again
            if opened.cancelled:
                self._close(opened)
        if step_error is not None:
            return _StepOutcome(stepped, [], open_errors, step_error)
        return _StepOutcome(stepped, results, open_errors, None)

    def _close(self, opened: OpenSegment) -> None:
        if opened.state is None or opened.closed:
            return
        opened.closed = True
        try:
            self._backend.close_segment(opened.state)
        except Exception:
            log.exception("close_segment failed for stream %s", opened.record.stream.id)

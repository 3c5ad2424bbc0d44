"""The talker's decisions as plain code: which segments the next talker call steps.

No asyncio, no threads, no clock of its own: `schedule(now_s)` returns the next call as
plain data (a `TalkPlan`) or None, `run_talk(backend, plan)` is that call (run in the
talker's thread by the engine, inline by the simulator), and `update(plan, outcome,
now_s)` applies what came back. The engine's driver (pipeline/talker.py) and the
simulator's (benchmarks/sim_replica.py) only call these three.

Each plan:

1. the talker queue (scheduling.TalkerQueue, the indexed form of
   scheduling.plan_talker_step) ranks the streams that want talker work (text waiting or
   a segment open) by when their audio runs out, and takes up to `talker.batch` of them;
   a stream more than `talker.high_water_s` ahead of its playback sits the step out, and
   parked streams are not candidates; when no stream under the mark wants the step and
   the vocoder would leave a core idle, it goes to those above it (`talker.run_ahead`);
   while the vocoder is busy, a stream with more than `talker.busy_max_queued_s` of
   frames waiting for it sits out (the paced order);
2. the chosen streams without an open segment get their next text segment opened (its
   request urgent while its stream has less than `talker.urgent_slack_s` of audio ahead,
   `alone.urgent_slack_s` for a stream alone: pipeline/load.py);
3. a stream alone whose segment is opened has its next one prepared by the backend
   (`capabilities.prepares_segments`) while this one is stepped;
4. segments of streams that ended are closed first (orphans).

`schedule(now_s, urgent_only=True)` plans for a second lane: only urgent streams, those
with no audio yet or less than `talker.urgent_slack_s` of it ahead (a backend whose steps
may run side by side: `concurrent_talker_steps`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pipeline.backend import Backend, SegmentTiming, TalkRequest, TalkStep
from pipeline.config import TalkerConfig
from pipeline.errors import BackendError
from pipeline.events import EngineEvents
from pipeline.load import ALWAYS_URGENT, Load, UrgentSlack
from pipeline.records import OpenSegment, StreamRecord
from pipeline.stream import StreamState
from pipeline.table import StreamTable
from scheduling import (
    PlaybackScheduler,
    SchedulingConfig,
    TalkerCandidate,
    TalkerOrderConfig,
    TalkerPlan,
    TalkerQueue,
)

log = logging.getLogger("playhead.engine")


def talker_order(talker: TalkerConfig, scheduling: SchedulingConfig) -> TalkerOrderConfig:
    """The talker's ordering knobs, from the talker and scheduling sections."""
    return TalkerOrderConfig(
        batch=talker.batch,
        high_water_s=talker.high_water_s,
        run_ahead=talker.run_ahead,
        busy_max_queued_s=talker.busy_max_queued_s or None,
        first_chunk_s=scheduling.first_chunk_ms / 1000.0,
        safety_margin_s=scheduling.safety_margin_ms / 1000.0,
    )


@dataclass(slots=True)
class TalkPlan:
    """One talker call: close `orphans`, open the new segments of `batch`, hand
    `prepare` to the backend, step `batch`, close the segments that ended."""

    stream_ids: tuple[str, ...]
    batch: list[OpenSegment]
    orphans: list[OpenSegment]
    prepare: list[tuple[str, TalkRequest]]  # (stream id, its next segment's request)
    first_audio: bool  # it makes some stream's first audio


@dataclass(slots=True)
class TalkOutcome:
    """What a talker call did; `hung`: the call never returned (its streams fail)."""

    stepped: list[OpenSegment] = field(default_factory=list)
    results: list[TalkStep] = field(default_factory=list)
    open_errors: list[tuple[OpenSegment, Exception]] = field(default_factory=list)
    step_error: Exception | None = None
    hung: Exception | None = None


PrepareWatch = Callable[[str, TalkRequest, "Future[object] | None"], None]


def run_talk(backend: Backend, plan: TalkPlan, watch_prepare: PrepareWatch) -> TalkOutcome:
    """The talker call (the talker's thread): close orphans, open new segments, have the
    next ones prepared (`watch_prepare(stream_id, request, future)` learns of each), step, close the
    segments that ended or failed. It reads and writes only the segments' backend state."""
    for opened in plan.orphans:
        _close(backend, opened)
    outcome = TalkOutcome()
    for opened in plan.batch:
        if opened.state is None and not opened.closed:
            try:
                opened.state = backend.open_segment(opened.request)
            except Exception as error:
                outcome.open_errors.append((opened, error))
                opened.closed = True
    for stream_id, request in plan.prepare:  # after the opens: they come first
        done: Future[object] | None = None
        try:
            done = backend.prepare_segment(request)
        except Exception:  # only time is lost: open_segment does the work
            log.exception("prepare_segment failed")
        watch_prepare(stream_id, request, done)
    stepped = outcome.stepped = [o for o in plan.batch if o.state is not None and not o.closed]
    if stepped:
        try:
            results = list(backend.step([o.state for o in stepped]))
            if len(results) != len(stepped):
                raise BackendError(
                    f"step returned {len(results)} results for {len(stepped)} segments"
                )
            outcome.results = results
        except Exception as error:
            outcome.step_error = error
    for index, opened in enumerate(stepped):
        if outcome.step_error is not None or outcome.results[index].done:
            _close(backend, opened)
    return outcome


def _close(backend: Backend, opened: OpenSegment) -> None:
    if opened.state is None or opened.closed:
        return
    opened.closed = True
    try:
        backend.close_segment(opened.state)
    except Exception:
        log.exception("close_segment failed for stream %s", opened.record.stream.id)


class TalkerCore:
    """See the module doc. `vocoder`: the vocoder core (pipeline/vocoder_core.py), whose
    state paces the talker and which takes the frames the talker makes."""

    def __init__(
        self,
        table: StreamTable,
        vocoder: VocoderSide,
        order: TalkerOrderConfig,
        *,
        first_chunk_s: float,
        events: EngineEvents,
        wake: Callable[[], None],
        prepares: bool = False,
        urgent: UrgentSlack = ALWAYS_URGENT,
    ) -> None:
        """`prepares`: the backend prepares segments (a stream alone gets its next one
        prepared). `urgent`: see the module doc."""
        self._table = table
        self._scheduler: PlaybackScheduler = table.scheduler
        self._vocoder = vocoder
        self.order = order
        self._paced_order = order.paced()
        self._events = events
        self._wake = wake
        self._prepares = prepares
        self._urgent_slack = urgent
        self.queue = TalkerQueue(first_chunk_s)
        self._orphans: list[OpenSegment] = []  # segments of ended streams, to close
        self._waits_on_vocoder = False  # the last plan was empty; woken when it idles
        self._waits_on_emit = False  # ... and paced by the frames waiting
        self.prepared_out = False  # segments handed to prepare_segment, maybe not opened
        self.retry_in_s: float | None = None  # the last main plan's high-water timer
        self.steps = 0  # talker calls whose outcome was applied
        self.prepares = 0  # next segments given to backend.prepare_segment
        table.on_forget(self._forget)
        table.on_unparked(lambda _record: wake())

    # Queries.

    def candidates(self) -> list[TalkerCandidate]:
        """Streams that want talker work (parked ones left out)."""
        records = self._table.records
        return [c for c in self.queue.candidates() if not records[c.stream_id].sender.parked]

    @property
    def has_orphans(self) -> bool:
        return bool(self._orphans)

    def drop_prepared_due(self) -> bool:
        """Segments are being prepared while the stream is no longer alone: the backend
        should give them up (its helper thread would take a core from the talker)."""
        if self.prepared_out and not self._table.load().alone:
            self.prepared_out = False
            return True
        return False

    def traces(self, stream_id: str) -> list[str]:
        places = ["talker-candidates"] if stream_id in self.queue else []
        if any(o.record.stream.id == stream_id for o in self._orphans):
            places.append("orphans")
        return places

    # The plan.

    def plan(self, now_s: float, load: Load) -> TalkerPlan:
        """The streams for the next talker step (the TalkerQueue's plan; parked streams
        and those a talker call holds pass)."""
        order = self.order
        paced = not self._vocoder.idle(load, order.busy_max_queued_s is not None)
        if paced:
            # run ahead only when the machine would otherwise idle, and make no more frames
            # than the vocoder can use soon: a chunk waiting is more urgent than talk ahead
            order = self._paced_order
        plan = self.queue.plan(now_s, order, skip=self._busy)
        waits = not plan.step_ids and len(self.queue) > 0
        # an idle talker that may run ahead waits on the vocoder: woken once the vocoder
        # leaves a core idle (`vocoder_progressed`)
        self._waits_on_vocoder = self.order.run_ahead and waits
        # one held back by the frames it has waiting is woken by the next chunk sent
        self._waits_on_emit = waits and order.max_queued_s is not None
        return plan

    def schedule(self, now_s: float, *, urgent_only: bool = False) -> TalkPlan | None:
        """The next talker call, or None (nothing to step, no orphan to close)."""
        table = self._table
        table.apply_inbox()
        load = table.load()
        orphans: list[OpenSegment] = []
        if urgent_only:
            step_ids = self.queue.plan_urgent(
                now_s, self.order, self._urgent_slack.shared_s, skip=self._busy
            )
        else:
            orphans, self._orphans = self._orphans, []
            plan = self.plan(now_s, load)
            step_ids, self.retry_in_s = plan.step_ids, plan.retry_in_s
        if not step_ids and not orphans:
            return None
        batch: list[OpenSegment] = []
        prepare: list[tuple[str, TalkRequest]] = []
        for stream_id in step_ids:
            record = table.record(stream_id)
            assert record is not None, "a talker candidate is a live stream"
            if record.talking is not None:
                batch.append(record.talking)
                continue
            batch.append(self.open_segment(record, load, now_s))
            if self._prepares and load.alone and record.text:
                # its next sentence is encoded on the core its first chunks leave idle
                request = record.talk_request(record.text[0], record.next_segment, urgent=False)
                prepare.append((stream_id, request))
                record.preparing = request.segment_index  # until it ends
                self.prepares += 1
                self.prepared_out = True
        for opened in batch:
            opened.in_flight = True
        first = any(opened.record.stream.stats.frames == 0 for opened in batch)
        if first:
            self._vocoder.first_audio_started()
        if step_ids:
            self._events.talker_step(step_ids)
        return TalkPlan(step_ids, batch, orphans, prepare, first)

    def open_segment(self, record: StreamRecord, load: Load, now_s: float) -> OpenSegment:
        """The talker takes the stream's next text segment."""
        text = record.text.popleft()
        # a preparation of this segment ends here for the core, whatever its own end: the
        # call that opens the segment takes it or waits for it
        record.preparing = None
        index = record.next_segment
        record.next_segment += 1
        request = record.talk_request(
            text,
            index,
            urgent=self._urgent(record, load, now_s),
            # the machine is the stream's alone and idle: its first step may take every core
            all_cores=(
                load.alone
                and not self._vocoder.turns_running
                and not (self._prepares and record.text)  # its next one prepared beside it
            ),
        )
        opened = OpenSegment(record, record.frames.open_segment(index), request)
        record.talking = opened
        if record.stream.state is StreamState.QUEUED:
            record.stream.state = StreamState.TALKING
        return opened

    def _urgent(self, record: StreamRecord, load: Load, now_s: float) -> bool:
        """The stream's player needs its next frames soon: no audio made yet, or less than
        the urgent slack of audio ahead of it (in the player, and talked not yet vocoded:
        before its first audio is sent, only the latter)."""
        slack_s = self._scheduler.slack_s(record.stream.id, now_s)
        queued_s = record.queued_audio_s
        if slack_s is None:  # no audio sent yet: urgent unless the talker made some already
            if queued_s <= 0.0:
                return True
            slack_s = 0.0
        return max(slack_s, 0.0) + queued_s < self._urgent_slack.limit_s(load)

    def _busy(self, stream_id: str) -> bool:
        record = self._table.records[stream_id]
        return record.sender.parked or record.stepping

    # The outcome.

    def abandon(self, plan: TalkPlan) -> None:
        """The call was cancelled (the engine stops): its segments are closed later by
        `leftovers`, in the talker's thread after the call."""
        if plan.first_audio:
            self._vocoder.first_audio_ended()
        for opened in (*plan.batch, *plan.orphans):
            opened.in_flight = False
            opened.ended = True
            if opened not in self._orphans:  # opened or not: the thread may open it still
                self._orphans.append(opened)

    def leftovers(self) -> TalkPlan | None:
        """A call that only closes the segments of ended streams (at a stop), or None."""
        orphans, self._orphans = self._orphans, []
        orphans = [o for o in orphans if not o.closed]
        return TalkPlan((), [], orphans, [], False) if orphans else None

    def update(self, plan: TalkPlan, outcome: TalkOutcome, now_s: float) -> float:
        """Apply a talker call's outcome; the audio it made (seconds)."""
        table = self._table
        if plan.first_audio:
            self._vocoder.first_audio_ended()
        for opened in plan.batch:
            opened.in_flight = False
        audio_s = 0.0
        if outcome.hung is not None:
            for opened in plan.batch:
                # its segments stay with the abandoned call: never closed from another thread
                opened.closed = True
                table.fail(opened.record, outcome.hung)
            return 0.0
        for opened, error in outcome.open_errors:
            table.fail(opened.record, error)
        if outcome.step_error is not None:
            for opened in outcome.stepped:
                table.fail(opened.record, outcome.step_error)
        else:
            for opened, result in zip(outcome.stepped, outcome.results, strict=True):
                if not table.is_live(opened.record) or opened.ended:
                    continue  # the stream ended during the call
                voice = opened.record.stream.voice
                audio_s += len(result.frames) * voice.samples_per_frame / voice.sample_rate_hz
                self._talked(opened, result.frames, result.done, result.timing)
        for opened in plan.batch:
            if opened.ended:
                self._orphan(opened)  # closed by the next call
        self.steps += 1
        self._vocoder.talker_stepped([opened.record.stream.id for opened in plan.batch])
        return audio_s

    def _talked(
        self,
        opened: OpenSegment,
        frames: np.ndarray,
        done: bool,
        timing: SegmentTiming | None = None,
    ) -> None:
        """One talker step's outcome for one segment (`timing`: the backend's, if any)."""
        record = opened.record
        stream = record.stream
        if len(frames):
            record.frames.append(opened.segment, frames)
            stream.stats.frames += len(frames)
            self._vocoder.frames_changed(record)
        # the timings of these frames go to stream.alignment before they can be vocoded
        record.aligner.talked(opened.request, opened.segment.available_frames, done, timing)
        if not done:
            self.update_candidate(record)
            self._table.frames_made(record)
            return
        opened.segment.done = True
        record.talking = None
        stream.stats.segments += 1
        voice = stream.voice
        audio_s = opened.segment.available_frames * voice.samples_per_frame / voice.sample_rate_hz
        self._table.talked_segment(
            len(opened.request.text), audio_s * stream.speed, voice.language, job=stream.stats.job
        )
        self.update_candidate(record)
        if record.talked_all:
            record.aligner.finish(record.frames.produced_frames)
            stream.state = StreamState.VOCODING
        self._vocoder.frames_changed(record)
        self._table.frames_made(record)
        self._vocoder.finish_if_done(record)

    def prepare_ended(self, stream_id: str, segment_index: int) -> None:
        """A preparation ended (done, dropped or failed). A late end of one whose segment
        was opened meanwhile changes nothing."""
        record = self._table.record(stream_id)
        if record is None or record.preparing != segment_index:
            return
        record.preparing = None
        self._vocoder.talker_stepped([stream_id])  # a chunk ahead held back meanwhile

    # What other transitions tell the talker.

    def update_candidate(self, record: StreamRecord) -> None:
        """Keep the queue in step: a stream wants talker work while it has text waiting or
        a segment open; its horizon or queued audio may have moved."""
        stream = record.stream
        if not record.text and record.talking is None:
            self.queue.remove(stream.id)
            return
        stream_id = stream.id
        state = self._scheduler.state(stream_id)
        if state is None:
            first_seen_s, horizon_s = stream.stats.submitted_at_s, None
        else:
            first_seen_s, horizon_s = state.first_seen_s, state.horizon_s
        # positional: stream_id, order, first_seen_s, horizon_s, queued_audio_s
        self.queue.update(
            TalkerCandidate(stream_id, record.order, first_seen_s, horizon_s, record.queued_audio_s)
        )

    def playback_moved(self, record: StreamRecord) -> None:
        """An ack moved the stream's horizon: its place in the order may change."""
        self.update_candidate(record)
        self._wake()

    def text_added(self, record: StreamRecord) -> None:
        if record.text:
            self.update_candidate(record)
            self._wake()

    def audio_sent(self, record: StreamRecord, first: bool) -> None:
        """The stream sent a chunk (`first`: its first audio, its playback starts)."""
        if first:
            self._wake()
        if self._table.is_live(record):
            self.update_candidate(record)
            if self._waits_on_emit:  # frames waiting for the vocoder went down
                self._waits_on_emit = False
                self._wake()
            elif self._waits_on_vocoder:
                self.vocoder_progressed()

    def vocoder_progressed(self) -> None:
        """The vocoder took, sent or finished work: wake a talker that waits for it to
        leave a core idle, if it does now."""
        if self._waits_on_vocoder and self._vocoder.idle(
            self._table.load(), self.order.busy_max_queued_s is not None
        ):
            self._waits_on_vocoder = False
            self._wake()

    def _orphan(self, opened: OpenSegment) -> None:
        """A segment of an ended stream whose backend state is open: the next call
        closes it."""
        if opened.state is not None and not opened.closed and opened not in self._orphans:
            self._orphans.append(opened)
            self._wake()

    def _forget(self, record: StreamRecord) -> None:
        self.queue.remove(record.stream.id)
        opened = record.talking
        if opened is not None:
            record.talking = None
            opened.ended = True
            if not opened.in_flight:
                self._orphan(opened)  # else its call's update hands it over


class VocoderSide(Protocol):
    """What the talker core asks of the vocoder core (pipeline/vocoder_core.py)."""

    def idle(self, load: Load, pace_on_full_workers: bool) -> bool: ...

    @property
    def turns_running(self) -> int: ...

    def frames_changed(self, record: StreamRecord) -> None: ...

    def finish_if_done(self, record: StreamRecord) -> None: ...

    def talker_stepped(self, stream_ids: list[str]) -> None: ...

    def first_audio_started(self) -> None: ...

    def first_audio_ended(self) -> None: ...

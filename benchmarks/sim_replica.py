"""One engine replica in virtual time, for the discrete-event simulator.

The replica is a second driver of the engine's own cores: the book `build_book` makes
for the engine from the same configuration (pipeline/book.py: the stream table, the
talker core, the vocoder core) over the sim backend (pipeline/backends/sim.py). Every
decision is the engine's code, none is copied here:

- the talker: `TalkerCore.schedule` / `run_talk` / `update` (the order, the segments
  opened and closed, preparations, the drop of prepared work when a stream is no longer
  alone);
- the vocoder: `VocoderCore.schedule` / `update` (selection, work-ahead, the even tail,
  yielding to a first audio, chunks sent in order), over the engine's count of workers;
- admission: scheduling.Admission, the engine's policy and its one fair queue, fed the
  table's owed work (`StreamTable.loads`) and the capacity model of pipeline/capacity.py
  fed per model call as the engine's stages feed it; a queued request is granted when a
  stream leaves its start phase or ends, or after a vocoder turn (as the engine's
  AdmissionFront), and refused at admission.queue_max_wait_s.

What the replica adds is what asyncio and the stage threads do in the engine
(pipeline/talker.py, pipeline/vocoder.py): the loops as event handlers, each call busy for
the cost the sim backend spends (its `sleep`, captured here), the stages and the vocoder
workers overlapping in virtual time. A loop woken while idle runs at the same virtual
instant, after the events already due then (as a task woken by an asyncio.Event runs
after the callbacks already queued); a loop ends its call and plans its next one in the
same handler (as the engine's loop continues without yielding).
tests/test_engine_vs_simulator.py holds the two drivers to the same decisions.

A listener reads its audio at once here (the load generator does), so no stream parks:
the channel's cap is set out of reach and the PCM handed to the book is a shared block of
zeros of the right length (the signal is not needed; its length is).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pipeline.admission import new_stream_audio_s, start_chunk_audio_s
from pipeline.backend import TalkRequest
from pipeline.backends.sim import SimBackend, vocoder_cost_s
from pipeline.book import Wakes, build_book, vocoder_workers
from pipeline.capacity import CapacityEstimate, pipeline_capacity
from pipeline.channel import ReaderEvent
from pipeline.config import (
    AloneConfig,
    EngineConfig,
    SimConfig,
    TalkerConfig,
    TextConfig,
    VocoderConfig,
)
from pipeline.events import NullEvents
from pipeline.records import StreamRecord
from pipeline.stream import Stream
from pipeline.talker_core import TalkOutcome, TalkPlan, run_talk
from scheduling import (
    Admission,
    AdmissionConfig,
    ChunkingConfig,
    Decision,
    LoadView,
    SchedulingConfig,
)

# Unread audio never reaches this: the simulated listener reads everything at once.
_NEVER_PARK_S = 1e9


@dataclass(frozen=True)
class EngineSetup:
    """What one replica runs: the engine's config sections and the sim backend's costs."""

    scheduling: SchedulingConfig
    chunking: ChunkingConfig
    admission: AdmissionConfig
    talker: TalkerConfig
    sim: SimConfig
    engine: EngineConfig = field(default_factory=EngineConfig)
    vocoder: VocoderConfig = field(default_factory=VocoderConfig)
    alone: AloneConfig = field(default_factory=AloneConfig)
    text: TextConfig = field(default_factory=TextConfig)


class EventQueue(Protocol):
    """The simulation's clock and event heap, as a replica sees them."""

    now: float

    def push(self, at_s: float, handler: Callable[[float, object], None], arg: object) -> None:
        """Call `handler(at_s, arg)` at `at_s` (after the events already due then)."""
        ...


@dataclass
class Trace:
    """A replica's decisions in the order it made them (stream ids as the book names them)."""

    admissions: list[tuple[float, bool, str]] = field(default_factory=list)  # (t, accept, why)
    talker_steps: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    vocoder_turns: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    chunks: dict[str, list[int]] = field(default_factory=dict)  # new frames per chunk


class Listener(Protocol):
    """The simulation's side of a replica's streams."""

    def audio(self, stream_id: str, at_s: float, audio_s: float) -> None:
        """A chunk of `audio_s` seconds left the replica at `at_s`."""
        ...

    def done(self, stream_id: str, at_s: float) -> None:
        """All of the stream's audio has left the replica."""
        ...


class Replica:
    """One engine in virtual time; see the module doc."""

    def __init__(
        self,
        index: int,
        setup: EngineSetup,
        queue: EventQueue,
        listener: Listener,
        trace: Trace | None = None,
    ) -> None:
        self.index = index
        self.setup = setup
        self._queue = queue
        self._listener = listener
        self.trace = trace
        talker = setup.talker
        engine = setup.engine
        self._spent_s = 0.0
        self.backend = SimBackend(setup.sim, sleep=self._spend)
        # the engine's own book, built as the engine builds it (pipeline/book.py)
        self.book = build_book(
            scheduling=setup.scheduling,
            chunking=setup.chunking,
            admission=setup.admission,
            talker=talker,
            text=setup.text,
            vocoder=setup.vocoder,
            alone=setup.alone,
            backend=self.backend,
            max_pending_audio_s=_NEVER_PARK_S,
            clock=self._now,
            events=NullEvents(),
            wakes=Wakes(
                talker=self._wake_talker, vocoder=self._wake_vocoder, start=self._wake_admission
            ),
        )
        self.voice = self.backend.voices()[0]
        self._frame_s = self.voice.samples_per_frame / self.voice.sample_rate_hz
        self.admission = Admission(setup.admission)
        self.talker_rate = CapacityEstimate(engine.capacity_window_s)
        # the workers' count, as the engine's Vocoder: their calls overlap
        self.vocoder_rate = CapacityEstimate(
            engine.capacity_window_s, workers=vocoder_workers(setup.vocoder, self.backend)
        )
        self._start_chunk_s = start_chunk_audio_s(setup.chunking, self.voice)
        # queued requests: ticket -> (text, told when granted or refused)
        self._waiting: dict[object, tuple[str, Callable[[Stream | Decision], None]]] = {}
        self._admission_due = False
        self.live: dict[str, None] = {}  # streams with work left, as this replica knows them
        self._pcm: dict[int, np.ndarray] = {}  # zeros per chunk length
        # The talker loop: a step in flight (or its outcome being applied), an iteration
        # queued, the token of the valid high-water timer.
        self._talker_busy = False
        self._talker_due = False
        self._talker_timer = 0
        # The vocoder loop: a turn in flight (or the loop running), an iteration queued,
        # woken since the loop's last pass began.
        # The vocoder's workers (the engine's count), the wake event, its waiters: at the
        # start every worker waits, in order, on an event not set.
        workers = vocoder_workers(setup.vocoder, self.backend)
        self._vocoder_set = False
        self._vocoder_waiting: list[object] = list(range(workers))
        self.talker_steps = 0
        self.vocoder_turns = 0

    # What the simulation asks.

    def capacity(self, now_s: float) -> float:
        """Engine.capacity: the capacity model over both stages."""
        return pipeline_capacity(self.talker_rate, self.vocoder_rate, now_s)

    def view(self, now_s: float) -> LoadView:
        """Engine._load: what admission reads."""
        chunk_s = self._start_chunk_s
        loads = self.book.loads(chunk_s)
        return LoadView(
            self.capacity(now_s),
            loads,
            new_stream_audio_s=new_stream_audio_s(loads, self.book.mean_stream_audio_s),
            start_audio_s=chunk_s * self.setup.admission.start_phase_chunks,
            first_audio_s=self.book.table.first_audio.predict_s(),
        )

    def submit(
        self,
        now_s: float,
        text: str,
        on_decided: Callable[[Stream | Decision], None] | None = None,
    ) -> Stream | Decision:
        """Engine.reserve + submit: a stream admitted now, or a Decision: refused, or
        "queued" (only with `on_decided`, told the stream once granted, or the refusal
        at its longest wait: admission.queue_max_wait_s, or less under a first-audio
        bound)."""
        ticket = object()
        view = self.view(now_s)
        decision = self.admission.offer(now_s, ticket, view, wait=on_decided is not None)
        if self.trace is not None:
            self.trace.admissions.append((now_s, decision.accept, decision.reason))
        if decision.accept:
            return self._start(now_s, text)
        if decision.queued:
            assert on_decided is not None
            self._waiting[ticket] = (text, on_decided)
            # the front's timer: the waiter is refused then if not granted before
            self._queue.push(now_s + self.admission.max_wait_s(view), self._admit, None)
        return decision

    def _start(self, now_s: float, text: str) -> Stream:
        book = self.book
        stream = book.add_stream(self.voice, speed=1.0, now_s=now_s)
        self.live[stream.id] = None
        book.add_text(stream.id, text, final=True)
        self._reap(now_s)
        return stream

    def _wake_admission(self) -> None:
        """AdmissionFront.poke: grant from the next event, not inside the transition."""
        if self._waiting and not self._admission_due:
            self._admission_due = True
            self._queue.push(self._queue.now, self._admit, None)

    def _admit(self, now_s: float, _: object = None) -> None:
        """AdmissionFront.run_grants."""
        self._admission_due = False
        admission = self.admission
        for ticket in admission.grant(self.view(now_s)):
            text, told = self._waiting.pop(ticket)
            if self.trace is not None:
                self.trace.admissions.append((now_s, True, "granted"))
            told(self._start(now_s, text))
        for ticket, decision in admission.expire(now_s, self.view(now_s)):
            _, told = self._waiting.pop(ticket)
            if self.trace is not None:
                self.trace.admissions.append((now_s, False, decision.reason))
            told(decision)

    def cancel(self, stream_id: str) -> None:
        """Engine.cancel: the client is gone."""
        self.live.pop(stream_id, None)
        self.book.cancel(stream_id)

    # Plumbing.

    def _now(self) -> float:
        return self._queue.now

    def _spend(self, seconds: float) -> None:
        """The sim backend's `sleep`: the stage is busy this much longer."""
        self._spent_s += seconds

    def _take_spent(self) -> float:
        spent, self._spent_s = self._spent_s, 0.0
        return spent

    def _reap(self, now_s: float, touched: Sequence[StreamRecord] = ()) -> None:
        """Tell the listener of streams whose audio is all sent (the book dropped them)."""
        book, live = self.book, self.live
        if len(book) >= len(live):
            return
        for record in touched:
            stream_id = record.stream.id
            if stream_id in live and book.record(stream_id) is None:
                self._finished(stream_id, now_s)
        if len(book) < len(live):
            for stream_id in [s for s in live if book.record(s) is None]:
                self._finished(stream_id, now_s)

    def _finished(self, stream_id: str, now_s: float) -> None:
        del self.live[stream_id]
        self._listener.done(stream_id, now_s)
        self.book.table.reader_event(stream_id, ReaderEvent.READ_ALL)  # read all at once

    # The talker: pipeline/talker.py's driver of the talker core, in virtual time.

    def _wake_talker(self) -> None:
        if not self._talker_busy and not self._talker_due:
            self._talker_due = True
            self._queue.push(self._queue.now, self._talker_woken, None)

    def _talker_woken(self, now_s: float, _: object) -> None:
        self._talker_due = False
        self._talker_timer += 1  # the wait ended: its timeout no longer fires
        self._talker_loop(now_s)

    def _talker_timeout(self, now_s: float, token: object) -> None:
        if token == self._talker_timer and not self._talker_busy and not self._talker_due:
            self._talker_timer += 1
            self._talker_loop(now_s)

    def _talker_loop(self, now_s: float) -> None:
        core = self.book.talker
        self._talker_busy = True
        while True:
            if core.drop_prepared_due():
                self.backend.drop_prepared()
            plan = core.schedule(now_s)
            if plan is None:
                break
            if plan.stream_ids and self.trace is not None:
                self.trace.talker_steps.append((now_s, plan.stream_ids))
            outcome = run_talk(self.backend, plan, self._watch_prepare)
            self.talker_steps += 1
            cost_s = self._take_spent()
            if cost_s > 0:
                self._queue.push(now_s + cost_s, self._talked, (now_s, plan, outcome))
                return
            self._apply_step(now_s, now_s, plan, outcome)  # nothing was stepped
        self._talker_busy = False
        if core.retry_in_s is not None:  # a stream above the high-water mark falls under it
            self._queue.push(
                now_s + max(core.retry_in_s, 0.0), self._talker_timeout, self._talker_timer
            )
        self._reap(now_s)

    def _watch_prepare(self, stream_id: str, request: TalkRequest, done: object) -> None:
        """Talker._watch_prepare: the sim's preparations are done at once; their end is
        booked from the next event (the engine's loop.call_soon_threadsafe)."""
        index = request.segment_index
        self._queue.push(
            self._queue.now, lambda _s, _a: self.book.talker.prepare_ended(stream_id, index), None
        )

    def _talked(self, now_s: float, arg: object) -> None:
        started_s, plan, outcome = arg  # type: ignore[misc]
        self._apply_step(started_s, now_s, plan, outcome)
        self._reap(now_s, [o.record for o in outcome.stepped])
        # the engine's lane ends by waking the talker loop, another task: the vocoder,
        # woken by the new frames first, looks at the book before the talker plans again
        self._talker_busy = False
        self._wake_talker()

    def _apply_step(
        self, started_s: float, now_s: float, plan: TalkPlan, outcome: TalkOutcome
    ) -> None:
        audio_s = self.book.talker.update(plan, outcome, now_s)
        if outcome.stepped:
            self.talker_rate.record(started_s, now_s, audio_s)

    # The vocoder: pipeline/vocoder.py's workers over the vocoder core, in virtual time.
    #
    # The engine's workers share one asyncio.Event: `set` resumes every worker waiting
    # on it, in the order they began to wait, each in its own later callback; a worker
    # clears the event before it asks the core for a plan, and with none waits again,
    # at once resumed if the event was set meanwhile. Replayed here: `_vocoder_set` is
    # the event, `_vocoder_waiting` the waiters in order.

    def _wake_vocoder(self) -> None:
        if self._vocoder_set:
            return
        self._vocoder_set = True
        waiting, self._vocoder_waiting = self._vocoder_waiting, []
        for worker in waiting:
            self._queue.push(self._queue.now, self._vocoder_resumed, worker)

    def _vocoder_resumed(self, now_s: float, worker: object) -> None:
        self._vocoder_loop(now_s, worker)
        self._reap(now_s)

    def _vocoder_loop(self, now_s: float, worker: object) -> None:
        core = self.book.vocoder
        while True:
            self._vocoder_set = False  # the worker clears the event
            plan = core.schedule(now_s)
            if plan is not None:
                break
            if not self._vocoder_set:  # else the worker's wait returns at once
                self._vocoder_waiting.append(worker)
                return
        if self.trace is not None:
            self.trace.vocoder_turns.append((now_s, tuple(plan.stream_ids)))
        decoded = sum(chunk.context_stop - chunk.context_start for _, chunk in plan.batch)
        cost_s = vocoder_cost_s(self.setup.sim, decoded, len(plan.batch))
        self._queue.push(now_s + cost_s, self._vocoded, (worker, plan))

    def _vocoded(self, now_s: float, arg: object) -> None:
        worker, plan = arg  # type: ignore[misc]
        book = self.book
        samples_per_frame = self.voice.samples_per_frame
        # what each stream of the call has in flight, in order: a chunk decoded before an
        # earlier one is held and leaves with it (the core sends them in this order)
        taken = [(r, [e.chunk for e in r.in_flight], r.stream.stats.chunks) for r, _ in plan.batch]
        pcms = [self._zeros(chunk.frames * samples_per_frame) for _, chunk in plan.batch]
        audio_s = book.vocoder.update(plan, pcms, now_s)
        for record, in_flight, chunks_before in taken:
            stream_id = record.stream.id
            for chunk in in_flight[: record.stream.stats.chunks - chunks_before]:
                self._listener.audio(stream_id, now_s, chunk.frames * self._frame_s)
                if self.trace is not None:
                    self.trace.chunks.setdefault(stream_id, []).append(chunk.frames)
        self.vocoder_turns += 1
        self.vocoder_rate.record(plan.started_s, now_s, audio_s)
        self._wake_admission()  # Engine._turn_capacity: the capacity moved
        self._reap(now_s, [record for record, _ in plan.batch])
        self._vocoder_loop(now_s, worker)
        self._reap(now_s)

    def _zeros(self, samples: int) -> np.ndarray:
        pcm = self._pcm.get(samples)
        if pcm is None:
            pcm = self._pcm[samples] = np.zeros(samples, dtype=np.float32)
        return pcm

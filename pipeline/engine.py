"""The engine: a small facade over the stream book and the two stages.

    submit -> text segments -> [Talker: step-wise, batched, deadline-ordered] -> codec frames
           -> [Vocoder: PlaybackScheduler picks K ready streams] -> PCM -> Stream.chunks()

- pipeline/book.py: the StreamBook owns every stream's state and transitions;
- pipeline/talker.py: the Talker loop (the book's scheduling.TalkerQueue picks the batch);
- pipeline/vocoder.py: the Vocoder loop (PlaybackScheduler.select picks the K chunks);
- pipeline/channel.py: a stream's audio, a send half (the book's) and a receive half
  (the caller's Stream).

The Engine admits streams (scheduling.Admission against the measured capacity), starts
the two loops together in one task group and stops them together, and reports through
its events. If either loop dies, the other is stopped, every stream fails, and `ready`
turns false.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from functools import partial

from pipeline.backend import Backend, Voice
from pipeline.book import StreamBook, Wakes
from pipeline.capacity import pipeline_capacity
from pipeline.config import EngineConfig, TalkerConfig, VocoderConfig
from pipeline.errors import NotReady, Rejected, UnknownVoice
from pipeline.events import EngineEvents, EngineStats, GuardedEvents, NullEvents
from pipeline.executor import StageExecutor
from pipeline.stream import Stream
from pipeline.talker import Talker, talker_order
from pipeline.text import Segmenter, segment_options
from pipeline.vocoder import Vocoder
from scheduling import (
    Admission,
    AdmissionConfig,
    ChunkingConfig,
    ChunkPlanner,
    PlaybackScheduler,
    SchedulingConfig,
    warn_if_first_chunk_too_short,
)

__all__ = ["Engine", "EngineEvents", "Reservation"]

# What the calibration speaks: plain sentences of ordinary length.
CALIBRATION_TEXT = (
    "The morning train was late again, so we walked along the river instead. "
    "By the time we reached the bridge, the fog had lifted and the city was awake. "
    "Nobody seemed to mind the delay; there was coffee, and the light was lovely."
)


async def _read_out(stream: Stream) -> None:
    """Read a stream's audio as fast as it comes (a calibration stream's reader)."""
    async for _ in stream.chunks():
        pass


log = logging.getLogger("playhead.engine")


class Reservation:
    """An admitted slot of `Engine.reserve`, for one `submit` or one `release`.

    It may also have to wait for a start slot (admission.max_starting_streams):
    `await wait_start()` before `submit`. A reservation holds its start slot (or its
    place in the engine's start queue) until it is used or released."""

    __slots__ = ("_engine", "_queued_at_s", "_start", "_timer", "start_wait_s", "starting")

    def __init__(self, engine: Engine) -> None:
        self._engine: Engine | None = engine
        self.starting = False  # holds a start slot (counts as a starting stream)
        # how long it waited in the start queue for its slot (engine clock; 0: a slot was
        # free at once); the stream's `StreamStats.start_wait_s`
        self.start_wait_s = 0.0
        self._queued_at_s = 0.0
        # while queued for a start slot: resolved when granted (None), refused at the
        # queue timeout (Rejected) or when the engine stops taking streams (NotReady)
        self._start: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def queued(self) -> bool:
        """Waiting for a start slot (not granted, not refused yet)."""
        return self._start is not None and not self._start.done()

    async def wait_start(self) -> None:
        """Returns once this reservation holds a start slot (at once when it was free, or
        when the start-phase limit is off); raises Rejected (reason "starting") after
        `admission.start_queue_timeout_s`, NotReady when the engine stops or drains
        meanwhile. Cancelled (its client gone), it keeps its reservation: `release` it."""
        if self._start is not None:
            await self._start

    def take(self, engine: Engine) -> bool:
        """Use the slot up for a stream `engine.submit` creates at once, without
        yielding (True), or False if it was used or released already."""
        if self._engine is not engine:
            return False
        self._engine = None
        engine._release(self)  # the stream, created in the same step, counts from now on
        return True

    def release(self) -> None:
        """Give the slot back unused (idempotent)."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine._release(self)


_DEFAULT_ENGINE = EngineConfig()
_DEFAULT_TALKER = TalkerConfig()
_DEFAULT_VOCODER = VocoderConfig()


class Engine:
    """Build, `await start()`, `submit`, `await stop()`."""

    def __init__(
        self,
        backend: Backend,
        *,
        scheduling: SchedulingConfig,
        chunking: ChunkingConfig,
        admission: AdmissionConfig,
        engine: EngineConfig = _DEFAULT_ENGINE,
        talker: TalkerConfig = _DEFAULT_TALKER,
        vocoder: VocoderConfig = _DEFAULT_VOCODER,
        clock: Callable[[], float] = time.monotonic,
        events: EngineEvents | None = None,
    ) -> None:
        warn_if_first_chunk_too_short(scheduling, chunking, log)
        self._backend = backend
        self._admission = Admission(admission)
        self._config = engine
        self._clock = clock
        # hooks that raise are logged, never passed into the loops
        self._events = GuardedEvents(events if events is not None else NullEvents())
        self._voices = backend.voices()
        self._scheduling = scheduling
        self._talker_config = talker
        self._vocoder_config = vocoder
        self._chunking = chunking
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False
        self._admission_closed = False
        # the start-up calibration's result: audio s per s (0 = not calibrated)
        self.calibrated_capacity = 0.0
        self.calibrations = 0  # calibrations that measured something
        self._calibration: list[Stream] | None = None  # streams of a running calibration
        self._reserved = 0  # admitted by reserve(), not yet submitted or released
        self._reserved_starting = 0  # of those, the ones holding a start slot
        # reservations waiting for a start slot, first come first served
        self._start_queue: deque[Reservation] = deque()
        self._grant_pending = False  # a _grant_starts is scheduled on the event loop
        self._last_activity_s = clock()
        self._build()

    def _build(self) -> None:
        """Fresh stages and book (at construction, and to start again after a stop)."""
        engine, talker, scheduling = self._config, self._talker_config, self._scheduling
        stage = partial(
            StageExecutor,
            clock=self._clock,
            call_timeout_s=engine.call_timeout_s,
            on_timeout=self._stage_timed_out,
        )
        self.talker_stage = stage("talker")
        # a second talker lane where the backend's steps may run side by side
        concurrent = getattr(self._backend, "concurrent_talker_steps", False)
        self.urgent_stage = stage("talker-urgent") if talker.urgent_lane and concurrent else None
        self.vocoder_stage = stage("vocoder")
        # more vocoder workers where the backend's vocode calls may run side by side
        workers = self._vocoder_config.workers
        concurrent_vocode = getattr(self._backend, "concurrent_vocode_calls", False)
        if not concurrent_vocode:
            workers = 1
        self.extra_vocoder_stages = [stage(f"vocoder-{index}") for index in range(1, workers)]
        # the start lane: one more thread for streams' first chunks while every worker is busy
        start_lane_chunks = self._vocoder_config.start_lane_chunks if concurrent_vocode else 0
        self.start_vocoder_stage = stage("vocoder-start") if start_lane_chunks else None
        # more than one worker (their calls overlap): one may wait for a first audio
        yield_slack_s = self._vocoder_config.yield_slack_s if self.extra_vocoder_stages else 0.0
        self.book = StreamBook(
            scheduler=PlaybackScheduler(scheduling),
            planner=ChunkPlanner(self._chunking),
            segmenter=partial(Segmenter, **segment_options(talker)),
            max_pending_audio_s=engine.max_pending_audio_s,
            left_context_frames=self._chunking.left_context_frames,
            first_chunk_s=scheduling.first_chunk_ms / 1000.0,
            clock=self._clock,
            events=self._events,
            wakes=Wakes(
                talker=self._wake_talker, vocoder=self._wake_vocoder, start=self._wake_starts
            ),
            # tracked only where the start-phase limit applies: nothing else bounds the set,
            # and admission reads it at every request
            start_phase_chunks=self._admission.config.start_phase_chunks
            if self._admission.config.enabled and self._admission.config.max_starting_streams
            else 0,
            max_in_flight=workers if self._vocoder_config.work_ahead_streams else 1,
            work_ahead_streams=self._vocoder_config.work_ahead_streams,
            vocoder_workers=workers,
            start_lane_chunks=start_lane_chunks,
            first_audio_yield=yield_slack_s > 0,
            urgent_slack_s=talker.urgent_slack_s,
            alone_urgent_slack_s=talker.alone_urgent_slack_s,
            work_ahead_while_talking=self._vocoder_config.work_ahead_while_talking,
        )
        self.talker = Talker(
            self.book,
            self._backend,
            self.talker_stage,
            talker_order(talker, scheduling),
            clock=self._clock,
            events=self._events,
            capacity_window_s=engine.capacity_window_s,
            initial_capacity_audio_s_per_s=engine.initial_capacity_audio_s_per_s,
            urgent_stage=self.urgent_stage,
            prepare_ahead_streams=talker.prepare_ahead_streams,
        )
        self.vocoder = Vocoder(
            self.book,
            self._backend,
            self.vocoder_stage,
            window=scheduling.active_stream_window,
            clock=self._clock,
            events=self._events,
            capacity_window_s=engine.capacity_window_s,
            initial_capacity_audio_s_per_s=engine.initial_capacity_audio_s_per_s,
            capacity=self.capacity,
            extra_stages=self.extra_vocoder_stages,
            yield_slack_s=yield_slack_s,
            start_stage=self.start_vocoder_stage,
        )

    def _stage_timed_out(self, stage: str, timeout_s: float) -> None:
        log.error(
            "a %s model call hung for more than %g s: its streams fail, the stage goes on "
            "in a fresh thread",
            stage,
            timeout_s,
        )
        self._events.stage_timeout(stage)

    def _wake_talker(self) -> None:
        self.talker.wake.set()

    def _wake_vocoder(self) -> None:
        self.vocoder.wake.set()

    def _wake_starts(self) -> None:
        """A start slot may be free: the start queue goes on, from the event loop (not
        from inside the book's transition)."""
        if self._grant_pending or not self._start_queue:
            return
        self._grant_pending = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a book driven by hand): at once
            self._grant_starts()
        else:
            loop.call_soon(self._grant_starts)

    # Lifecycle.

    async def start(self) -> None:
        if self._supervisor is not None:
            return
        if self.talker_stage.closed:  # started again after a stop
            self._build()
        self._stopping = False
        started = asyncio.Event()
        self._supervisor = asyncio.get_running_loop().create_task(
            self._run(started), name="playhead-engine"
        )
        await started.wait()
        await self.calibrate()

    async def _run(self, started: asyncio.Event) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.talker.run(), name="playhead-talker-loop")
                group.create_task(self.vocoder.run(), name="playhead-vocoder-loop")
                if self._config.calibration_calls and self._config.recalibrate_idle_s:
                    group.create_task(self._recalibrate_when_idle(), name="playhead-calibration")
                started.set()
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # a loop died: the group stopped the other one
            cause = error.exceptions[0] if isinstance(error, BaseExceptionGroup) else error
            log.error("an engine loop died; failing every stream", exc_info=cause)
            self._refuse_start_queue("the engine stopped")
            self.book.fail_all(cause)
        finally:
            started.set()

    # Calibration.

    async def calibrate(self) -> float:
        """Measure the capacity: internal streams of CALIBRATION_TEXT (one per vocoder
        batch slot, at least 2) run through both stages, at once, until the vocoder made
        `engine.calibration_calls` calls; their events are not reported. The result
        anchors the capacity estimate (pipeline/capacity.py) and sets the default
        `admission.max_streams`. A stream submitted meanwhile ends the calibration at once
        (what it measured is discarded). Returns the calibrated capacity (0: none)."""
        config = self._config
        if not config.calibration_calls or not self.ready or self._calibration is not None:
            return self.calibrated_capacity
        streams: list[Stream] = []
        self._calibration = streams
        self._events.muted = True
        try:
            measured = await self._calibrate(streams)
        finally:
            # a submit may have ended it already (and unmuted the events)
            if self._calibration is streams:
                self._calibration = None
                self._end_calibration(streams)
            self._last_activity_s = self._clock()
        return measured

    async def _calibrate(self, streams: list[Stream]) -> float:
        config = self._config
        loop = asyncio.get_running_loop()
        book = self.book
        voice = self.resolve_voice(self._backend.default_voice())
        count = max(2, self._scheduling.active_stream_window, min(self._talker_config.batch, 16))
        turns_before = self.vocoder.turns
        for rate in (self.vocoder.rate, self.talker.rate):
            rate.set_baseline(0.0, 0.0)  # measure afresh
        started_s = loop.time()

        def running() -> bool:
            return (
                self._calibration is streams and loop.time() - started_s < config.calibration_max_s
            )

        now_s = self._clock()
        for _ in range(count):
            stream = book.add_stream(voice, speed=1.0, now_s=now_s)
            book.add_text(stream.id, CALIBRATION_TEXT, final=True)
            streams.append(stream)
        readers = [asyncio.ensure_future(_read_out(stream)) for stream in streams]
        # the first chunks of a stream are small (the ramp): a loaded server decodes
        # steady chunks, so the turns of the ramp are run but not measured
        window = max(1, self._scheduling.active_stream_window)
        ramp_turns = math.ceil(count * max(1, len(self._chunking.ramp)) / window)
        try:
            while (
                running()
                and self.vocoder.turns - turns_before < ramp_turns
                and not all(reader.done() for reader in readers)
            ):
                await asyncio.sleep(0.005)
            self.vocoder.rate.reset()
            self.talker.rate.reset()
            turns_before = self.vocoder.turns
            while (
                running()
                and self.vocoder.turns - turns_before < config.calibration_calls
                and not all(reader.done() for reader in readers)
            ):
                await asyncio.sleep(0.005)
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
        if self._calibration is not streams:  # a submit ended it
            return self.calibrated_capacity
        for stream in streams:
            book.cancel(stream.id)
        # the talker closes the calibration's open segments (orphans), and the vocoder's
        # turn in flight ends, before anything is reported again. Not "until the vocoder
        # waits once more": when every calibration stream had ended already, it was
        # waiting before this point and nothing wakes it, so that waited out
        # calibration_max_s (5 s at start-up, in about 2% of starts on the sim backend)
        while running() and (book.has_orphans or self.talker.lanes_busy or book.turns_running):
            await asyncio.sleep(0.002)
        if self._calibration is not streams or self.vocoder.turns == turns_before:
            return self.calibrated_capacity
        now_s = self._clock()
        vocoder_rate, talker_rate = self.vocoder.rate.value(now_s), self.talker.rate.value(now_s)
        floor = config.capacity_floor
        self.vocoder.rate.set_baseline(vocoder_rate, floor)
        self.talker.rate.set_baseline(talker_rate, floor)
        self.calibrated_capacity = pipeline_capacity(vocoder_rate, talker_rate)
        self.calibrations += 1
        log.info(
            "calibrated in %.2f s: vocoder %.1f, talker %.1f audio s/s; capacity %.1f "
            "streams at 1x (max_streams %s)",
            loop.time() - started_s,
            vocoder_rate,
            talker_rate,
            self.calibrated_capacity,
            self._admission.config.max_streams or self.default_max_streams,
        )
        return self.calibrated_capacity

    def _end_calibration(self, streams: list[Stream]) -> None:
        """Cancel a calibration's streams (not reported) and report events again."""
        self._events.muted = True
        for stream in streams:
            self.book.cancel(stream.id)
        self._events.muted = False

    async def _recalibrate_when_idle(self) -> None:
        """Calibrate again after `engine.recalibrate_idle_s` with no stream at all."""
        idle_s = self._config.recalibrate_idle_s
        while True:
            await asyncio.sleep(max(idle_s / 4, 0.01))
            quiet_s = self._clock() - self._last_activity_s
            if self.in_flight == 0 and quiet_s >= idle_s:
                try:
                    await self.calibrate()
                except Exception:  # never a reason to stop the engine
                    log.exception("recalibration failed")

    @property
    def default_max_streams(self) -> int:
        """`admission.max_streams` when set to 0: the calibrated capacity times the
        headroom, rounded down (at least 1); 0 (no cap) before any calibration."""
        if self.calibrated_capacity <= 0:
            return 0
        headroom = self._admission.config.capacity_headroom
        return max(1, math.floor(self.calibrated_capacity * headroom + 1e-9))

    async def stop(self) -> None:
        self._stopping = True
        self._refuse_start_queue("the engine is stopping")
        self.book.cancel_all()
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
        await self.talker_stage.aclose()
        if self.urgent_stage is not None:
            await self.urgent_stage.aclose()
        await self.vocoder_stage.aclose()
        for stage in self.extra_vocoder_stages:
            await stage.aclose()
        if self.start_vocoder_stage is not None:
            await self.start_vocoder_stage.aclose()

    @property
    def ready(self) -> bool:
        supervisor = self._supervisor
        return supervisor is not None and not self._stopping and not supervisor.done()

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def policy(self) -> str:
        return self.book.scheduler.policy_name

    # Requests.

    def resolve_voice(self, voice: str) -> Voice:
        for candidate in self._voices:
            if candidate.id == voice:
                return candidate
        folded = voice.casefold()
        for candidate in self._voices:
            if folded in (candidate.id.casefold(), candidate.name.casefold()):
                return candidate
        raise UnknownVoice(voice, [v.id for v in self._voices])

    def reserve(self) -> Reservation:
        """Admission decided now, before a request's slower preparation (its text
        normalised in a worker thread): NotReady or Rejected at once, else a Reservation
        that counts as a playing stream until `submit(..., reservation=it)` turns it into
        the stream or `release()` gives it back. Without it a burst would pass the check
        before any of its streams exist.

        The start-phase limit (admission.max_starting_streams, once calibrated): the
        reservation takes a start slot at once when one is free and nobody waits for
        one; else it joins the start queue (`Reservation.wait_start`), where it counts
        as starting for later arrivals. Slots go in arrival order as starting streams
        leave their start phase."""
        self._admit_check()
        self._reserved += 1
        reservation = Reservation(self)
        if not self._start_queue and self._start_slot_free():
            reservation.starting = True
            self._reserved_starting += 1
            self._events.start_waited(0.0)
            return reservation
        timeout_s = self._admission.config.start_queue_timeout_s
        if timeout_s <= 0:  # no queue: the 429 at once
            self._reserved -= 1
            reservation._engine = None
            raise self._refuse_start()
        loop = asyncio.get_running_loop()
        reservation._queued_at_s = self._clock()
        reservation._start = loop.create_future()
        reservation._timer = loop.call_later(timeout_s, self._start_timed_out, reservation)
        self._start_queue.append(reservation)
        self._wake_starts()  # a slot that freed unannounced is not left idle
        return reservation

    def starting_streams(self) -> int:
        """Streams in their start phase (`StreamBook.starting_streams`), reservations
        holding a start slot, and reservations waiting for one."""
        return self.book.starting_streams() + self._reserved_starting + len(self._start_queue)

    def _start_slot_free(self) -> bool:
        # the start-phase limit, like the default max_streams, needs a calibration
        return self.calibrated_capacity <= 0 or self._admission.start_slot_free(
            self.book.starting_streams() + self._reserved_starting
        )

    def _refuse_start(self) -> Rejected:
        decision = self._admission.starting()
        self._events.rejected(decision.reason)
        return Rejected(decision)

    def _grant_starts(self) -> None:
        """Give free start slots to the queue's first reservations, in order."""
        self._grant_pending = False
        queue = self._start_queue
        while queue and self._start_slot_free():
            reservation = queue.popleft()
            self._end_wait(reservation)
            future = reservation._start
            if future is None or future.done():  # its waiter was cancelled
                continue
            reservation.starting = True
            self._reserved_starting += 1
            reservation.start_wait_s = max(0.0, self._clock() - reservation._queued_at_s)
            self._events.start_waited(reservation.start_wait_s)
            future.set_result(None)

    def _end_wait(self, reservation: Reservation) -> None:
        timer, reservation._timer = reservation._timer, None
        if timer is not None:
            timer.cancel()

    def _start_timed_out(self, reservation: Reservation) -> None:
        reservation._timer = None
        self._grant_starts()  # a slot free now goes to the queue's first, maybe this one
        future = reservation._start
        try:
            self._start_queue.remove(reservation)
        except ValueError:
            return
        if future is not None and not future.done():
            future.set_exception(self._refuse_start())

    def _refuse_start_queue(self, why: str) -> None:
        """The engine takes no more streams: every waiter gets NotReady (a 503)."""
        queue, self._start_queue = self._start_queue, deque()
        for reservation in queue:
            self._end_wait(reservation)
            future = reservation._start
            if future is not None and not future.done():
                future.set_exception(NotReady(why))

    def _release(self, reservation: Reservation) -> None:
        self._reserved -= 1
        if reservation.starting:
            reservation.starting = False
            self._reserved_starting -= 1
        future = reservation._start
        if future is not None:
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()  # retrieved: a refusal nobody awaited is no error
            self._end_wait(reservation)
            if reservation in self._start_queue:  # a few: the queue holds at most a burst
                self._start_queue.remove(reservation)
        self._wake_starts()  # a slot (or a place in the queue) is free

    def admitted_streams(self, now_s: float) -> int:
        """What admission counts as taken: the playing streams (`StreamBook.
        playing_streams`) plus the reservations not yet turned into streams."""
        return self.book.playing_streams(now_s) + self._reserved

    def _check_open(self) -> None:
        if not self.ready:
            raise NotReady("the engine is not running")
        if self._admission_closed:
            raise NotReady("the engine is shutting down")

    def _admit_check(self) -> float:
        """NotReady or Rejected (counted), or the admission's clock reading."""
        self._check_open()
        calibration, self._calibration = self._calibration, None
        if calibration is not None:  # a real stream ends a recalibration
            self._end_calibration(calibration)
        now_s = self._clock()
        self._last_activity_s = now_s
        # capacity only: the start-phase limit is the start queue's (reserve)
        decision = self._admission.decide(
            now_s,
            self.admitted_streams(now_s),
            self.capacity(now_s),
            finish_times_s=self.book.finish_times_s(now_s),
            default_max_streams=self.default_max_streams,
        )
        if not decision.accept:
            self._events.rejected(decision.reason)
            raise Rejected(decision)
        return now_s

    def submit(
        self,
        text: str,
        *,
        voice: str,
        speed: float = 1.0,
        final: bool = True,
        reservation: Reservation | None = None,
    ) -> Stream:
        """Admit a stream for `text`. With final=False more text follows (`append_text`).
        With a live `reservation` (from `reserve`, waited with `wait_start`) admission was
        decided already: it is used up (also when this raises). Without one only the
        capacity is checked, not the start-phase limit (a synchronous caller cannot wait
        for a start slot): the stream counts as starting from now on all the same."""
        held = reservation is not None and reservation.take(self)
        resolved = self.resolve_voice(voice)
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed must be a finite number > 0, got {speed!r}")
        if held:
            self._check_open()
            now_s = self._clock()
            self._last_activity_s = now_s
        else:
            now_s = self._admit_check()
        book = self.book
        stream = book.add_stream(resolved, speed=speed, now_s=now_s)
        if held:
            stream.stats.start_wait_s = reservation.start_wait_s
        book.add_text(stream.id, text, final=final)
        return stream

    def append_text(self, stream_id: str, text: str, *, final: bool = False) -> None:
        """More text for a stream submitted with final=False; final=True closes it."""
        self.book.add_text(stream_id, text, final=final)

    def ack_playback(self, stream_id: str, played_s: float) -> None:
        """The client has played `played_s` seconds of this stream (client truth).
        Ignored before the stream's first audio: there is no playback to correct yet."""
        self.book.ack_playback(stream_id, played_s, self._clock())

    def cancel(self, stream_id: str) -> None:
        self.book.cancel(stream_id)

    def close_admission(self) -> None:
        """Refuse every new stream from now on (NotReady); the streams in flight go on."""
        self._admission_closed = True
        self._refuse_start_queue("the engine is shutting down")

    def cancel_all(self) -> None:
        """Cancel every stream (a shutdown whose grace ran out)."""
        self.book.cancel_all()

    @property
    def in_flight(self) -> int:
        """Streams not yet ended: with work left, or with audio their client has not read."""
        return len(self.book.stream_ids())

    async def wait_idle(self, poll_s: float = 0.05) -> None:
        """Returns once no stream is in flight."""
        while self.in_flight:
            await asyncio.sleep(poll_s)

    def capacity(self, now_s: float | None = None) -> float:
        """Audio seconds per wall second the pipeline produces when busy."""
        now_s = self._clock() if now_s is None else now_s
        return pipeline_capacity(self.vocoder.rate.value(now_s), self.talker.rate.value(now_s))

    def stats(self) -> EngineStats:
        return self.book.stats(self.capacity())

    def traces(self, stream_id: str) -> list[str]:
        """Where the engine still holds this stream (empty once it is finished)."""
        return self.book.traces(stream_id)

"""The engine: a small facade over the stream book and the two stages.

    submit -> text segments -> [Talker: step-wise, batched, deadline-ordered] -> codec frames
           -> [Vocoder: PlaybackScheduler picks K ready streams] -> PCM -> Stream.chunks()

- pipeline/book.py: the StreamBook, the engine's state: the stream table
  (pipeline/table.py) and the two stage cores, plain code that decides
  (pipeline/talker_core.py, pipeline/vocoder_core.py: schedule -> plan, update);
- pipeline/talker.py: the talker's driver (runs the talker core's plans in its thread);
- pipeline/vocoder.py: the vocoder's driver (one loop per worker, a thread each);
- pipeline/channel.py: a stream's audio, a send half (the table's) and a receive half
  (the caller's Stream).

The Engine admits streams (pipeline/admission.py: scheduling.Admission against the
capacity model of pipeline/capacity.py and the work the book still owes), starts
the two loops together in one task group and stops them together, and reports through
its events. If either loop dies, the other is stopped, every stream fails, and `ready`
turns false.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from pipeline.admission import (
    AdmissionFront,
    Reservation,
    new_stream_audio_s,
    start_chunk_audio_s,
)
from pipeline.backend import Backend, Voice, backend_capabilities
from pipeline.book import Wakes, build_book, vocoder_workers
from pipeline.calibration import CalibrationRun, end_calibration, measure_groups
from pipeline.capacity import pipeline_capacity, slower_stage
from pipeline.config import AloneConfig, EngineConfig, TalkerConfig, TextConfig, VocoderConfig
from pipeline.errors import NotReady, UnknownVoice
from pipeline.events import EngineEvents, EngineStats, GuardedEvents, NullEvents
from pipeline.executor import StageExecutor
from pipeline.stream import Stream
from pipeline.talker import Talker
from pipeline.vocoder import Vocoder
from pipeline.voice_costs import voice_costs_of
from scheduling import (
    Admission,
    AdmissionConfig,
    ChunkingConfig,
    LoadView,
    SchedulingConfig,
    warn_if_first_chunk_too_short,
)

__all__ = ["Engine", "EngineEvents", "Reservation"]  # Reservation: pipeline/admission.py

log = logging.getLogger("playhead.engine")


_DEFAULT_ENGINE = EngineConfig()
_DEFAULT_TALKER = TalkerConfig()
_DEFAULT_TEXT = TextConfig()
_DEFAULT_VOCODER = VocoderConfig()
_DEFAULT_ALONE = AloneConfig()


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
        text: TextConfig = _DEFAULT_TEXT,
        vocoder: VocoderConfig = _DEFAULT_VOCODER,
        alone: AloneConfig = _DEFAULT_ALONE,
        clock: Callable[[], float] = time.monotonic,
        events: EngineEvents | None = None,
    ) -> None:
        warn_if_first_chunk_too_short(scheduling, chunking, log)
        self._backend = backend
        # what the backend can do beyond the required calls, read once (TypeError if ill-declared)
        self._capabilities = backend_capabilities(backend)
        self._admission_config = admission
        self._config = engine
        self._clock = clock
        # hooks that raise are logged, never passed into the loops
        self._events = GuardedEvents(events if events is not None else NullEvents())
        self._voices = backend.voices()
        # each voice's cost per audio second against the default voice's backend's
        self.voice_costs, self._group_voices = voice_costs_of(backend)
        # a batched loop's capacity, said by the backend (0: measured, pipeline/capacity.py)
        declared = getattr(backend, "sustained_streams", None)
        self._sustained_streams = float((declared() if declared else None) or 0.0)
        self._scheduling = scheduling
        self._talker_config = talker
        self._text_config = text
        self._vocoder_config = vocoder
        self._alone_config = alone
        self._chunking = chunking
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False
        self._admission_closed = False
        # the start-up calibration's result: audio s per s (0 = not calibrated)
        self.calibrated_capacity = 0.0
        self.calibrations = 0  # calibrations that measured something
        self._calibration: list[Stream] | None = None  # streams of a running calibration
        self.admission = AdmissionFront(
            Admission(admission), clock=clock, events=self._events, load=self._load
        )
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
        capabilities = self._capabilities
        # a second talker lane where the backend's steps may run side by side
        concurrent = capabilities.concurrent_talker_steps
        self.urgent_stage = stage("talker-urgent") if talker.urgent_lane and concurrent else None
        self.vocoder_stage = stage("vocoder")
        # more vocoder workers where the backend's vocode calls may run side by side
        workers = vocoder_workers(self._vocoder_config, self._backend)
        self.extra_vocoder_stages = [stage(f"vocoder-{index}") for index in range(1, workers)]
        self.book = build_book(
            scheduling=scheduling,
            chunking=self._chunking,
            admission=self._admission_config,
            talker=talker,
            text=self._text_config,
            vocoder=self._vocoder_config,
            alone=self._alone_config,
            backend=self._backend,
            max_pending_audio_s=engine.max_pending_audio_s,
            clock=self._clock,
            events=self._events,
            wakes=Wakes(
                talker=self._wake_talker, vocoder=self._wake_vocoder, start=self.admission.poke
            ),
        )
        self.talker = Talker(
            self.book.talker,
            self._backend,
            self.talker_stage,
            clock=self._clock,
            events=self._events,
            capacity_window_s=engine.capacity_window_s,
            urgent_stage=self.urgent_stage,
            cost=self.voice_costs.cost,
        )
        self.vocoder = Vocoder(
            self.book.vocoder,
            self._backend,
            self.vocoder_stage,
            clock=self._clock,
            events=self._events,
            capacity_window_s=engine.capacity_window_s,
            capacity=self._turn_capacity,
            extra_stages=self.extra_vocoder_stages,
            cost=self.voice_costs.cost,
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
            self.admission.refuse_all("the engine stopped")
            self.book.fail_all(cause)
        finally:
            started.set()

    # Calibration.

    async def calibrate(self) -> float:
        """Measure the capacity: internal streams of CALIBRATION_TEXT (one per vocoder
        batch slot, at least 2) run through both stages, at once, until the vocoder made
        `engine.calibration_calls` calls; their events are not reported. The result
        (the audio the pipeline produced per wall second while saturated) seeds the
        capacity model's saturated reading (pipeline/capacity.py). A stream submitted
        meanwhile ends the calibration at once (what it measured is discarded). Returns
        the calibrated capacity (0: none)."""
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
                end_calibration(self.book, self._events, streams)
            self._last_activity_s = self._clock()
        return measured

    async def _calibrate(self, streams: list[Stream]) -> float:
        count = max(2, self._scheduling.active_stream_window, min(self._talker_config.batch, 16))
        # the first chunks of a stream are small (the ramp): a loaded server decodes
        # steady chunks, so the turns of the ramp are run but not measured
        window = max(1, self._scheduling.active_stream_window)

        def run_for(group: str) -> CalibrationRun:
            return CalibrationRun(
                book=self.book,
                talker=self.talker,
                vocoder=self.vocoder,
                voice=self.resolve_voice(self._group_voices[group]),
                count=count,
                ramp_turns=math.ceil(count * max(1, len(self._chunking.ramp)) / window),
                calls=self._config.calibration_calls,
                max_s=self._config.calibration_max_s,
                clock=self._clock,
                current=lambda: self._calibration,
                capacity=self.capacity,
                cost=self.voice_costs.group_cost(group),
            )

        measured = await measure_groups(run_for, self.voice_costs, streams)
        if measured is not None:
            self.calibrated_capacity = measured
            self.calibrations += 1
        return self.calibrated_capacity

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

    async def stop(self) -> None:
        self._stopping = True
        self.admission.refuse_all("the engine is stopping")
        self.book.cancel_all()
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
        if self.urgent_stage is not None:
            await self.urgent_stage.aclose()
        await self.talker.close_left()  # segments of ended streams, after the calls running
        await self.talker_stage.aclose()
        await self.vocoder_stage.aclose()
        for stage in self.extra_vocoder_stages:
            await stage.aclose()

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

    def reserve(self, voice: str | None = None) -> Reservation:
        """Admission decided now, before a request's slower preparation: NotReady or
        Rejected (with its Retry-After) at once, else a Reservation, granted or queued
        (pipeline/admission.py: `await reservation.wait_start()`, then
        `submit(..., reservation=it)`, or `release()`). A granted one counts as a
        starting stream, so a burst cannot pass the check before its streams exist.
        `voice`: the request's, whose backend's cost it counts (None: not known yet,
        the default voice's, 1; a dearer voice's stream is decided again at `submit`;
        a voice not served: the dearest backend's)."""
        return self.admission.reserve(self._admit_now(), self.voice_cost(voice))

    def voice_cost(self, voice: str | None) -> float:
        """A voice's cost per audio second against the reference voice's
        (scheduling/voice_cost.py); None: the default voice's (1); an unknown voice: the
        dearest backend's."""
        costs = self.voice_costs
        if voice is None:
            return 1.0
        try:
            return costs.cost(self.resolve_voice(voice).id)
        except UnknownVoice:
            return costs.most

    def _load(self, now_s: float, granted: int) -> LoadView:
        """What admission reads: the capacity and the work owed (pipeline/book.py)."""
        chunk_s = start_chunk_audio_s(self._chunking, self._voices[0])
        loads = self.book.loads(chunk_s, self.voice_costs.cost)
        return LoadView(
            self.capacity(now_s),
            loads,
            granted,
            new_stream_audio_s=new_stream_audio_s(loads, self.book.mean_stream_audio_s),
            start_audio_s=chunk_s * self._admission_config.start_phase_chunks,
            first_audio_s=self.book.table.first_audio.predict_s(),
        )

    def _check_open(self) -> None:
        if not self.ready:
            raise NotReady("the engine is not running")
        if self._admission_closed:
            raise NotReady("the engine is shutting down")

    def _admit_now(self) -> float:
        """NotReady, or the admission's clock reading (a real request ends a
        recalibration)."""
        self._check_open()
        calibration, self._calibration = self._calibration, None
        if calibration is not None:
            end_calibration(self.book, self._events, calibration)
        now_s = self._clock()
        self._last_activity_s = now_s
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
        With a granted `reservation` (from `reserve`, waited with `wait_start`) admission
        was decided already: it is used up (also when this raises). Without one the
        stream must fit now (a synchronous caller cannot wait in the queue, nor pass
        those waiting): else Rejected."""
        try:
            resolved = self.resolve_voice(voice)
        except UnknownVoice:
            if reservation is not None:
                reservation.release()  # used up, as when anything below raises
            raise
        cost = self.voice_costs.cost(resolved.id)
        if reservation is not None and reservation.cost < cost - 1e-9:
            # reserved before its voice was read (the OpenAI route's gate) at a lower
            # cost: decided again now, at its voice's, as a submit without one is
            reservation.release()
        held = reservation is not None and reservation.take(self.admission)
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed must be a finite number > 0, got {speed!r}")
        if held:
            self._check_open()
            now_s = self._clock()
            self._last_activity_s = now_s
        else:
            if reservation is not None:
                reservation.release()  # queued, refused or spent: admission decides anew
            now_s = self._admit_now()
            self.admission.check_now(now_s, cost)
        book = self.book
        stream = book.add_stream(resolved, speed=speed, now_s=now_s)
        if held:
            stream.stats.start_wait_s = reservation.start_wait_s
        book.add_text(stream.id, text, final=final)
        return stream

    def submit_job(
        self, text: str, *, voice: str, speed: float, horizon_s: float, rate: float
    ) -> Stream:
        """A stream for one segment of a job (app/jobs/): never refused for capacity (the
        job waited its turn in its own queue); scheduled by its virtual player, the
        `horizon_s` (inf: never due) and `rate` (audio s per s; 0: best effort) of
        scheduling/jobs.py. NotReady while the engine is not running."""
        resolved = self.resolve_voice(voice)
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed must be a finite number > 0, got {speed!r}")
        now_s = self._admit_now()
        stream = self.book.add_stream(
            resolved, speed=speed, now_s=now_s, job_pace=(horizon_s, rate)
        )
        self.book.add_text(stream.id, text, final=True)
        return stream

    def pace_job(self, stream_id: str, horizon_s: float, rate: float) -> None:
        """A job's stream gets a new virtual player (someone listens now, or stopped)."""
        self.book.pace_job(stream_id, horizon_s, rate, self._clock())

    def append_text(
        self, stream_id: str, text: str, *, final: bool = False, flush: bool = False
    ) -> None:
        """More text for a stream submitted with final=False; final=True closes it.
        flush=True speaks the text so far without waiting for its sentence to end (a
        client's flush: ElevenLabs' `flush`, Cartesia's `flush` and buffer delay)."""
        self.book.add_text(stream_id, text, final=final, flush=flush)

    def ack_playback(self, stream_id: str, played_s: float) -> None:
        """The client has played `played_s` seconds of this stream (client truth).
        Ignored before the stream's first audio: there is no playback to correct yet."""
        self.book.ack_playback(stream_id, played_s, self._clock())

    def cancel(self, stream_id: str) -> None:
        self.book.cancel(stream_id)

    def close_admission(self) -> None:
        """Refuse every new stream from now on (NotReady); the streams in flight go on."""
        self._admission_closed = True
        self.admission.refuse_all("the engine is shutting down")

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
        """Audio seconds per wall second the pipeline sustains (pipeline/capacity.py)."""
        if self._sustained_streams:  # a batched loop's own figure (Backend.sustained_streams)
            return self._sustained_streams
        now_s = self._clock() if now_s is None else now_s
        return pipeline_capacity(self.talker.rate, self.vocoder.rate, now_s)

    def _turn_capacity(self, now_s: float) -> float:
        """The capacity reported after each vocoder turn; a queue waiter may fit now."""
        self.admission.poke()
        return self.capacity(now_s)

    def stats(self) -> EngineStats:
        now_s = self._clock()
        talker, vocoder = self.talker.rate.value(now_s), self.vocoder.rate.value(now_s)
        return replace(
            self.book.stats(slower_stage(talker, vocoder)),
            talker_capacity_audio_s_per_s=talker,
            vocoder_capacity_audio_s_per_s=vocoder,
        )

    def traces(self, stream_id: str) -> list[str]:
        """Where the engine still holds this stream (empty once it is finished)."""
        return self.book.traces(stream_id)

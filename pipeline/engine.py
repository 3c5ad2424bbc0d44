"""The engine: owns the streams and moves their text through two stages.

    submit -> text segments -> [talker loop] -> codec frames (per stream, in segments)
           -> [vocoder loop: scheduler picks K ready streams] -> PCM -> Stream.chunks()

Talker loop (pipeline/talker.py): one talker call at a time, in the talker thread. It
gives the next segment to the stream whose audio runs out first (`pick_stream`), skips
streams more than `talker.high_water_s` ahead of their playback and parked streams.
Pieces reach the stream's frame queue as the talker yields them (the generator is
consumed in the talker thread, which hands each piece to the loop with
call_soon_threadsafe).

Vocoder loop (pipeline/vocoder.py), each turn: the streams whose next chunk is ready
(ChunkPlanner), less the parked ones, go to PlaybackScheduler.select; the chosen (at most
K) chunks are decoded in one backend.vocode call in the vocoder thread; each stream's PCM
is pushed to its output, its server-estimated stall measured against its horizon, its
audio recorded at the emission time, its chunk committed and its frames freed.

This module holds what both loops share: the streams and their work records
(pipeline/work.py), admission, and the endings (finish, fail, cancel). The two loops are
Engine's own methods, mixed in from their modules, so they work on the same state.

Text may also arrive in pieces (`submit(..., final=False)`, then `append_text`): the
stream's Segmenter releases segments as they complete.

Neither loop polls: each waits on an asyncio.Event that whatever could give it work sets
(talker pieces, submit, cancel, a consumer draining a parked stream). The talker also
sets a timer for the moment a stream falls back under the high-water mark.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable

from pipeline.backend import Backend, Voice
from pipeline.capacity import CapacityEstimate, pipeline_capacity
from pipeline.config import EngineConfig, TalkerConfig
from pipeline.errors import NotReady, Rejected, UnknownVoice
from pipeline.events import EngineEvents, EngineStats, NullEvents, TurnTiming
from pipeline.executor import StageExecutor
from pipeline.stream import Stream, StreamState
from pipeline.talker import TalkerLoop
from pipeline.text import Segmenter
from pipeline.vocoder import VocoderLoop
from pipeline.work import StreamWork
from scheduling import (
    Admission,
    AdmissionConfig,
    ChunkingConfig,
    ChunkPlanner,
    PlaybackScheduler,
    SchedulingConfig,
    warn_if_first_chunk_too_short,
)

__all__ = ["Engine", "EngineEvents"]

log = logging.getLogger("playhead.engine")

_DEFAULT_ENGINE = EngineConfig()
_DEFAULT_TALKER = TalkerConfig()
_DEFAULT_AUDIO_S_PER_CHAR = 0.07  # speech at speed 1 before any measurement (~14 chars/s)


class Engine(TalkerLoop, VocoderLoop):
    """See the module doc. Build, `await start()`, `submit`, `await stop()`."""

    def __init__(
        self,
        backend: Backend,
        *,
        scheduling: SchedulingConfig,
        chunking: ChunkingConfig,
        admission: AdmissionConfig,
        engine: EngineConfig = _DEFAULT_ENGINE,
        talker: TalkerConfig = _DEFAULT_TALKER,
        clock: Callable[[], float] = time.monotonic,
        events: EngineEvents | None = None,
    ) -> None:
        self._backend = backend
        self._scheduler = PlaybackScheduler(scheduling)
        warn_if_first_chunk_too_short(scheduling, chunking, log)
        self._planner = ChunkPlanner(chunking)
        self._admission = Admission(admission)
        self._window = scheduling.active_stream_window
        self._first_chunk_s = scheduling.first_chunk_ms / 1000.0
        self._safety_margin_s = scheduling.safety_margin_ms / 1000.0
        self._left_context_frames = chunking.left_context_frames
        self._config = engine
        self._talker_config = talker
        self._clock = clock
        self._events: EngineEvents = events if events is not None else NullEvents()
        self._voices = backend.voices()
        self._streams: dict[str, Stream] = {}  # every stream not yet terminal
        self._work: dict[str, StreamWork] = {}  # streams needing work, in submission order
        self._text_waiting: dict[str, StreamWork] = {}  # those with segments not yet talked
        # When the players of streams with all their audio sent run dry (a min-heap): they
        # are still playing, so admission counts them until then.
        self._playing_until_s: list[float] = []
        self._talker_stage = StageExecutor("talker", clock=clock)
        self._vocoder_stage = StageExecutor("vocoder", clock=clock)
        self._talker_wake = asyncio.Event()
        self._vocoder_wake = asyncio.Event()
        initial = engine.initial_capacity_audio_s_per_s
        self._vocoder_rate = CapacityEstimate(engine.capacity_window_s, initial)
        self._talker_rate = CapacityEstimate(engine.capacity_window_s, initial)
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._submitted = 0
        self._talked_chars = 0
        self._talked_audio_s = 0.0  # at speed 1
        self.vocoder_turns = 0  # turns that decoded something
        self.idle_waits = 0  # times a loop found nothing to do and waited on its event
        self.turn_log: list[TurnTiming] | None = None  # set to a list to profile turns

    # Lifecycle.

    async def start(self) -> None:
        if self._tasks:
            return
        if self._talker_stage.closed:  # started again after a stop
            self._talker_stage = StageExecutor("talker", clock=self._clock)
            self._vocoder_stage = StageExecutor("vocoder", clock=self._clock)
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._tasks = [
            self._loop.create_task(self._talker_loop(), name="playhead-talker-loop"),
            self._loop.create_task(self._vocoder_loop(), name="playhead-vocoder-loop"),
        ]
        for task in self._tasks:
            task.add_done_callback(self._loop_ended)

    async def stop(self) -> None:
        self._stopping = True
        for stream_id in list(self._streams):
            self.cancel(stream_id)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._talker_stage.aclose()
        await self._vocoder_stage.aclose()

    @property
    def ready(self) -> bool:
        return bool(self._tasks) and not self._stopping and not any(t.done() for t in self._tasks)

    @property
    def backend(self) -> Backend:
        return self._backend

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if self._stopping or task.cancelled():
            return
        error = task.exception() or RuntimeError(f"{task.get_name()} ended")
        log.error("%s died; failing every stream", task.get_name(), exc_info=error)
        for work in list(self._work.values()):
            self._fail(work, error)

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

    def submit(self, text: str, *, voice: str, speed: float = 1.0, final: bool = True) -> Stream:
        """Admit a stream for `text`. With final=False more text follows (`append_text`)."""
        resolved = self.resolve_voice(voice)
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed must be a finite number > 0, got {speed!r}")
        if not self.ready:
            raise NotReady("the engine is not running")
        now = self._clock()
        decision = self._admission.decide(
            now,
            self._playing_streams(now),
            self.capacity(now),
            finish_times_s=self._finish_times(now),
        )
        if not decision.accept:
            self._event("rejected", decision.reason)
            raise Rejected(decision)
        self._submitted += 1
        stream = Stream(
            uuid.uuid4().hex,
            resolved,
            speed=speed,
            submitted_at_s=now,
            max_pending_audio_s=self._config.max_pending_audio_s,
            owner=self,
        )
        work = StreamWork(
            stream=stream,
            tag=self._submitted,
            order=self._submitted,
            segmenter=Segmenter(
                first_fragment_words=self._talker_config.first_fragment_words,
                max_segment_chars=self._talker_config.max_segment_chars,
            ),
            text=deque(),
            text_closed=False,
            text_chars=0,
        )
        self._streams[stream.id] = stream
        self._work[stream.id] = work
        self._scheduler.admit(stream.id, now)  # its first-chunk deadline counts from submit
        self._event("stream_started", stream.id)
        self._add_text(work, text, final=final)
        return stream

    def append_text(self, stream_id: str, text: str, *, final: bool = False) -> None:
        """More text for a stream submitted with final=False; final=True closes it."""
        work = self._work.get(stream_id)
        if work is None or work.text_closed:
            raise ValueError(f"stream {stream_id} takes no more text")
        self._add_text(work, text, final=final)

    def _add_text(self, work: StreamWork, text: str, *, final: bool) -> None:
        segments = work.segmenter.push(text)
        if final:
            segments += work.segmenter.flush()
            work.text_closed = True
        work.text.extend(segments)
        if work.text:
            self._text_waiting[work.stream.id] = work
        work.text_chars += len(text)
        work.dirty = True
        if work.talked_all and work.stream.state is StreamState.TALKING:
            work.stream.state = StreamState.VOCODING
        self._check_finished(work)
        self._talker_wake.set()
        self._vocoder_wake.set()

    def ack_playback(self, stream_id: str, played_s: float) -> None:
        """The client has played `played_s` seconds of this stream (client truth).
        Ignored before the stream's first audio: there is no playback to correct yet."""
        if stream_id in self._work and self._scheduler.horizon_s(stream_id) is not None:
            self._scheduler.ack_playback(stream_id, played_s, self._clock())
            self._talker_wake.set()

    def cancel(self, stream_id: str) -> None:
        stream = self._streams.get(stream_id)
        if stream is None or stream.state.terminal:
            return
        work = self._work.pop(stream_id, None)
        if work is not None:
            self._drop(work)
        stream.state = StreamState.CANCELLED
        stream._close(discard=True)
        self._finalize(stream)

    def capacity(self, now_s: float | None = None) -> float:
        """Audio seconds per wall second the pipeline produces when busy."""
        now_s = self._clock() if now_s is None else now_s
        return pipeline_capacity(self._vocoder_rate.value(now_s), self._talker_rate.value(now_s))

    def stats(self) -> EngineStats:
        work = self._work.values()
        return EngineStats(
            active_streams=len(self._work),
            parked_streams=sum(1 for w in work if w.stream.parked),
            capacity_audio_s_per_s=self.capacity(),
            policy=self._scheduler.policy_name,
            draining_streams=len(self._streams) - len(self._work),
            queued_frames=sum(w.frames.queued_frames for w in work),
        )

    def traces(self, stream_id: str) -> list[str]:
        """Where the engine still holds this stream (empty once it is finished)."""
        places = []
        if stream_id in self._streams:
            places.append("streams")
        work = self._work.get(stream_id)
        if work is not None:
            places.append("work")
            if work.frames.held_frames or work.frames.segment_count:
                places.append("frames")
            if work.job is not None:
                places.append("talker")
        if stream_id in self._text_waiting:
            places.append("text")
        if stream_id in self._scheduler:
            places.append("scheduler")
        if stream_id in self._planner:
            places.append("planner")
        return places

    def _playing_streams(self, now_s: float) -> int:
        """Streams a player is listening to: those with work left, and those whose audio
        is all sent but whose (estimated) playback has not ended yet."""
        while self._playing_until_s and self._playing_until_s[0] <= now_s:
            heapq.heappop(self._playing_until_s)
        return len(self._work) + len(self._playing_until_s)

    def _finish_times(self, now_s: float) -> tuple[float, ...]:
        """When each playing stream's playback is estimated to end (for Retry-After)."""
        if self._talked_chars:
            per_char_s = self._talked_audio_s / self._talked_chars
        else:
            per_char_s = _DEFAULT_AUDIO_S_PER_CHAR
        times = []
        for stream_id, work in self._work.items():
            stream = work.stream
            total_s = work.text_chars * per_char_s / stream.speed
            horizon_s = self._scheduler.horizon_s(stream_id)
            start_s = now_s if horizon_s is None else max(horizon_s, now_s)
            times.append(start_s + max(0.0, total_s - stream.stats.audio_s))
        times.extend(self._playing_until_s)
        return tuple(times)

    # The stream's callbacks (StreamOwner).

    def _stream_unparked(self, stream: Stream) -> None:
        self._vocoder_wake.set()
        self._talker_wake.set()

    def _stream_read_all(self, stream: Stream) -> None:
        if stream.state is StreamState.DRAINING:
            stream.state = StreamState.DONE
            self._finalize(stream)

    def _stream_abandoned(self, stream: Stream) -> None:
        self.cancel(stream.id)

    # Endings.

    def _drop(self, work: StreamWork) -> None:
        """Free every trace of a stream's work (the caller removed it from _work)."""
        stream_id = work.stream.id
        if work.job is not None:
            work.job.cancelled.set()
        work.text.clear()
        self._text_waiting.pop(stream_id, None)
        work.frames.clear()
        work.chunk = None
        self._scheduler.forget(stream_id)
        self._planner.forget(stream_id)
        self._vocoder_wake.set()  # under fifo its slot is free now

    def _fail(self, work: StreamWork, error: BaseException) -> None:
        stream = work.stream
        if self._work.get(stream.id) is not work:
            return
        log.warning("stream %s failed: %r", stream.id, error)
        del self._work[stream.id]
        self._drop(work)
        stream.state = StreamState.FAILED
        stream._close(error)
        self._finalize(stream)

    def _check_finished(self, work: StreamWork) -> None:
        """A stream whose text is all talked and whose segments are all emitted is done."""
        if work.talked_all and work.frames.segment_count == 0:
            self._finish_vocoding(work)

    def _finish_vocoding(self, work: StreamWork) -> None:
        stream = work.stream
        horizon_s = self._scheduler.horizon_s(stream.id)
        if horizon_s is not None and horizon_s > self._clock():
            heapq.heappush(self._playing_until_s, horizon_s)
        del self._work[stream.id]
        self._drop(work)
        stream.state = StreamState.DRAINING
        stream._close()

    def _finalize(self, stream: Stream) -> None:
        stats = stream.stats
        stats.finished_at_s = self._clock()
        self._streams.pop(stream.id, None)
        log.info(
            "stream %s %s ttfa_ms=%s audio_s=%.2f stalls=%d stall_s=%.3f policy=%s",
            stream.id,
            stream.state.value,
            "-" if stats.ttfa_s is None else f"{stats.ttfa_s * 1000:.0f}",
            stats.audio_s,
            stats.stalls,
            stats.stall_s,
            self._scheduler.policy_name,
        )
        self._event("stream_finished", dataclasses.replace(stats), stream.state)

    def _event(self, name: str, *args: object) -> None:
        try:
            getattr(self._events, name)(*args)
        except Exception:
            log.exception("events.%s failed", name)

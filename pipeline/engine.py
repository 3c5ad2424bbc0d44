"""The engine: owns the streams and moves their text through two stages.

    submit -> text segments -> [talker loop] -> codec frames (per stream, in segments)
           -> [vocoder loop: scheduler picks K ready streams] -> PCM -> Stream.chunks()

Talker loop: one talker call at a time, in the talker thread. It gives the next segment
to the stream whose audio runs out first (see `_pick_talk`), skips streams more than
`talker.high_water_s` ahead of their playback and parked streams. Pieces reach the
stream's frame queue as the talker yields them (the generator is consumed in the talker
thread, which hands each piece to the loop with call_soon_threadsafe).

Vocoder loop, each turn: the streams whose next chunk is ready (ChunkPlanner), less the
parked ones, go to PlaybackScheduler.select; the chosen (at most K) chunks are decoded
in one backend.vocode call in the vocoder thread; each stream's PCM is pushed to its
output, its server-estimated stall measured against its horizon, its audio recorded at
the emission time, its chunk committed and its frames freed.

Text may also arrive in pieces (`submit(..., final=False)`, then `append_text`): the
stream's Segmenter releases segments as they complete.

Neither loop polls: each waits on an asyncio.Event that whatever could give it work sets
(talker pieces, submit, cancel, a consumer draining a parked stream). The talker also
sets a timer for the moment a stream falls back under the high-water mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.backend import Backend, TalkRequest, VocodeItem, Voice
from pipeline.capacity import CapacityEstimate, pipeline_capacity
from pipeline.config import EngineConfig, TalkerConfig
from pipeline.errors import NotReady, Rejected, UnknownVoice
from pipeline.events import EngineEvents, EngineStats, NullEvents, TurnTiming
from pipeline.executor import StageExecutor
from pipeline.frames import Segment, StreamFrames
from pipeline.stream import Stream, StreamState
from pipeline.text import Segmenter
from scheduling import (
    Admission,
    AdmissionConfig,
    ChunkingConfig,
    ChunkPlanner,
    PlaybackScheduler,
    SchedulingConfig,
    warn_if_first_chunk_too_short,
)
from scheduling import Chunk as _Chunk

log = logging.getLogger("playhead.engine")

_DEFAULT_ENGINE = EngineConfig()
_DEFAULT_TALKER = TalkerConfig()
_HIGH_WATER_SLACK_S = 0.001  # a timer set for the mark may fire a hair early
_DEFAULT_AUDIO_S_PER_CHAR = 0.07  # speech at speed 1 before any measurement (~14 chars/s)


class BackendError(RuntimeError):
    """The backend broke its contract (e.g. PCM of the wrong length)."""


class _TalkJob:
    """One talker call in flight; `cancelled` is read in the talker thread."""

    __slots__ = ("cancelled", "segment", "work")

    def __init__(self, work: _Work, segment: Segment) -> None:
        self.work = work
        self.segment = segment
        self.cancelled = threading.Event()


@dataclass(slots=True, eq=False)
class _Work:
    """The engine's state of one stream while it needs talker or vocoder work."""

    stream: Stream
    tag: int  # the backend's stream_tag
    order: int  # submission order (ties, arrival order)
    segmenter: Segmenter
    text: deque[str]  # segments not yet given to the talker
    text_closed: bool  # no more text will be appended
    text_chars: int  # characters submitted so far
    frames: StreamFrames = dataclasses.field(default_factory=StreamFrames)
    next_segment: int = 0
    job: _TalkJob | None = None  # the talker call in flight for this stream
    chunk: _Chunk | None = None  # the planner's answer, valid while not dirty
    dirty: bool = True  # frames or segment state changed since `chunk` was planned

    @property
    def talked_all(self) -> bool:
        """No more talker work: the text is closed, no segment waits, no call in flight."""
        return self.text_closed and not self.text and self.job is None


class Engine:
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
        self._left_context_frames = chunking.left_context_frames
        self._config = engine
        self._talker_config = talker
        self._clock = clock
        self._events: EngineEvents = events if events is not None else NullEvents()
        self._voices = backend.voices()
        self._streams: dict[str, Stream] = {}  # every stream not yet terminal
        self._work: dict[str, _Work] = {}  # streams needing work, in submission order
        self._text_waiting: dict[str, _Work] = {}  # those with segments not yet talked
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
        work = _Work(
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

    def _add_text(self, work: _Work, text: str, *, final: bool) -> None:
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
        """The client has played `played_s` seconds of this stream (client truth)."""
        if stream_id in self._work:
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

    def _drop(self, work: _Work) -> None:
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

    def _fail(self, work: _Work, error: BaseException) -> None:
        stream = work.stream
        if self._work.get(stream.id) is not work:
            return
        log.warning("stream %s failed: %r", stream.id, error)
        del self._work[stream.id]
        self._drop(work)
        stream.state = StreamState.FAILED
        stream._close(error)
        self._finalize(stream)

    def _check_finished(self, work: _Work) -> None:
        """A stream whose text is all talked and whose segments are all emitted is done."""
        if work.talked_all and work.frames.segment_count == 0:
            self._finish_vocoding(work)

    def _finish_vocoding(self, work: _Work) -> None:
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

    # The talker loop.

    async def _talker_loop(self) -> None:
        while True:
            self._talker_wake.clear()
            work, retry_in_s = self._pick_talk(self._clock())
            if work is not None:
                await self._talk(work)
                continue
            self.idle_waits += 1
            if retry_in_s is None:
                await self._talker_wake.wait()
            else:
                # a stream above the high-water mark falls back under it by then
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(retry_in_s):
                        await self._talker_wake.wait()

    def _pick_talk(self, now_s: float) -> tuple[_Work | None, float | None]:
        """The stream whose audio runs out first among those with text waiting.

        Runs out at: max(horizon, now) + the queued frames' duration (now standing in
        for the horizon before the first audio). A stream with no audio and no frames yet
        is the most urgent (oldest first). Streams more than high_water_s ahead and parked
        streams are skipped. The second value is how long until the first stream skipped
        for the high-water mark falls back under it as its playback advances (a stream
        without audio yet has no playback: its first audio wakes the talker instead).
        """
        best: _Work | None = None
        best_key: tuple[int, float, int] | None = None
        retry_in_s: float | None = None
        high_water_s = self._talker_config.high_water_s
        for stream_id, work in self._text_waiting.items():
            stream = work.stream
            if work.job is not None or stream.parked:
                continue
            queued = work.frames.queued_frames
            horizon_s = self._scheduler.horizon_s(stream_id)
            if horizon_s is None and queued == 0:
                key = (0, 0.0, work.order)
            else:
                voice = stream.voice
                queued_s = queued * voice.samples_per_frame / voice.sample_rate_hz
                run_out_s = max(now_s if horizon_s is None else horizon_s, now_s) + queued_s
                ahead_s = run_out_s - now_s
                if ahead_s > high_water_s + _HIGH_WATER_SLACK_S:
                    if horizon_s is not None:
                        wait_s = ahead_s - high_water_s
                        retry_in_s = wait_s if retry_in_s is None else min(retry_in_s, wait_s)
                    continue
                key = (1, run_out_s, work.order)
            if best_key is None or key < best_key:
                best, best_key = work, key
        return best, retry_in_s

    async def _talk(self, work: _Work) -> None:
        stream = work.stream
        text = work.text.popleft()
        if not work.text:
            del self._text_waiting[stream.id]
        index = work.next_segment
        work.next_segment += 1
        segment = work.frames.open_segment(index)
        job = _TalkJob(work, segment)
        work.job = job
        work.dirty = True
        if stream.state is StreamState.QUEUED:
            stream.state = StreamState.TALKING
        request = TalkRequest(
            text=text,
            voice=stream.voice.id,
            speed=stream.speed,
            stream_tag=work.tag,
            segment_index=index,
            first_frame_index=work.frames.produced_frames,
        )
        try:
            timed = await self._talker_stage.run_timed(self._talk_in_thread, request, job)
        except asyncio.CancelledError:
            job.cancelled.set()
            raise
        except Exception as error:
            work.job = None
            self._fail(work, error)
            return
        work.job = None
        if job.cancelled.is_set():
            return  # the stream ended meanwhile; its traces are already gone
        produced = timed.result
        assert segment.available_frames == produced, "every piece arrives before the call returns"
        segment.done = True
        work.dirty = True
        stream.stats.segments += 1
        if work.talked_all:
            stream.state = StreamState.VOCODING
        voice = stream.voice
        audio_s = produced * voice.samples_per_frame / voice.sample_rate_hz
        self._talked_chars += len(text)
        self._talked_audio_s += audio_s * stream.speed
        self._talker_rate.record(timed.started_s, timed.finished_s, audio_s)
        self._event("talker_call", timed.seconds)
        self._check_finished(work)
        self._vocoder_wake.set()

    def _talk_in_thread(self, request: TalkRequest, job: _TalkJob) -> int:
        """Runs in the talker thread: consume the generator, hand each piece to the loop."""
        assert self._loop is not None
        produced = 0
        pieces = self._backend.talk(request)
        try:
            for piece in pieces:
                if job.cancelled.is_set():
                    break
                if len(piece):
                    produced += len(piece)
                    self._loop.call_soon_threadsafe(self._on_piece, job, piece)
        finally:
            close = getattr(pieces, "close", None)
            if close is not None:
                close()
        return produced

    def _on_piece(self, job: _TalkJob, piece: np.ndarray) -> None:
        if job.cancelled.is_set():
            return
        work = job.work
        work.frames.append(job.segment, piece)
        work.stream.stats.frames += len(piece)
        work.dirty = True
        self._vocoder_wake.set()

    # The vocoder loop.

    async def _vocoder_loop(self) -> None:
        while True:
            self._vocoder_wake.clear()
            started_s = self._clock()
            started_perf_s = time.perf_counter()
            ready_ids, empty = self._ready(started_s)
            if empty:
                for work, chunk in empty:
                    self._commit(work, chunk)
                continue
            selected = self._scheduler.select(started_s, ready_ids) if ready_ids else []
            if not selected:
                self.idle_waits += 1
                await self._vocoder_wake.wait()
                continue
            await self._vocode(selected, started_s, started_perf_s)

    def _ready(self, now_s: float) -> tuple[list[str], list[tuple[_Work, _Chunk]]]:
        """Ids of the unparked streams with a chunk to decode, in arrival order; and the
        empty (terminal) chunks, which carry no audio and are committed without a turn."""
        ready: list[str] = []
        empty: list[tuple[_Work, _Chunk]] = []
        for stream_id, work in self._work.items():
            if work.dirty:
                work.chunk = self._plan(work)
                work.dirty = False
            chunk = work.chunk
            if chunk is None:
                continue
            if chunk.empty:
                empty.append((work, chunk))
            elif not work.stream.parked:
                ready.append(stream_id)
        return ready, empty

    def _plan(self, work: _Work) -> _Chunk | None:
        segment = work.frames.current
        if segment is None:
            return None
        stream_done = work.talked_all and work.frames.segment_count == 1 and segment.done
        return self._planner.next_chunk(
            work.stream.id, segment.available_frames, segment.done, stream_done
        )

    async def _vocode(self, selected: list[str], started_s: float, started_perf_s: float) -> None:
        batch: list[tuple[_Work, _Chunk]] = []
        items: list[VocodeItem] = []
        for stream_id in selected:
            work = self._work[stream_id]
            chunk = work.chunk
            segment = work.frames.current
            assert chunk is not None and segment is not None and not chunk.empty
            assert chunk.segment == segment.index, (chunk.segment, segment.index)
            batch.append((work, chunk))
            items.append(
                VocodeItem(
                    voice=work.stream.voice.id,
                    frames=segment.frames(chunk.context_start, chunk.context_stop),
                    emit_offset_frames=chunk.start - chunk.context_start,
                    emit_frames=chunk.stop - chunk.start,
                )
            )
        sent_perf_s = time.perf_counter()
        try:
            timed = await self._vocoder_stage.run_timed(self._backend.vocode, items)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            for work, _ in batch:
                self._fail(work, error)
            return
        emitted_at_s = self._clock()
        returned_perf_s = time.perf_counter()
        pcms = timed.result
        if len(pcms) != len(batch):
            error = BackendError(f"vocode returned {len(pcms)} results for {len(batch)} items")
            for work, _ in batch:
                self._fail(work, error)
            return
        audio_s = 0.0
        for (work, chunk), item, pcm in zip(batch, items, pcms, strict=True):
            if self._work.get(work.stream.id) is not work:
                continue  # cancelled while the vocoder ran
            voice = work.stream.voice
            samples = np.asarray(pcm, dtype=np.float32).reshape(-1)
            if samples.size != item.emit_frames * voice.samples_per_frame:
                self._fail(
                    work,
                    BackendError(
                        f"vocode returned {samples.size} samples for {item.emit_frames} frames"
                    ),
                )
                continue
            self._emit(work, samples, emitted_at_s)
            self._commit(work, chunk)
            audio_s += samples.size / voice.sample_rate_hz
        self.vocoder_turns += 1
        self._vocoder_rate.record(timed.started_s, timed.finished_s, audio_s)
        self._event("vocoder_turn", len(batch), self._clock() - started_s)
        self._event("capacity", self.capacity(emitted_at_s))
        assert self._window <= 0 or len(batch) <= self._window
        if self.turn_log is not None:
            ended_perf_s = time.perf_counter()
            self.turn_log.append(
                TurnTiming(
                    batch_size=len(batch),
                    wall_s=ended_perf_s - started_perf_s,
                    model_s=timed.seconds,
                    engine_s=(sent_perf_s - started_perf_s) + (ended_perf_s - returned_perf_s),
                )
            )

    def _emit(self, work: _Work, pcm: np.ndarray, emitted_at_s: float) -> None:
        """Push one chunk's PCM and account for it (stall, horizon, TTFA)."""
        stream = work.stream
        stats = stream.stats
        horizon_s = self._scheduler.horizon_s(stream.id)
        if horizon_s is not None and emitted_at_s > horizon_s:
            stall_s = emitted_at_s - horizon_s
            stats.stalls += 1
            stats.stall_s += stall_s
            self._event("stall", stream.id, stall_s)
        self._scheduler.record_audio(stream.id, pcm.size, stream.sample_rate_hz, emitted_at_s)
        if stats.ttfa_s is None:
            stats.ttfa_s = emitted_at_s - stats.submitted_at_s
            self._event("first_audio", stream.id, stats.ttfa_s)
            self._talker_wake.set()  # its playback starts: the high-water mark now moves
        stats.audio_s += pcm.size / stream.sample_rate_hz
        stats.chunks += 1
        stream._push(pcm)

    def _commit(self, work: _Work, chunk: _Chunk) -> None:
        """The chunk left (or, empty, needed no decode): advance the planner, free frames."""
        self._planner.commit(work.stream.id, chunk)
        work.frames.emitted(
            chunk.stop - chunk.start, free_before=chunk.stop - self._left_context_frames
        )
        work.dirty = True
        work.chunk = None
        assert work.frames.queued_frames >= 0, "emitted more frames than the talker produced"
        if chunk.segment_end:
            work.frames.close_current()
        if chunk.final:
            assert work.talked_all and work.frames.segment_count == 0
            self._finish_vocoding(work)
        elif chunk.segment_end:
            self._check_finished(work)

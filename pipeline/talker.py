"""The engine's talker half: which stream gets the next talker call, and the call itself.

One talker call at a time, in the talker thread. The next segment goes to the stream
whose audio is due first, ranked like the vocoder's edf (`pick_stream`); streams more
than `talker.high_water_s` ahead of their playback, and parked streams, are skipped.
Pieces reach the stream's frame queue as the talker yields them: the generator is
consumed in the talker thread, which hands each piece to the loop with
call_soon_threadsafe.

`TalkerLoop` is mixed into Engine and works on the engine's state (the attributes it
declares); `pick_stream` is a pure function of that state and the time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from pipeline.backend import Backend, TalkRequest
from pipeline.capacity import CapacityEstimate
from pipeline.config import TalkerConfig
from pipeline.executor import StageExecutor
from pipeline.stream import StreamState
from pipeline.work import StreamWork, TalkJob
from scheduling import PlaybackScheduler

_HIGH_WATER_SLACK_S = 0.001  # a timer set for the mark may fire a hair early


def pick_stream(
    waiting: Iterable[StreamWork],
    scheduler: PlaybackScheduler,
    now_s: float,
    *,
    high_water_s: float,
    first_chunk_s: float,
    safety_margin_s: float,
) -> tuple[StreamWork | None, float | None]:
    """The stream among `waiting` (those with text waiting) whose audio is due first,
    ranked like the vocoder's edf: `(0 if protected else 1, deadline, order)`.

    A stream's audio runs out at max(horizon, now) + its queued frames' duration (now
    standing in for the horizon before the first audio); that is its deadline. A stream
    with no audio and no frames yet has the first-audio deadline, first_seen +
    first_chunk_s. A playing stream within safety_margin_s of running out is protected:
    a burst of newcomers never passes it over. Streams more than high_water_s ahead,
    parked streams and streams with a talker call in flight are skipped. The second value
    is how long until the first stream skipped for the high-water mark falls back under
    it as its playback advances (a stream without audio yet has no playback: its first
    audio wakes the talker instead).
    """
    best: StreamWork | None = None
    best_key: tuple[int, float, int] | None = None
    retry_in_s: float | None = None
    for work in waiting:
        stream = work.stream
        if work.job is not None or stream.parked:
            continue
        queued = work.frames.queued_frames
        stream_horizon_s = scheduler.horizon_s(stream.id)
        if stream_horizon_s is None and queued == 0:
            first_seen_s = scheduler.first_seen_s(stream.id)
            key = (1, (now_s if first_seen_s is None else first_seen_s) + first_chunk_s, work.order)
        else:
            voice = stream.voice
            queued_s = queued * voice.samples_per_frame / voice.sample_rate_hz
            start_s = now_s if stream_horizon_s is None else stream_horizon_s
            run_out_s = max(start_s, now_s) + queued_s
            ahead_s = run_out_s - now_s
            if ahead_s > high_water_s + _HIGH_WATER_SLACK_S:
                if stream_horizon_s is not None:
                    wait_s = ahead_s - high_water_s
                    retry_in_s = wait_s if retry_in_s is None else min(retry_in_s, wait_s)
                continue
            protected = stream_horizon_s is not None and ahead_s <= safety_margin_s
            key = (0 if protected else 1, run_out_s, work.order)
        if best_key is None or key < best_key:
            best, best_key = work, key
    return best, retry_in_s


class TalkerLoop:
    """The talker loop, mixed into Engine: these are the engine's attributes it uses."""

    _backend: Backend
    _clock: Callable[[], float]
    _loop: asyncio.AbstractEventLoop | None
    _talker_config: TalkerConfig
    _first_chunk_s: float  # scheduling.first_chunk_ms, in s
    _safety_margin_s: float  # scheduling.safety_margin_ms, in s
    _talker_stage: StageExecutor
    _talker_rate: CapacityEstimate
    _talker_wake: asyncio.Event
    _vocoder_wake: asyncio.Event
    _text_waiting: dict[str, StreamWork]
    _talked_chars: int
    _talked_audio_s: float
    _scheduler: PlaybackScheduler
    idle_waits: int

    if TYPE_CHECKING:  # Engine's

        def _fail(self, work: StreamWork, error: BaseException) -> None: ...

        def _check_finished(self, work: StreamWork) -> None: ...

        def _event(self, name: str, *args: object) -> None: ...

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

    def _pick_talk(self, now_s: float) -> tuple[StreamWork | None, float | None]:
        return pick_stream(
            self._text_waiting.values(),
            self._scheduler,
            now_s,
            high_water_s=self._talker_config.high_water_s,
            first_chunk_s=self._first_chunk_s,
            safety_margin_s=self._safety_margin_s,
        )

    async def _talk(self, work: StreamWork) -> None:
        stream = work.stream
        text = work.text.popleft()
        if not work.text:
            del self._text_waiting[stream.id]
        index = work.next_segment
        work.next_segment += 1
        segment = work.frames.open_segment(index)
        job = TalkJob(work, segment)
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

    def _talk_in_thread(self, request: TalkRequest, job: TalkJob) -> int:
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

    def _on_piece(self, job: TalkJob, piece: np.ndarray) -> None:
        if job.cancelled.is_set():
            return
        work = job.work
        work.frames.append(job.segment, piece)
        work.stream.stats.frames += len(piece)
        work.dirty = True
        self._vocoder_wake.set()

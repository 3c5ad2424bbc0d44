"""The engine's vocoder half: each turn decodes the chunks PlaybackScheduler selects.

Each turn: the streams whose next chunk is ready (ChunkPlanner), less the parked ones,
go to PlaybackScheduler.select; the chosen (at most K) chunks are decoded in one
backend.vocode call in the vocoder thread; each stream's PCM is pushed to its output,
its server-estimated stall measured against its horizon, its audio recorded at the
emission time, its chunk committed and its frames freed. Empty (terminal) chunks carry
no audio and are committed without a turn.

`VocoderLoop` is mixed into Engine and works on the engine's state (the attributes it
declares).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from pipeline.backend import Backend, VocodeItem
from pipeline.capacity import CapacityEstimate
from pipeline.errors import BackendError
from pipeline.events import TurnTiming
from pipeline.executor import StageExecutor
from pipeline.work import StreamWork
from scheduling import Chunk, ChunkPlanner, PlaybackScheduler


class VocoderLoop:
    """The vocoder loop, mixed into Engine: these are the engine's attributes it uses."""

    _backend: Backend
    _clock: Callable[[], float]
    _scheduler: PlaybackScheduler
    _planner: ChunkPlanner
    _window: int
    _left_context_frames: int
    _vocoder_stage: StageExecutor
    _vocoder_rate: CapacityEstimate
    _vocoder_wake: asyncio.Event
    _talker_wake: asyncio.Event
    _work: dict[str, StreamWork]
    vocoder_turns: int
    idle_waits: int
    turn_log: list[TurnTiming] | None

    if TYPE_CHECKING:  # Engine's

        def _fail(self, work: StreamWork, error: BaseException) -> None: ...

        def _check_finished(self, work: StreamWork) -> None: ...

        def _finish_vocoding(self, work: StreamWork) -> None: ...

        def _event(self, name: str, *args: object) -> None: ...

        def capacity(self, now_s: float | None = None) -> float: ...

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

    def _ready(self, now_s: float) -> tuple[list[str], list[tuple[StreamWork, Chunk]]]:
        """Ids of the unparked streams with a chunk to decode, in arrival order; and the
        empty (terminal) chunks, which carry no audio and are committed without a turn."""
        ready: list[str] = []
        empty: list[tuple[StreamWork, Chunk]] = []
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

    def _plan(self, work: StreamWork) -> Chunk | None:
        segment = work.frames.current
        if segment is None:
            return None
        stream_done = work.talked_all and work.frames.segment_count == 1 and segment.done
        return self._planner.next_chunk(
            work.stream.id, segment.available_frames, segment.done, stream_done
        )

    async def _vocode(self, selected: list[str], started_s: float, started_perf_s: float) -> None:
        batch: list[tuple[StreamWork, Chunk]] = []
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
        except Exception as error:  # CancelledError (a BaseException) passes through
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

    def _emit(self, work: StreamWork, pcm: np.ndarray, emitted_at_s: float) -> None:
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

    def _commit(self, work: StreamWork, chunk: Chunk) -> None:
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

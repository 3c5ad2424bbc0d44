"""The vocoder stage: each turn decodes the chunks PlaybackScheduler selects.

Each turn: the stream book re-plans the streams whose frames or state changed (`refresh`;
its ready set holds the unparked streams with a non-empty chunk planned); the ready ids
go to PlaybackScheduler.select; the chosen (at most K) chunks are decoded in one
backend.vocode call in the vocoder thread; each stream's PCM goes back to the book
(`emit`: stall, horizon, TTFA, the audio channel, the chunk committed and its frames
freed). With nothing ready the loop waits on its wake event, which the book sets whenever
a stream's chunk plan may have changed.

Workers (`vocoder.workers`): W loops like the one above, each with its own stage thread,
take turns side by side where the backend's vocode calls may overlap
(`concurrent_vocode_calls`: Piper's ONNX Runtime session, not the codec LM's). A worker
that takes a turn marks its streams as being decoded (`StreamBook.start_vocoding`): the
book leaves them out of the ready ids until their chunk is committed, so the next
worker's selection is the next most urgent streams. A worker that finds no stream ready
takes the NEXT chunk of a stream already being decoded (`StreamBook.ahead_ids`, at most
`workers` chunks of a stream in flight, while at most `vocoder.work_ahead_streams`
streams have work left, and by default not while a talker step of that stream runs): a
lone request uses every worker. One stream's chunks still leave in order: the book holds
a chunk decoded before an earlier one until that one is emitted. The rate (the capacity
model, pipeline/capacity.py) is fed each call's own time and audio, with the workers'
count.

Yielding to a first audio (`yield_slack_s`, with more than one worker: the book's
`first_audio_yield`): the talker and the vocoder count their calls that make some
stream's first audio (a step of a stream with no frames yet, a turn with a stream's first
chunk). While one runs, a worker whose selection is all streams with at least
`yield_slack_s` of audio buffered takes no turn and waits; the book wakes it when the last
such call ends. On a CPU the stages share the cores, so the new stream's first talker step
and first chunk run with one worker beside them instead of all; a stream closer than that
to running dry never waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from pipeline.backend import AbortHandle, Backend, VocodeItem
from pipeline.book import StreamBook, StreamRecord
from pipeline.capacity import CapacityEstimate
from pipeline.errors import BackendError
from pipeline.events import EngineEvents, TurnTiming
from pipeline.executor import StageExecutor
from scheduling import Chunk


class Vocoder:
    """The vocoder loop over a stream book; see the module doc."""

    def __init__(
        self,
        book: StreamBook,
        backend: Backend,
        stage: StageExecutor,
        *,
        window: int,
        clock: Callable[[], float],
        events: EngineEvents,
        capacity_window_s: float,
        initial_capacity_audio_s_per_s: float = 0.0,
        capacity: Callable[[float], float] | None = None,
        extra_stages: Sequence[StageExecutor] = (),
        yield_slack_s: float = 0.0,
    ) -> None:
        """`capacity(now_s)`: the pipeline's capacity, reported after each turn.
        `extra_stages`: more workers' threads, for a backend whose vocode calls may run
        side by side. `yield_slack_s` (> 0 only where the book's `first_audio_yield` is on): see the
        module doc."""
        self._book = book
        self._capacity = capacity
        self._backend = backend
        # a backend that can end a running vocode call early (Piper) makes abort handles
        self._new_abort: Callable[[], AbortHandle] | None = (
            backend.vocode_abort if backend.capabilities.aborts_vocode else None
        )
        self._stage = stage
        self._stages = (stage, *extra_stages)
        self._yield_slack_s = yield_slack_s
        self.yields = 0  # picks a worker held back for a first audio
        self._window = window
        self._clock = clock
        self._events = events
        self.wake = asyncio.Event()
        self.rate = CapacityEstimate(
            capacity_window_s, initial_capacity_audio_s_per_s, workers=len(self._stages)
        )
        self.turns = 0  # turns that decoded something
        self.idle_waits = 0  # times the loop found nothing to do and waited

    async def run(self) -> None:
        if len(self._stages) == 1:
            await self._worker(self._stage)
            return
        async with asyncio.TaskGroup() as workers:
            for index, stage in enumerate(self._stages):
                workers.create_task(self._worker(stage), name=f"playhead-vocoder-{index}")

    async def _worker(self, stage: StageExecutor) -> None:
        """One worker's loop. The wake event is shared: each loop clears it and then
        looks at the book without yielding, so no wake is lost between them."""
        book = self._book
        while True:
            self.wake.clear()
            started_perf_s = time.perf_counter()
            started_cpu_s = time.thread_time()
            started_s, selected = self._pick()
            if not selected:
                self.idle_waits += 1
                await self.wake.wait()
                continue
            book.turn_started()
            # a stream's first chunk: this turn makes its first audio
            first = book.first_audio_yield and any(
                (record := book.record(stream_id)) is not None and record.stream.stats.chunks == 0
                for stream_id in selected
            )
            if first:
                book.first_audio_started()
            try:
                await self._turn(stage, selected, started_s, started_perf_s, started_cpu_s)
            finally:
                if first:
                    book.first_audio_ended()
                book.turn_ended()

    def _pick(self) -> tuple[float, list[str]]:
        """The most urgent ready streams; with none, a stream's next chunk beside the one
        being decoded (work-ahead)."""
        book = self._book
        book.refresh()
        ready = book.ready_ids
        started_s = self._clock()
        # every stream was admitted at submit (StreamBook.add_stream)
        if ready:
            selected = book.scheduler.select(started_s, ready, all_admitted=True)
        elif ahead := book.ahead_ids:
            # no other stream waits: decode a stream's next chunk beside its current one
            selected = book.scheduler.select(started_s, ahead, all_admitted=True)
        else:
            return started_s, []
        if self._yield_slack_s and book.first_audio_work and self._buffered(selected, started_s):
            self.yields += 1
            book.vocoder_yielded()  # woken when the first-audio work ends
            return started_s, []
        return started_s, selected

    def _buffered(self, selected: list[str], now_s: float) -> bool:
        """Every selected stream's player has `yield_slack_s` of audio or more ahead."""
        slack_s = self._book.scheduler.slack_s
        for stream_id in selected:
            slack = slack_s(stream_id, now_s)
            if slack is None or slack < self._yield_slack_s:
                return False
        return True

    async def _turn(
        self,
        stage: StageExecutor,
        selected: list[str],
        started_s: float,
        started_perf_s: float,
        started_cpu_s: float,
    ) -> None:
        book = self._book
        self._events.vocoder_selection(selected)
        batch: list[tuple[StreamRecord, Chunk]] = []
        items: list[VocodeItem] = []
        record_of, start_vocoding = book.record, book.start_vocoding
        for stream_id in selected:
            record = record_of(stream_id)
            assert record is not None, "a ready stream is a live stream"
            chunk = record.chunk
            assert chunk is not None and chunk.stop != chunk.start
            segment = record.frames.segment(chunk.segment)
            assert segment is not None, chunk
            start_vocoding(record)
            batch.append((record, chunk))
            context_start = chunk.context_start
            # positional: voice, frames, emit_offset_frames, emit_frames
            items.append(
                VocodeItem(
                    record.stream.voice.id,
                    segment.frames(context_start, chunk.context_stop),
                    chunk.start - context_start,
                    chunk.stop - chunk.start,
                )
            )
        assert self._window <= 0 or len(batch) <= self._window
        vocode: Callable[..., list[np.ndarray]] = self._backend.vocode
        new_abort = self._new_abort
        if new_abort is not None and len(batch) == 1:
            # a call for one stream ends early when the stream ends (a barge-in's next
            # request then finds the worker free)
            abort = new_abort()
            batch[0][0].in_flight[-1].abort = abort
            vocode = partial(vocode, abort=abort)
        sent_perf_s = time.perf_counter()
        sent_cpu_s = time.thread_time()
        try:
            timed = await stage.run_timed(vocode, items)
        except Exception as error:  # CancelledError (a BaseException) passes through
            for record, _ in batch:
                book.fail(record, error)
            return
        emitted_at_s = self._clock()
        returned_perf_s = time.perf_counter()
        returned_cpu_s = time.thread_time()
        pcms = timed.result
        if len(pcms) != len(batch):
            error = BackendError(f"vocode returned {len(pcms)} results for {len(batch)} items")
            for record, _ in batch:
                book.fail(record, error)
            return
        audio_s = 0.0
        is_live, emit, float32 = book.is_live, book.emit, np.float32
        for (record, chunk), item, pcm in zip(batch, items, pcms, strict=True):
            if not is_live(record):
                continue  # cancelled while the vocoder ran
            voice = record.stream.voice
            if type(pcm) is np.ndarray and pcm.dtype == float32 and pcm.ndim == 1:
                samples = pcm  # already what np.asarray(...).reshape(-1) would give (a view)
            else:
                samples = np.asarray(pcm, dtype=float32).reshape(-1)
            if samples.size != item.emit_frames * voice.samples_per_frame:
                book.fail(
                    record,
                    BackendError(
                        f"vocode returned {samples.size} samples for {item.emit_frames} frames"
                    ),
                )
                continue
            emit(record, chunk, samples, emitted_at_s)
            audio_s += samples.size / voice.sample_rate_hz
        self.turns += 1
        # the call's own cost (pipeline/capacity.py), whatever the other workers did
        self.rate.record(timed.started_s, timed.finished_s, audio_s)
        ended_perf_s = time.perf_counter()
        ended_cpu_s = time.thread_time()
        self._events.vocoder_turn(len(batch), self._clock() - started_s)
        if self._capacity is not None:
            self._events.capacity(self._capacity(emitted_at_s))
        self._events.turn_timing(
            TurnTiming(
                batch_size=len(batch),
                wall_s=ended_perf_s - started_perf_s,
                model_s=timed.seconds,
                engine_s=(sent_perf_s - started_perf_s) + (ended_perf_s - returned_perf_s),
                engine_cpu_s=(sent_cpu_s - started_cpu_s) + (ended_cpu_s - returned_cpu_s),
            ),
        )

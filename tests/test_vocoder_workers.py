"""Several vocoder workers (`vocoder.workers`): turns run side by side; one stream's
chunks run side by side only while it is alone (no other stream has work: pipeline/load.py;
`alone.work_ahead` turns this on); and every frame still arrives once, in order.

The backend is the sim backend told that its vocode calls may overlap (as Piper's may);
it notes which streams each call decodes while the call runs.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Sequence

import numpy as np
import pytest
from conftest import FAST_SIM, EngineFactory, read_all, until

from pipeline.backend import AbortHandle, BackendCapabilities, VocodeItem
from pipeline.backends.sim import SimBackend, decode_sim_signal, expected_frames
from pipeline.config import AloneConfig, SimConfig, TalkerConfig, VocoderConfig
from pipeline.engine import Engine
from pipeline.errors import StreamCancelled
from pipeline.stream import StreamState
from pipeline.vocoder_core import VocodePlan

TEXTS = [
    f"Stream {i} says a few sentences. Each one is long enough for several chunks. "
    f"The last one ends here, number {i}."
    for i in range(8)
]


class OverlappingSim(SimBackend):
    """The sim backend whose vocode calls may overlap; it records the overlap."""

    capabilities = BackendCapabilities(concurrent_vocode_calls=True)

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self._lock = threading.Lock()
        self._in_flight: dict[int, int] = {}  # stream tag -> calls decoding it now
        self.calls_at_once = 0  # most vocode calls seen running together
        self._running = 0
        self.same_stream_twice = 0  # a stream decoded by two calls at once

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        tags = {int(item.frames[0, 0]) for item in items if len(item.frames)}
        with self._lock:
            self._running += 1
            self.calls_at_once = max(self.calls_at_once, self._running)
            for tag in tags:
                self._in_flight[tag] = self._in_flight.get(tag, 0) + 1
                if self._in_flight[tag] > 1:
                    self.same_stream_twice += 1
        try:
            return super().vocode(items, abort)
        finally:
            with self._lock:
                self._running -= 1
                for tag in tags:
                    self._in_flight[tag] -= 1


# vocoder calls cost far more than talker steps: the vocoder is the busy stage
SLOW_VOCODER = SimConfig(
    talker_frames_per_step=16,
    talker_step_base_ms=0.2,
    talker_step_per_stream_ms=0.05,
    vocoder_base_ms=4.0,
    vocoder_per_frame_ms=0.2,
)


def _check(pcm: np.ndarray, text: str) -> None:
    pairs = decode_sim_signal(pcm, FAST_SIM.samples_per_frame)
    assert [index for _, index in pairs] == list(range(expected_frames(text)))
    assert len({tag for tag, _ in pairs}) == 1


LONE = [" ".join(TEXTS[:4])]


def _watch_takes(engine: Engine) -> list[tuple[int, int, int]]:
    """(chunks of the stream already in flight, other streams ready, streams with work)
    at every take: every chunk of a plan the vocoder core hands a worker."""
    book = engine.book
    core = book.vocoder
    takes: list[tuple[int, int, int]] = []
    schedule = core.schedule

    def watched(now_s: float) -> VocodePlan | None:
        plan = schedule(now_s)
        if plan is not None:
            taken = set(plan.stream_ids)
            # ready_ids leaves out the streams a worker decodes: those just taken too
            others = [stream_id for stream_id in core.ready_ids if stream_id not in taken]
            for record, _ in plan.batch:
                # the plan's chunk is in flight already: those before it
                takes.append((len(record.in_flight) - 1, len(others), len(book)))
        return plan

    core.schedule = watched  # type: ignore[method-assign]
    return takes


async def _run(
    make_engine: EngineFactory,
    workers: int,
    texts: Sequence[str] = TEXTS,
    *,
    work_ahead: bool = True,
    backend: OverlappingSim | None = None,
) -> tuple[OverlappingSim, list[np.ndarray], list[tuple[int, int, int]]]:
    backend = backend or OverlappingSim(SLOW_VOCODER)
    engine = await make_engine(
        backend,
        window=1,
        vocoder=VocoderConfig(workers=workers),
        alone=AloneConfig(work_ahead=work_ahead),
        talker=TalkerConfig(high_water_s=3600.0, batch=8),
    )
    assert len(engine.extra_vocoder_stages) == workers - 1
    takes = _watch_takes(engine)
    streams = [engine.submit(text, voice="sim") for text in texts]
    pcms = await asyncio.gather(*(read_all(stream) for stream in streams))
    for pcm, text in zip(pcms, texts, strict=True):
        _check(pcm, text)
    assert all(engine.traces(stream.id) == [] for stream in streams)
    assert len(engine.book) == 0
    return backend, pcms, takes


async def test_two_workers_decode_side_by_side(make_engine: EngineFactory) -> None:
    backend, _, _ = await _run(make_engine, workers=2)
    assert backend.calls_at_once == 2


async def test_a_second_chunk_of_a_stream_only_when_no_other_stream_is_ready(
    make_engine: EngineFactory,
) -> None:
    """One long stream among short ones: alone at the end, it gets both workers."""
    texts = [LONE[0], *TEXTS[:5]]
    _, _, takes = await _run(make_engine, workers=2, texts=texts)
    assert any(take[0] == 1 for take in takes)  # it happened
    assert [take for take in takes if take[0] > 0 and take[1] > 0] == []
    assert all(take[0] < 2 for take in takes)  # at most `workers` in flight


async def test_work_ahead_only_while_the_stream_is_alone(make_engine: EngineFactory) -> None:
    texts = [LONE[0], *TEXTS[:5]]
    _, _, takes = await _run(make_engine, workers=2, texts=texts)
    ahead = [take for take in takes if take[0] > 0]
    assert ahead and all(streams == 1 for _, _, streams in ahead)


async def test_without_work_ahead_never_one_stream_twice(make_engine: EngineFactory) -> None:
    backend, _, takes = await _run(make_engine, workers=2, work_ahead=False)
    assert backend.same_stream_twice == 0
    assert all(take[0] == 0 for take in takes)


async def test_a_lone_stream_gets_both_workers_and_the_same_pcm(
    make_engine: EngineFactory,
) -> None:
    """Its consecutive chunks are decoded at once, and what arrives is complete, in order
    and bit-identical to one chunk at a time."""
    backend, ahead, takes = await _run(make_engine, workers=2, texts=LONE)
    assert backend.same_stream_twice > 0
    assert any(take[0] == 1 for take in takes)
    _, one_at_a_time, _ = await _run(make_engine, workers=2, texts=LONE, work_ahead=False)
    _, one_worker, _ = await _run(make_engine, workers=1, texts=LONE)
    assert np.array_equal(ahead[0], one_at_a_time[0])
    assert np.array_equal(ahead[0], one_worker[0])


# talker steps as long as a decode, each making four chunks' frames: a lone stream's
# talker is stepping most of the time while chunks ahead of the one decoded are ready
SLOW_TALKER = SimConfig(
    talker_frames_per_step=32,
    talker_step_base_ms=3.0,
    talker_step_per_stream_ms=0.0,
    vocoder_base_ms=2.0,
    vocoder_per_frame_ms=0.1,
)


async def _ahead_takes(make_engine: EngineFactory) -> tuple[list[bool], np.ndarray]:
    """Whether the stream's talker step ran at each take of a chunk ahead of a lone
    stream's chunk in flight, and its PCM."""
    engine = await make_engine(
        OverlappingSim(SLOW_TALKER),
        window=1,
        vocoder=VocoderConfig(workers=2),
        talker=TalkerConfig(high_water_s=3600.0, batch=8),
    )
    core = engine.book.vocoder
    stepping: list[bool] = []
    schedule = core.schedule

    def watched(now_s: float) -> VocodePlan | None:
        plan = schedule(now_s)
        for record, _ in plan.batch if plan is not None else ():
            if len(record.in_flight) > 1:  # a chunk taken beside one in flight
                stepping.append(record.stepping)
        return plan

    core.schedule = watched  # type: ignore[method-assign]
    (pcm,) = await asyncio.gather(read_all(engine.submit(LONE[0], voice="sim")))
    _check(pcm, LONE[0])
    return stepping, pcm


async def test_no_chunk_ahead_while_the_streams_talker_step_runs(
    make_engine: EngineFactory,
) -> None:
    """A second worker takes a lone stream's next chunk only between its talker steps
    or after them, never during one (the talker keeps the other core)."""
    held, _ = await _ahead_takes(make_engine)
    assert held and not any(held)  # chunks ahead were taken, none during a step


class GatedSim(OverlappingSim):
    """Once two calls decode one stream, every call waits for `gate`; with `fail_second`
    the call that made it two raises instead."""

    capabilities = BackendCapabilities(concurrent_vocode_calls=True, aborts_vocode=True)

    def __init__(self, config: SimConfig, *, fail_second: bool = False) -> None:
        super().__init__(config)
        self.gate = threading.Event()
        self.fail_second = fail_second
        self.failed = 0
        self.aborted = 0  # calls the engine ended early (vocode_abort)

    def vocode_abort(self) -> _Abort:
        return _Abort()

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        tags = {int(item.frames[0, 0]) for item in items if len(item.frames)}
        with self._lock:
            second = any(self._in_flight.get(tag, 0) >= 1 for tag in tags)
        if second and self.fail_second and not self.failed:
            self.failed += 1
            raise RuntimeError("boom on the chunk decoded ahead")
        pcms = super().vocode(items, abort)
        if self.same_stream_twice:
            self.gate.wait(5.0)
        if isinstance(abort, _Abort) and abort.is_set():
            with self._lock:
                self.aborted += 1
            raise RuntimeError("aborted")
        return pcms


class _Abort(threading.Event):
    def __call__(self) -> None:
        self.set()


async def test_a_cancel_with_two_chunks_in_flight_leaks_nothing(
    make_engine: EngineFactory,
) -> None:
    backend = GatedSim(SLOW_VOCODER)
    engine = await make_engine(
        backend,
        window=1,
        vocoder=VocoderConfig(workers=2),
        talker=TalkerConfig(high_water_s=3600.0, batch=8),
    )
    stream = engine.submit(LONE[0], voice="sim")
    received: list[np.ndarray] = []

    async def read() -> None:
        async for pcm in stream.chunks():
            received.append(pcm)

    reader = asyncio.create_task(read())
    await until(lambda: backend.same_stream_twice > 0)
    record = engine.book.record(stream.id)
    assert record is not None and len(record.in_flight) == 2
    engine.cancel(stream.id)
    backend.gate.set()
    with pytest.raises(StreamCancelled):
        await reader
    await until(lambda: backend._running == 0)
    await asyncio.sleep(0.05)  # the workers' turns after the calls returned
    assert engine.traces(stream.id) == [] and len(engine.book) == 0
    assert backend.aborted == 2  # both calls were told to end early
    if received:
        pairs = decode_sim_signal(np.concatenate(received), FAST_SIM.samples_per_frame)
        assert [index for _, index in pairs] == list(range(len(pairs)))  # a prefix, in order


async def test_a_failure_of_the_chunk_ahead_fails_the_stream_in_order(
    make_engine: EngineFactory,
) -> None:
    backend = GatedSim(SLOW_VOCODER, fail_second=True)
    backend.gate.set()
    engine = await make_engine(
        backend,
        window=1,
        vocoder=VocoderConfig(workers=2),
        talker=TalkerConfig(high_water_s=3600.0, batch=8),
    )
    stream = engine.submit(LONE[0], voice="sim")
    received: list[np.ndarray] = []
    with pytest.raises(Exception, match="boom"):
        async for pcm in stream.chunks():
            received.append(pcm)
    await until(lambda: backend._running == 0)
    await asyncio.sleep(0.05)
    assert backend.failed == 1
    assert stream.state is StreamState.FAILED
    assert engine.traces(stream.id) == [] and len(engine.book) == 0
    if received:
        pairs = decode_sim_signal(np.concatenate(received), FAST_SIM.samples_per_frame)
        assert [index for _, index in pairs] == list(range(len(pairs)))


class HeldSim(OverlappingSim):
    """Every call that decodes stream `held_tag` waits for `release`."""

    def __init__(self, config: SimConfig, held_tag: int) -> None:
        super().__init__(config)
        self.held_tag = held_tag
        self.release = threading.Event()
        self.holding = 0  # calls waiting for the release now

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        if any(len(item.frames) and int(item.frames[0, 0]) == self.held_tag for item in items):
            with self._lock:
                self.holding += 1
            self.release.wait(10.0)
            with self._lock:
                self.holding -= 1
        return super().vocode(items, abort)


async def test_one_worker_runs_one_call_at_a_time(make_engine: EngineFactory) -> None:
    backend, _, _ = await _run(make_engine, workers=1)
    assert backend.calls_at_once == 1


async def test_a_backend_without_overlapping_calls_gets_one_worker(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine(SimBackend(FAST_SIM), vocoder=VocoderConfig(workers=4))
    assert engine.extra_vocoder_stages == []


# Yielding to a first audio (`yield_slack_s`): while a stream's first talker step or first
# chunk's decode runs, a worker whose picked streams have that much audio buffered waits.


class HeldTalkSim(OverlappingSim):
    """Every talker step of stream `held_tag` waits for `release` (its first one first)."""

    def __init__(self, config: SimConfig, held_tag: int) -> None:
        super().__init__(config)
        self.held_tag = held_tag
        self.release = threading.Event()
        self.holding = 0

    def step(self, segments):  # type: ignore[no-untyped-def]
        if any(segment.tag == self.held_tag for segment in segments):
            self.holding += 1
            self.release.wait(10.0)
            self.holding -= 1
        return super().step(segments)


@pytest.mark.parametrize(
    ("held", "yield_slack_s", "waits"),
    [
        ("first talker step", 1.0, True),
        ("first talker step", 0.0, False),
        ("first talker step", 1_000.0, False),
        ("first chunk's decode", 1.0, True),
    ],
)
async def test_a_worker_with_a_buffered_stream_waits_for_a_first_audio(
    make_engine: EngineFactory, held: str, yield_slack_s: float, waits: bool
) -> None:
    """Stream 1 plays with seconds of audio buffered; stream 2's first talker step, or its
    first chunk's decode, is held. With yield_slack_s 1 s, no worker decodes stream 1
    meanwhile; with 0 (off), or with a threshold above what stream 1 has buffered, stream
    1 goes on. Every frame of both still arrives once, in order."""
    backend: HeldTalkSim | HeldSim
    if held == "first talker step":
        backend = HeldTalkSim(SLOW_VOCODER, held_tag=2)
    else:
        backend = HeldSim(SLOW_VOCODER, held_tag=2)
    engine = await make_engine(
        backend,
        window=1,
        vocoder=VocoderConfig(workers=2, yield_slack_s=yield_slack_s),
        talker=TalkerConfig(high_water_s=3600.0, batch=1, urgent_lane=False),
    )
    takes = _watch_takes(engine)
    long_text = " ".join(TEXTS)
    playing = engine.submit(long_text, voice="sim")  # tag 1
    reader = asyncio.create_task(read_all(playing))

    def buffered_s() -> float:
        slack_s = engine.book.scheduler.slack_s(playing.id, engine._clock())
        return -math.inf if slack_s is None else slack_s

    await until(lambda: buffered_s() > 2.0 and len(takes) > 4)
    second = engine.submit(TEXTS[0], voice="sim")  # tag 2: held
    await until(lambda: backend.holding == 1)
    await asyncio.sleep(0.01)  # a turn in flight when it came ends
    before = len(takes)
    await asyncio.sleep(0.1)
    assert (len(takes) == before) is waits
    assert (engine.vocoder.yields > 0) is waits
    # counted whether or not workers yield (the core always counts; it yields only with
    # yield_slack_s and more than one worker)
    assert engine.book.vocoder.first_audio_work == 1
    backend.release.set()
    pcms = await asyncio.gather(reader, read_all(second))
    _check(pcms[0], long_text)
    _check(pcms[1], TEXTS[0])
    assert engine.book.vocoder.first_audio_work == 0
    assert len(engine.book) == 0


async def test_no_chunk_ahead_while_another_stream_has_work_and_nothing_ready(
    make_engine: EngineFactory,
) -> None:
    """Work-ahead is for a stream alone, and alone means no other stream has work, not
    merely none with a chunk ready: stream 1, all talked, gets chunks ahead while alone;
    once stream 2 arrives and its first talker step is held (no chunk of it is ready),
    the workers go on with stream 1's chunks one at a time. Every frame still arrives."""
    backend = HeldTalkSim(SLOW_VOCODER, held_tag=2)
    engine = await make_engine(
        backend,
        window=1,
        # no yielding to stream 2's first audio: the workers go on with stream 1
        vocoder=VocoderConfig(workers=2, yield_slack_s=0.0),
        talker=TalkerConfig(high_water_s=3600.0, batch=1, urgent_lane=False),
    )
    takes = _watch_takes(engine)
    long_text = " ".join(TEXTS * 2)
    playing = engine.submit(long_text, voice="sim")  # tag 1
    reader = asyncio.create_task(read_all(playing))

    def talked_all() -> bool:
        record = engine.book.record(playing.id)
        return record is not None and record.talked_all

    await until(lambda: talked_all() and any(take[0] == 1 for take in takes))  # ahead alone
    second = engine.submit(TEXTS[0], voice="sim")  # tag 2: held
    await until(lambda: backend.holding == 1)
    await asyncio.sleep(0.01)  # a turn in flight when it came ends
    before = len(takes)
    await asyncio.sleep(0.05)
    during = takes[before:]
    assert during, "stream 1 goes on"
    assert all(take[0] == 0 and take[2] == 2 for take in during), during
    backend.release.set()
    pcms = await asyncio.gather(reader, read_all(second))
    _check(pcms[0], long_text)
    _check(pcms[1], TEXTS[0])
    assert len(engine.book) == 0

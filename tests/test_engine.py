"""The engine end to end on the sim backend: every frame once, in order, per stream."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from contextlib import aclosing

import numpy as np
import pytest
from conftest import FAST_SIM, EngineFactory, read_all, until

from pipeline import (
    Engine,
    NotReady,
    Rejected,
    Stream,
    StreamCancelled,
    StreamFailed,
    StreamState,
    StreamStats,
    UnknownVoice,
)
from pipeline.backend import AbortHandle, TalkRequest, TalkStep, VocodeItem
from pipeline.backends.sim import SimBackend, SimSegment, decode_sim_signal, expected_frames
from pipeline.config import EngineConfig, SimConfig, TalkerConfig
from pipeline.text import split_text
from scheduling import AdmissionConfig, ChunkingConfig

TEXTS = [
    "Hello there, this is stream number one speaking. It has two sentences.",
    "Short one.",
    "The quick brown fox jumps over the lazy dog, again and again, until it tires.",
    "Numbers like 3.5 and names like Dr. Smith stay whole! Do they? Yes.",
    "A single long sentence that keeps going with commas, semicolons; and colons: to the end.",
]


def _check_signal(pcm: np.ndarray, text: str, speed: float = 1.0) -> int:
    """The stream's frames, each exactly once, in order; returns its tag."""
    pairs = decode_sim_signal(pcm, FAST_SIM.samples_per_frame)
    expected = expected_frames(text, speed)
    assert [index for _, index in pairs] == list(range(expected))
    tags = {tag for tag, _ in pairs}
    assert len(tags) == 1
    return tags.pop()


async def _assert_empty(engine: Engine, streams: Sequence[Stream]) -> None:
    # at most a cancelled stream's open talker segment is left: the talker thread's next
    # call closes it
    for stream in streams:
        assert engine.traces(stream.id) in ([], ["orphans"])
    await until(lambda: all(engine.traces(s.id) == [] for s in streams))
    stats = engine.stats()
    assert (stats.active_streams, stats.parked_streams, stats.queued_frames) == (0, 0, 0)
    assert len(engine.book.scheduler) == 0
    backend = engine.backend
    if isinstance(backend, SimBackend):  # every talker segment is closed (an orphan taken
        # from the book's list is closed by the talker call that took it, a moment later)
        await until(lambda: backend.open_segments == 0)


@pytest.mark.parametrize(("policy", "window", "count"), [("edf", 2, 20), ("fifo", 0, 8)])
async def test_every_frame_arrives_once_in_order(
    make_engine: EngineFactory, policy: str, window: int, count: int
) -> None:
    engine = await make_engine(policy=policy, window=window)
    texts = [TEXTS[i % len(TEXTS)] for i in range(count)]
    streams = [engine.submit(text, voice="sim") for text in texts]
    pcms = await asyncio.gather(*(read_all(s) for s in streams))
    tags = [_check_signal(pcm, text) for pcm, text in zip(pcms, texts, strict=True)]
    assert len(set(tags)) == count
    for stream, text, pcm in zip(streams, texts, pcms, strict=True):
        assert stream.state is StreamState.DONE
        audio_s = expected_frames(text) * FAST_SIM.samples_per_frame / FAST_SIM.sample_rate_hz
        assert pcm.size / stream.sample_rate_hz == pytest.approx(audio_s)
        assert stream.stats.audio_s == pytest.approx(audio_s)
        assert stream.stats.ttfa_s is not None and stream.stats.ttfa_s > 0
    await _assert_empty(engine, streams)


async def test_speed_voice_name_and_empty_text(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    fast = engine.submit(TEXTS[0], voice="SIM", speed=2.0)
    _check_signal(await read_all(fast), TEXTS[0], speed=2.0)
    blank = engine.submit(" \n ", voice="sim")
    assert (await read_all(blank)).size == 0
    assert blank.state is StreamState.DONE
    with pytest.raises(UnknownVoice) as caught:
        engine.submit("hi", voice="alloy")
    assert caught.value.available == ["sim"]


async def test_live_text_in_pieces(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    text = TEXTS[0] + " " + TEXTS[2]
    stream = engine.submit(text[:17], voice="sim", final=False)
    reader = asyncio.ensure_future(read_all(stream))
    for start in range(17, len(text), 23):
        engine.append_text(stream.id, text[start : start + 23])
        await asyncio.sleep(0)
    engine.append_text(stream.id, "", final=True)
    _check_signal(await reader, text)
    with pytest.raises(ValueError, match="no more text"):
        engine.append_text(stream.id, "more")


async def test_cancel_mid_stream_frees_everything(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    long_text = " ".join(TEXTS * 4)
    victim, other = (engine.submit(long_text, voice="sim") for _ in range(2))
    received = 0
    with pytest.raises(StreamCancelled):  # the reader learns of the cancel
        async with aclosing(victim.chunks()) as chunks:
            async for pcm in chunks:
                received += pcm.size
                if received >= 3 * FAST_SIM.samples_per_frame:
                    engine.cancel(victim.id)
    assert victim.state is StreamState.CANCELLED
    assert victim.stats.frames < expected_frames(long_text)  # the talker was stopped early
    # at most its open talker segment is left, for the talker thread to close next
    assert engine.traces(victim.id) in ([], ["orphans"])
    await until(lambda: engine.traces(victim.id) == [])
    engine.cancel(victim.id)  # idempotent
    _check_signal(await read_all(other), long_text)
    await _assert_empty(engine, [victim, other])


async def test_a_consumer_that_leaves_cancels_its_stream(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    leaver, dropped = (engine.submit(" ".join(TEXTS), voice="sim") for _ in range(2))
    async with aclosing(leaver.chunks()) as chunks:
        async for _ in chunks:
            break  # the client went away after one chunk
    # the reader's leaving is queued: the engine cancels the stream at its next step boundary
    await until(lambda: leaver.state is StreamState.CANCELLED)

    first = asyncio.Event()

    async def consume() -> None:
        async for _ in dropped.chunks():
            first.set()

    task = asyncio.ensure_future(consume())
    await first.wait()
    task.cancel()  # e.g. the HTTP client disconnected
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: dropped.state is StreamState.CANCELLED)
    await _assert_empty(engine, [leaver, dropped])


async def test_an_unread_stream_parks_at_the_cap_without_slowing_the_others(
    make_engine: EngineFactory,
) -> None:
    cap_s = 1.0
    engine = await make_engine(engine=EngineConfig(max_pending_audio_s=cap_s))
    unread = engine.submit(" ".join(TEXTS * 3), voice="sim")
    others = [engine.submit(text, voice="sim") for text in TEXTS]
    pcms = await asyncio.gather(*(read_all(s) for s in others))
    for pcm, text, stream in zip(pcms, TEXTS, others, strict=True):
        _check_signal(pcm, text)
        assert stream.stats.stalls == 0 and stream.stats.stall_s == 0.0
    await until(lambda: engine.stats().parked_streams == 1)
    chunk_s = 8 * FAST_SIM.samples_per_frame / FAST_SIM.sample_rate_hz
    assert cap_s <= unread.pending_audio_s <= cap_s + chunk_s
    stats = engine.stats()
    assert (stats.active_streams, stats.parked_streams) == (1, 1)
    # reading unparks it, and what it gets is still complete and in order
    _check_signal(await read_all(unread), " ".join(TEXTS * 3))
    await _assert_empty(engine, [unread, *others])


@pytest.mark.parametrize("run_ahead", [False, True])
async def test_the_talker_stays_under_the_high_water_mark(
    make_engine: EngineFactory, run_ahead: bool
) -> None:
    """Paced: playback + the mark. Running ahead (the talker has nothing else to do): the
    frames waiting for the vocoder stay within the mark."""
    sim = SimConfig(
        samples_per_frame=480,
        talker_frames_per_step=4,
        talker_step_base_ms=0.5,
        vocoder_base_ms=0.5,
        vocoder_per_frame_ms=0.0,
    )  # 20 ms frames
    engine = await make_engine(
        SimBackend(sim), talker=TalkerConfig(high_water_s=0.5, run_ahead=run_ahead)
    )
    sentence = "This sentence is about sixty characters long, give or take."
    stream = engine.submit(" ".join([sentence] * 40), voice="sim")  # ~40 s of audio
    async with aclosing(stream.chunks()) as chunks:
        async for _ in chunks:
            if stream.stats.ttfa_s is not None:
                break
        first_audio_s = time.monotonic()
        await asyncio.sleep(0.3)
        elapsed_s = time.monotonic() - first_audio_s
        produced_s = stream.stats.frames * 480 / 24000
        segment_s = expected_frames(sentence) * 480 / 24000
        # playback (~elapsed) + the mark + the segment that crossed it, with some slack
        if not run_ahead:
            assert produced_s <= elapsed_s + 0.5 + segment_s + 0.5
        assert engine.stats().queued_frames * 480 / 24000 <= 0.5 + segment_s + 0.5


async def test_admission_rejects_beyond_the_measured_capacity(make_engine: EngineFactory) -> None:
    rejected: list[str] = []

    class Events(_Recorder):
        def rejected(self, reason: str) -> None:
            rejected.append(reason)

    # 80 ms of audio per 40 ms of vocoder time: about 2 audio seconds per second
    sim = SimConfig(talker_step_base_ms=0.5, vocoder_base_ms=0.0, vocoder_per_frame_ms=40.0)
    engine = await make_engine(
        SimBackend(sim),
        chunking=ChunkingConfig(chunk_frames=2),
        # a fixed cap above the capacity: the capacity rule refuses first
        admission=AdmissionConfig(enabled=True, capacity_headroom=0.9, max_streams=10),
        events=Events(),
    )
    first = engine.submit(TEXTS[0], voice="sim")  # 1 stream <= 2 x 0.9 (calibrated)
    chunks = aiter(first.chunks())
    await anext(chunks)  # one vocoder call measured; the stream stays active
    assert 1.0 < engine.stats().capacity_audio_s_per_s < 2.5
    with pytest.raises(Rejected) as caught:
        engine.submit(TEXTS[1], voice="sim")  # 2 streams > 2 x 0.9
    assert caught.value.decision.retry_after_s >= 1
    assert rejected == ["capacity"]
    await chunks.aclose()


async def test_a_stream_whose_audio_is_all_sent_owes_no_slot(
    make_engine: EngineFactory,
) -> None:
    """Admission counts the work still owed: once a stream's audio is all produced and
    sent, its slot is free, however long its player still plays (a client reading each
    answer to its end before the next is never refused by its own finished requests)."""
    engine = await make_engine(admission=AdmissionConfig(enabled=True, max_streams=1))
    first = engine.submit(TEXTS[0], voice="sim")
    audio_s = len(await read_all(first)) / FAST_SIM.sample_rate_hz
    assert audio_s > 3.0  # vocoded far faster than it plays: its player plays on
    assert first.state is StreamState.DONE
    second = engine.submit(TEXTS[1], voice="sim")  # not Rejected
    with pytest.raises(Rejected) as caught:  # while the second owes work, the slot is taken
        engine.submit(TEXTS[0], voice="sim")
    assert caught.value.decision.reason == "max_streams"
    assert caught.value.retry_after_s >= 1
    _check_signal(await read_all(second), TEXTS[1])


class _FailingSim(SimBackend):
    """The sim backend, except that opening a segment with 'OPEN-BOOM', stepping one with
    'STEP-BOOM' (after its first step) or vocoding stream tag `bad_tag` fails."""

    bad_tag = -1

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.doomed: set[int] = set()  # id() of segments whose second step fails

    def open_segment(self, request: TalkRequest) -> SimSegment:
        if "OPEN-BOOM" in request.text:
            raise RuntimeError("open exploded")
        segment = super().open_segment(request)
        if "STEP-BOOM" in request.text:
            self.doomed.add(id(segment))
        return segment

    def step(self, segments: Sequence[SimSegment]) -> list[TalkStep]:
        results = super().step(segments)
        for segment, result in zip(segments, results, strict=True):
            if id(segment) in self.doomed and result.frames[0, 1] > 0:
                raise RuntimeError("step exploded")
        return results

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        if any(int(item.frames[0, 0]) == self.bad_tag for item in items):
            raise RuntimeError("vocoder exploded")
        return super().vocode(items, abort)


@pytest.mark.parametrize("stage", ["open", "step", "vocoder"])
async def test_a_backend_error_fails_only_its_stream(
    make_engine: EngineFactory, stage: str
) -> None:
    backend = _FailingSim(FAST_SIM)
    engine = await make_engine(backend, window=1)
    texts = [TEXTS[0], TEXTS[2] + f" {stage.upper()}-BOOM, it fails here.", TEXTS[3]]
    if stage == "vocoder":
        texts[1] = TEXTS[2]
    streams = [engine.submit(text, voice="sim") for text in texts]
    if stage == "vocoder":  # the second stream submitted (before the vocoder ran at all)
        record = engine.book.record(streams[1].id)
        assert record is not None
        backend.bad_tag = record.tag
    results = await asyncio.gather(*(read_all(s) for s in streams), return_exceptions=True)
    assert isinstance(results[1], StreamFailed)
    assert str(results[1].cause) == f"{stage} exploded"
    assert streams[1].state is StreamState.FAILED
    for index in (0, 2):
        _check_signal(results[index], texts[index])
    assert engine.ready
    await _assert_empty(engine, streams)
    _check_signal(await read_all(engine.submit(TEXTS[4], voice="sim")), TEXTS[4])


class _ThreadRecordingSim(SimBackend):
    def __init__(self) -> None:
        super().__init__(FAST_SIM)
        self.talk_threads: set[str] = set()
        self.vocode_threads: set[str] = set()

    def open_segment(self, request: TalkRequest) -> SimSegment:
        self.talk_threads.add(threading.current_thread().name)
        return super().open_segment(request)

    def step(self, segments: Sequence[SimSegment]) -> list[TalkStep]:
        self.talk_threads.add(threading.current_thread().name)
        return super().step(segments)

    def close_segment(self, segment: SimSegment) -> None:
        self.talk_threads.add(threading.current_thread().name)
        super().close_segment(segment)

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        self.vocode_threads.add(threading.current_thread().name)
        return super().vocode(items, abort)


async def test_model_calls_run_in_their_stage_threads(make_engine: EngineFactory) -> None:
    backend = _ThreadRecordingSim()
    engine = await make_engine(backend)
    await asyncio.gather(*(read_all(engine.submit(t, voice="sim")) for t in TEXTS))
    assert {name.rsplit("_", 1)[0] for name in backend.talk_threads} == {"playhead-talker"}
    assert {name.rsplit("_", 1)[0] for name in backend.vocode_threads} == {"playhead-vocoder"}


async def test_idle_loops_wait_on_events_not_polls(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    await asyncio.sleep(0.01)  # the calibration's last wakes are handled
    after_start = (engine.talker.idle_waits, engine.vocoder.idle_waits)
    await asyncio.sleep(0.05)
    # each loop waits for an event: no polling while idle
    assert (engine.talker.idle_waits, engine.vocoder.idle_waits) == after_start
    await read_all(engine.submit(TEXTS[1], voice="sim"))
    await asyncio.sleep(0.05)  # both loops settle

    def counters() -> tuple[int, ...]:
        talker, vocoder = engine.talker, engine.vocoder
        return (talker.idle_waits, talker.steps, vocoder.idle_waits, vocoder.turns)

    settled = counters()
    await asyncio.sleep(0.05)
    assert counters() == settled


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return lambda *args: self.calls.append((name, args))


async def test_events_stats_and_the_log_line(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    events = _Recorder()
    engine = await make_engine(events=events)
    caplog.set_level(logging.INFO, logger="playhead.engine")
    stream = engine.submit(TEXTS[0], voice="sim")
    await read_all(stream)
    names = [name for name, _ in events.calls]
    assert names[0] == "stream_started" and names[-1] == "stream_finished"
    assert names.count("first_audio") == 1
    assert {"talker_call", "vocoder_turn", "capacity"} <= set(names)
    stats, state = events.calls[-1][1]
    assert isinstance(stats, StreamStats) and state is StreamState.DONE
    # two sentences; the first (8 words) is not cut: text.first_fragment_words is 13
    assert stats.segments == 2 and stats.frames == expected_frames(TEXTS[0])
    assert stats.chunks >= 3 and stats.finished_at_s is not None
    (line,) = [r.getMessage() for r in caplog.records if r.name == "playhead.engine"]
    assert stream.id in line and " done " in line and "ttfa_ms=" in line
    assert "stalls=0" in line and "policy=edf" in line


class _TalkOrderSim(SimBackend):
    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.calls: list[tuple[int, int]] = []  # (stream_tag, segment_index), when opened

    def open_segment(self, request: TalkRequest) -> SimSegment:
        self.calls.append((request.stream_tag, request.segment_index))
        return super().open_segment(request)


async def test_the_talker_serves_a_stream_without_audio_first(make_engine: EngineFactory) -> None:
    # 4 frames per 8 ms step: 500 frames per second
    backend = _TalkOrderSim(SimConfig(talker_step_base_ms=8.0, vocoder_base_ms=0.0))
    engine = await make_engine(backend)
    text = " ".join(TEXTS * 3)
    playing = engine.submit(text, voice="sim")
    chunks = aiter(playing.chunks())
    await anext(chunks)  # it plays; its talker work goes on
    talked = len(backend.calls)
    assert talked < len(split_text(text)) - 1  # some of its segments still wait
    newcomer = engine.submit(TEXTS[1], voice="sim")
    await read_all(newcomer)
    # right after the call in flight, the newcomer's first segment: it has no audio at all
    assert backend.calls[talked] == (2, 0)
    await chunks.aclose()


async def test_not_ready_before_start_and_stop_ends_every_stream(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine()
    stream = engine.submit(" ".join(TEXTS * 3), voice="sim")
    chunks = aiter(stream.chunks())
    await anext(chunks)
    await engine.stop()
    assert stream.state is StreamState.CANCELLED
    with pytest.raises(StreamCancelled):  # the reader learns why it ends
        await anext(chunks)
    assert not engine.ready
    with pytest.raises(NotReady):
        engine.submit("hi", voice="sim")


async def test_an_ack_before_the_first_audio_is_ignored(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    stream = engine.submit(TEXTS[0], voice="sim")
    engine.ack_playback(stream.id, 0.0)  # no audio yet: nothing to correct
    assert engine.book.scheduler.horizon_s(stream.id) is None
    _check_signal(await read_all(stream), TEXTS[0])
    assert stream.stats.stalls == 0


class _RaisingEvents(_Recorder):
    """Metrics hooks that break: the engine logs them and carries on."""

    def first_audio(self, stream_id: str, ttfa_s: float) -> None:
        raise RuntimeError("metrics broke")

    def vocoder_turn(self, batch_size: int, turn_s: float) -> None:
        raise RuntimeError("metrics broke")


async def test_a_raising_events_hook_is_logged_and_the_streams_go_on(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    engine = await make_engine(events=_RaisingEvents())
    streams = [engine.submit(text, voice="sim") for text in TEXTS[:3]]
    pcms = await asyncio.gather(*(read_all(s) for s in streams))
    for pcm, text in zip(pcms, TEXTS[:3], strict=True):
        _check_signal(pcm, text)
    assert engine.ready
    assert "events.first_audio failed" in caplog.text
    assert "events.vocoder_turn failed" in caplog.text

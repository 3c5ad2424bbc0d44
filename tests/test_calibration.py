"""Admission never admits blind: the capacity is calibrated before the engine is ready,
anchors the estimate while idle and under a short slow patch, sets the default
max_streams, and a burst of requests the moment /ready comes up gets at most that many
streams, every other one a 429 with Retry-After, and no admitted stream stalls.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

import httpx
import pytest
from api_support import live_server, metric_value
from conftest import FAST_SIM, EngineFactory, read_all, until

from app.settings import load_settings
from configs import packaged_config
from pipeline.backends.sim import SimBackend
from pipeline.capacity import CapacityEstimate
from pipeline.config import EngineConfig
from pipeline.events import NullEvents
from pipeline.stream import StreamState, StreamStats
from scheduling import AdmissionConfig

CALIBRATE = EngineConfig(calibration_calls=8, recalibrate_idle_s=0)


class Recorder(NullEvents):
    def __init__(self) -> None:
        self.names: list[str] = []

    def stream_started(self, stream_id: str) -> None:
        self.names.append("stream_started")

    def vocoder_turn(self, batch_size: int, turn_s: float) -> None:
        self.names.append("vocoder_turn")

    def talker_step(self, stream_ids: Sequence[str]) -> None:
        self.names.append("talker_step")

    def stream_finished(self, stats: StreamStats, state: StreamState) -> None:
        self.names.append("stream_finished")


async def test_the_engine_is_calibrated_before_start_returns(make_engine: EngineFactory) -> None:
    events = Recorder()
    backend = SimBackend(FAST_SIM)
    engine = await make_engine(
        backend,
        window=2,
        engine=CALIBRATE,
        admission=AdmissionConfig(capacity_headroom=0.5),
        events=events,
    )
    # FAST_SIM: a call of 2 chunks of 8 frames costs 1 + 0.2 x 16 (+ context) ms for
    # 2 x 8 x 80 ms of audio: the vocoder's rate is a few hundred audio s per s
    assert engine.calibrated_capacity > 10
    assert engine.calibrations == 1
    assert engine.stats().capacity_audio_s_per_s == pytest.approx(engine.calibrated_capacity)
    assert engine.default_max_streams == math.floor(engine.calibrated_capacity * 0.5)
    # the calibration leaves nothing behind and reports nothing
    assert engine.in_flight == 0 and engine.book.stream_ids() == []
    await until(lambda: backend.open_segments == 0)
    assert events.names == []
    stream = engine.submit("Hello there.", voice="sim")
    await read_all(stream)
    assert events.names[0] == "stream_started" and events.names[-1] == "stream_finished"


async def test_max_streams_defaults_to_the_calibrated_capacity(make_engine: EngineFactory) -> None:
    engine = await make_engine(
        engine=CALIBRATE,
        # the start-phase limit off: this test is about max_streams alone
        admission=AdmissionConfig(capacity_headroom=1.0, max_starting_streams=0),
    )
    # a calibration of 3.4 streams: 3 admitted, the 4th refused (not every request)
    engine.calibrated_capacity = 3.4
    long_text = "A long sentence that keeps its stream busy for a while. " * 20
    streams = [engine.submit(long_text, voice="sim") for _ in range(3)]
    from pipeline.errors import Rejected

    with pytest.raises(Rejected) as caught:
        engine.submit(long_text, voice="sim")
    assert caught.value.decision.reason == "max_streams"
    assert caught.value.decision.retry_after_s >= 1
    for stream in streams:
        engine.cancel(stream.id)


async def test_a_reservation_holds_its_slot_until_submit_or_release(
    make_engine: EngineFactory,
) -> None:
    """A request's admission is decided before its text is prepared: slots reserved by a
    burst count before any of its streams exist, and each turns into one stream."""
    from pipeline.errors import Rejected

    engine = await make_engine(
        engine=CALIBRATE, admission=AdmissionConfig(max_streams=3, max_starting_streams=0)
    )
    held = [engine.reserve() for _ in range(3)]
    with pytest.raises(Rejected) as caught:
        engine.reserve()
    assert caught.value.decision.reason == "max_streams"
    held[0].release()
    held[0].release()  # idempotent: one slot back, not two
    held[0] = engine.reserve()
    with pytest.raises(Rejected):
        engine.submit("Hello there.", voice="sim")  # no reservation: the slots are full
    long_text = "A long sentence that keeps its stream busy for a while. " * 20
    streams = [engine.submit(long_text, voice="sim", reservation=r) for r in held]
    assert engine.in_flight == 3
    # a used reservation neither admits again nor frees a slot
    held[0].release()
    with pytest.raises(Rejected):
        engine.reserve()
    for stream in streams:
        engine.cancel(stream.id)
    engine.reserve().release()  # free again


async def test_a_live_text_stream_waiting_for_text_is_not_starting(
    make_engine: EngineFactory,
) -> None:
    """A WebSocket-style stream (final=False) counts as starting only while it has text to
    talk or audio to make: two sessions idle between messages must not refuse everyone."""

    engine = await make_engine(
        engine=CALIBRATE,
        admission=AdmissionConfig(max_streams=10, max_starting_streams=2, start_phase_chunks=2),
    )
    idle = [engine.submit("Hello", voice="sim", final=False) for _ in range(2)]
    # "Hello" has no sentence end: the segmenter holds it, nothing to talk yet
    await until(lambda: engine.book.starting_streams() == 0)
    newcomer = engine.submit("A request of its own.", voice="sim")
    assert engine.book.starting_streams() == 1
    engine.append_text(idle[0].id, " there, how are you today? I", final=False)
    assert engine.book.starting_streams() == 2  # it has a sentence to talk now
    waiting = engine.reserve()
    assert waiting.queued and not waiting.starting  # the start phase is full
    waiting.release()
    for stream in (*idle, newcomer):
        engine.cancel(stream.id)


LONG = "A long sentence that keeps its stream busy for a while. " * 20


def start_queue_config(**overrides: object) -> AdmissionConfig:
    config = {"max_streams": 10, "max_starting_streams": 2, "start_phase_chunks": 2}
    return AdmissionConfig(**(config | overrides))  # type: ignore[arg-type]


def assert_nothing_held(engine) -> None:
    """Every reservation given back or used: no slot, start slot or queue place left."""
    assert engine._reserved == 0 and engine._reserved_starting == 0
    assert not engine._start_queue


async def read_out(stream) -> None:
    async for _ in stream.chunks():
        pass


async def test_streams_beyond_the_start_limit_wait_for_a_start_slot_in_order(
    make_engine: EngineFactory,
) -> None:
    """At most max_starting_streams streams start at once; a request admitted beyond it
    waits (holding its slot) and gets a start slot, first come first served, when a
    starting stream leaves its start phase (here: when it ends)."""
    # a start phase longer than these streams: only an ending frees a start slot
    engine = await make_engine(
        engine=CALIBRATE, admission=start_queue_config(start_phase_chunks=10_000)
    )
    first = [engine.submit(LONG, voice="sim", reservation=engine.reserve()) for _ in range(2)]
    queued = [engine.reserve() for _ in range(3)]
    assert all(r.queued and not r.starting for r in queued)
    # a waiting reservation counts as starting for later arrivals (and as playing)
    assert engine.starting_streams() == 5 and engine.admitted_streams(engine._clock()) == 5
    granted: list[int] = []

    async def wait(index: int) -> None:
        await queued[index].wait_start()
        granted.append(index)

    # waited for in the reverse order: the slots still go in arrival order
    waiters = [asyncio.ensure_future(wait(index)) for index in (2, 1, 0)]
    await asyncio.sleep(0.05)
    assert granted == []
    engine.cancel(first[1].id)  # an ended stream leaves the start phase
    await until(lambda: granted == [0])
    second = engine.submit(LONG, voice="sim", reservation=queued[0])
    await asyncio.sleep(0.05)
    assert granted == [0] and queued[1].queued  # 2 starting again: the others wait
    engine.cancel(first[0].id)
    await until(lambda: granted == [0, 1])
    queued[1].release()  # a granted slot given back unused frees it too
    await until(lambda: granted == [0, 1, 2])
    await asyncio.gather(*waiters)
    queued[2].release()
    engine.cancel(second.id)
    assert_nothing_held(engine)


async def test_a_stream_that_sent_its_start_chunks_frees_a_start_slot(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine(engine=CALIBRATE, admission=start_queue_config())
    first = [engine.submit(LONG, voice="sim", reservation=engine.reserve()) for _ in range(2)]
    waiting = engine.reserve()
    await asyncio.wait_for(waiting.wait_start(), 2)
    # granted while both first streams still play: one of them sent its start chunks
    assert any(s.stats.chunks >= 2 for s in first)
    assert not any(s.state.terminal for s in first)
    waiting.release()
    for stream in first:
        engine.cancel(stream.id)
    assert_nothing_held(engine)


async def test_a_few_simultaneous_requests_on_an_idle_engine_all_start(
    make_engine: EngineFactory,
) -> None:
    """A voice agent sends 3 at once: none is refused, the 3rd waits for a start slot."""
    engine = await make_engine(engine=CALIBRATE, admission=start_queue_config())
    held = [engine.reserve() for _ in range(3)]
    await asyncio.wait_for(asyncio.gather(*(r.wait_start() for r in held[:2])), 1)
    streams = [engine.submit("Hello there.", voice="sim", reservation=r) for r in held[:2]]
    await held[2].wait_start()  # the first two start, then it goes
    streams.append(engine.submit("Hello there.", voice="sim", reservation=held[2]))
    audio = await asyncio.gather(*(read_all(stream) for stream in streams))
    assert all(pcm.size > 0 for pcm in audio)
    assert_nothing_held(engine)


async def test_a_start_wait_times_out_with_a_429_starting(make_engine: EngineFactory) -> None:
    from pipeline.errors import Rejected

    engine = await make_engine(
        engine=CALIBRATE,
        admission=start_queue_config(
            start_retry_after_s=3, start_queue_timeout_s=0.05, start_phase_chunks=10_000
        ),
    )
    first = [engine.submit(LONG, voice="sim", reservation=engine.reserve()) for _ in range(2)]
    late = engine.reserve()
    with pytest.raises(Rejected) as caught:
        await late.wait_start()
    assert caught.value.decision == caught.value.decision.__class__(False, 3, "starting")
    late.release()
    # no wait at all: the 429 at once
    no_queue = await make_engine(
        engine=CALIBRATE,
        admission=start_queue_config(start_queue_timeout_s=0, start_phase_chunks=10_000),
    )
    held = [no_queue.reserve() for _ in range(2)]
    with pytest.raises(Rejected) as caught:
        no_queue.reserve()
    assert caught.value.decision.reason == "starting"
    for reservation in held:
        reservation.release()
    for stream in first:
        engine.cancel(stream.id)
    assert_nothing_held(engine)
    assert_nothing_held(no_queue)


async def test_a_cancelled_waiter_gives_its_place_back(make_engine: EngineFactory) -> None:
    """A waiter whose client left: its slot and its place in the queue are free again,
    and the one behind it gets the start slot."""
    engine = await make_engine(
        engine=CALIBRATE, admission=start_queue_config(start_phase_chunks=10_000)
    )
    first = [engine.submit(LONG, voice="sim", reservation=engine.reserve()) for _ in range(2)]
    gone, behind = engine.reserve(), engine.reserve()
    waiter = asyncio.ensure_future(gone.wait_start())
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    gone.release()
    assert engine.starting_streams() == 3 and engine._reserved == 1
    engine.cancel(first[0].id)
    await asyncio.wait_for(behind.wait_start(), 1)
    assert behind.starting
    behind.release()
    engine.cancel(first[1].id)
    assert_nothing_held(engine)


async def test_a_waiter_gets_not_ready_when_the_engine_stops_or_drains(
    make_engine: EngineFactory,
) -> None:
    from pipeline.errors import NotReady

    for stop in ("close_admission", "stop"):
        engine = await make_engine(
            engine=CALIBRATE, admission=start_queue_config(start_phase_chunks=10_000)
        )
        first = [engine.submit(LONG, voice="sim", reservation=engine.reserve()) for _ in range(2)]
        waiting = engine.reserve()
        waiter = asyncio.ensure_future(waiting.wait_start())
        await asyncio.sleep(0)
        if stop == "stop":
            await engine.stop()
        else:
            engine.close_admission()
        with pytest.raises(NotReady):
            await waiter
        waiting.release()
        for stream in first:
            engine.cancel(stream.id)
        assert_nothing_held(engine)


async def test_without_calibration_the_cap_is_off(make_engine: EngineFactory) -> None:
    engine = await make_engine(engine=EngineConfig(calibration_calls=0))
    assert engine.calibrated_capacity == 0 and engine.default_max_streams == 0


def test_idle_estimate_returns_to_the_calibration_and_a_slow_patch_is_floored() -> None:
    rate = CapacityEstimate(window_s=5.0)
    rate.set_baseline(10.0, floor_fraction=0.5)
    assert rate.value(0.0) == 10.0  # nothing measured yet: the calibration
    # a slow patch: the CPU taken by another process, 1 audio s per busy s
    for t in range(1, 4):
        rate.record(t - 1.0, float(t), 1.0)
    assert rate.value(3.0) == 5.0  # floored at half the calibration
    rate.record(3.0, 3.1, 2.0)  # one fast call does not lift the window above the floor
    assert rate.value(3.1) == 5.0
    # idle past the window: the calibration again, not the last busy period
    assert rate.value(20.0) == 10.0
    # without a baseline an idle stage holds its last estimate (the old behaviour)
    plain = CapacityEstimate(window_s=5.0)
    plain.record(0.0, 1.0, 3.0)
    assert plain.value(30.0) == 3.0


def test_the_floor_never_raises_a_fast_measurement() -> None:
    rate = CapacityEstimate(window_s=5.0)
    rate.set_baseline(10.0, floor_fraction=0.5)
    rate.record(0.0, 1.0, 30.0)
    assert rate.value(1.0) == 30.0


async def test_a_calibration_whose_streams_all_end_first_stops_at_once(
    make_engine: EngineFactory,
) -> None:
    """More vocoder calls asked for than the calibration's streams need: every stream
    ends, the vocoder goes idle, and the calibration stops there with what it measured,
    instead of waiting for calibration_max_s (an hour here) for a turn that never comes."""
    async with asyncio.timeout(60.0):  # a hang guard, not a bound
        # start() calibrates once, then a second time by hand
        engine = await make_engine(
            engine=EngineConfig(calibration_calls=100_000, calibration_max_s=3600.0)
        )
        measured = await engine.calibrate()
    assert measured > 0
    assert engine.calibrations == 2
    assert engine.book.turns_running == 0 and len(engine.book) == 0


async def test_idle_engine_recalibrates_and_a_request_ends_it(make_engine: EngineFactory) -> None:
    events = Recorder()
    engine = await make_engine(
        engine=EngineConfig(calibration_calls=8, recalibrate_idle_s=0.05), events=events
    )
    await until(lambda: engine.calibrations >= 2)  # idle: measured again
    # a request during a recalibration ends it at once and is served as usual
    await until(lambda: engine._calibration is not None)
    stream = engine.submit("Hello there.", voice="sim")
    assert engine._calibration is None
    audio = await read_all(stream)
    assert audio.size > 0 and stream.state is StreamState.DONE

    assert events.names.count("stream_started") == 1
    assert events.names.count("stream_finished") == 1


# --- the start-up burst -------------------------------------------------------------------

# configs/sim.yaml as it is: a vocoder at 80 / 9 = ~8.9 streams at 1x (K = 4 batched
# calls). Without the start-phase limit (admission.max_starting_streams=0) the 8 streams
# this admits all start at once and every one of them stalls (its ramp chunks queue
# behind the others'): that override makes this test fail. With it, the streams beyond
# the limit wait for a start slot (in arrival order) instead of being refused.
BURST_OVERRIDES = ("engine.recalibrate_idle_s=0",)
BURST = 40
LONG_TEXT = "Every word of this request is here to make a long answer for the burst. " * 3


def test_a_burst_at_start_up_admits_at_most_the_capacity() -> None:
    from pathlib import Path

    sim_yaml = Path(str(packaged_config())).parent / "sim.yaml"
    settings = load_settings(sim_yaml, BURST_OVERRIDES, environ={})
    with live_server(settings) as server:
        engine = server.app.state.playhead.engine
        capacity = engine.calibrated_capacity
        cap = engine.default_max_streams
        assert capacity > 0 and cap == math.floor(capacity)
        # the order reservations were made in, and the order the queued ones got their
        # start slots in (the engine's own futures, resolved on its event loop)
        reserved: list[object] = []
        granted: list[object] = []
        reserve = engine.reserve

        def recording_reserve():
            reservation = reserve()
            reserved.append(reservation)
            if reservation.queued:

                def done(future: asyncio.Future[None], reservation=reservation) -> None:
                    if not future.cancelled() and future.exception() is None:
                        granted.append(reservation)

                reservation._start.add_done_callback(done)
            return reservation

        engine.reserve = recording_reserve

        async def burst() -> list[tuple[int, dict[str, str], bytes, float]]:
            limits = httpx.Limits(max_connections=BURST + 5)
            async with httpx.AsyncClient(base_url=server.base_url, limits=limits) as client:

                async def one() -> tuple[int, dict[str, str], bytes, float]:
                    started = time.monotonic()
                    response = await client.post(
                        "/v1/audio/speech",
                        json={
                            "model": "tts-1",
                            "input": LONG_TEXT,
                            "voice": "sim",
                            "response_format": "pcm",
                        },
                        timeout=120,
                    )
                    answered_s = time.monotonic() - started
                    return (
                        response.status_code,
                        dict(response.headers),
                        response.content,
                        answered_s,
                    )

                return await asyncio.gather(*(one() for _ in range(BURST)))

        results = asyncio.run(burst())
        metrics = server.metrics()
        held = (engine._reserved, engine._reserved_starting, len(engine._start_queue))

    admitted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] != 200]
    # every admitted stream never interrupted (the server's 1x playback clock)
    assert metric_value(metrics, "playhead_stalls_total") == 0
    # the capacity admitted, more than the start limit: the others waited to start
    limit = settings.admission.max_starting_streams
    assert limit < len(admitted) <= cap
    assert len(granted) >= len(admitted) - limit
    # the queued ones got their start slots first come first served
    assert granted == [r for r in reserved if r in granted]
    assert all(status == 429 for status, *_ in refused)
    assert all(int(headers["retry-after"]) >= 1 for _, headers, _, _ in refused)
    # refused for the capacity, at once; none waited out the start queue
    assert metric_value(metrics, "playhead_admission_rejections_total", 'reason="starting"') == 0
    assert held == (0, 0, 0)
    # every admitted stream whole
    sizes = {len(body) for _, _, body, _ in admitted}
    assert len(sizes) == 1 and sizes.pop() > 0
    assert metric_value(metrics, "playhead_streams_total", 'state="done"') == len(admitted)
    slowest_refusal_ms = max(answered_s for *_, answered_s in refused) * 1000
    print(
        f"\ncalibrated capacity {capacity:.2f}; admitted {len(admitted)} of {BURST}; "
        f"slowest 429 answered in {slowest_refusal_ms:.0f} ms"
    )

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
    from pipeline.errors import Rejected

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
    with pytest.raises(Rejected) as caught:
        engine.submit("One too many.", voice="sim")
    assert caught.value.decision.reason == "starting"
    for stream in (*idle, newcomer):
        engine.cancel(stream.id)


async def test_streams_in_their_start_phase_are_limited(make_engine: EngineFactory) -> None:
    """At most max_starting_streams streams start at once; a stream stops counting once
    it has sent start_phase_chunks chunks (or ends)."""
    from pipeline.errors import Rejected

    engine = await make_engine(
        engine=CALIBRATE,
        admission=AdmissionConfig(
            max_streams=10, max_starting_streams=2, start_phase_chunks=2, start_retry_after_s=1
        ),
    )
    long_text = "A long sentence that keeps its stream busy for a while. " * 20
    first = [engine.submit(long_text, voice="sim") for _ in range(2)]
    with pytest.raises(Rejected) as caught:
        engine.submit(long_text, voice="sim")
    assert caught.value.decision.reason == "starting"
    assert caught.value.decision.retry_after_s == 1
    # a reservation counts as starting too
    engine.cancel(first[1].id)  # an ended stream leaves the start phase
    held = engine.reserve()
    with pytest.raises(Rejected):
        engine.reserve()
    held.release()

    async def read(stream):
        async for _ in stream.chunks():
            pass

    reader = asyncio.ensure_future(read(first[0]))
    try:
        await until(lambda: first[0].stats.chunks >= 2)
        assert engine.book.starting_streams() == 0
        more = [engine.submit(long_text, voice="sim") for _ in range(2)]
        with pytest.raises(Rejected):
            engine.submit(long_text, voice="sim")
    finally:
        reader.cancel()
    for stream in [first[0], *more]:
        engine.cancel(stream.id)


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
# behind the others'): that override makes this test fail.
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

    admitted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] != 200]
    # every admitted stream never interrupted (the server's 1x playback clock)
    assert metric_value(metrics, "playhead_stalls_total") == 0
    assert 1 <= len(admitted) <= min(cap, settings.admission.max_starting_streams)
    assert all(status == 429 for status, *_ in refused)
    assert all(int(headers["retry-after"]) >= 1 for _, headers, _, _ in refused)
    # the excess of a burst is refused for the start phase: a short Retry-After
    assert metric_value(metrics, "playhead_admission_rejections_total", 'reason="starting"') > 0
    assert {int(headers["retry-after"]) for _, headers, _, _ in refused} == {
        settings.admission.start_retry_after_s
    }
    # every admitted stream whole
    sizes = {len(body) for _, _, body, _ in admitted}
    assert len(sizes) == 1 and sizes.pop() > 0
    assert metric_value(metrics, "playhead_streams_total", 'state="done"') == len(admitted)
    slowest_refusal_ms = max(answered_s for *_, answered_s in refused) * 1000
    print(
        f"\ncalibrated capacity {capacity:.2f}; admitted {len(admitted)} of {BURST}; "
        f"slowest 429 answered in {slowest_refusal_ms:.0f} ms"
    )

"""Admission never admits blind: the capacity is calibrated before the engine is ready
(what the pipeline sustained, saturated, seeds the capacity model), recalibrated when
idle, and a burst of requests the moment /ready comes up is admitted up to what fits, the
next few queued in arrival order, every other one a 429 with Retry-After, and no
admitted stream stalls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import httpx
import pytest
from api_support import live_server, metric_value
from conftest import FAST_SIM, EngineFactory, read_all, until

from app.settings import load_settings
from configs import packaged_config
from pipeline.backends.sim import SimBackend
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
    stats = engine.stats()
    assert stats.capacity_audio_s_per_s == pytest.approx(engine.calibrated_capacity)
    # the pipeline's reading is its slower stage's; each is reported
    assert stats.talker_capacity_audio_s_per_s > 0 and stats.vocoder_capacity_audio_s_per_s > 0
    assert stats.capacity_audio_s_per_s == pytest.approx(
        min(stats.talker_capacity_audio_s_per_s, stats.vocoder_capacity_audio_s_per_s)
    )
    # each stage's rate from its calibration calls seeds its saturated reading
    assert engine.vocoder.rate.baseline > 0 and engine.talker.rate.baseline > 0
    assert engine.calibrated_capacity == pytest.approx(
        min(engine.vocoder.rate.baseline, engine.talker.rate.baseline), rel=0.2
    )
    # the calibration leaves nothing behind and reports nothing
    assert engine.in_flight == 0 and engine.book.stream_ids() == []
    await until(lambda: backend.open_segments == 0)
    assert events.names == []
    stream = engine.submit("Hello there.", voice="sim")
    await read_all(stream)
    assert events.names[0] == "stream_started" and events.names[-1] == "stream_finished"


async def test_without_calibration_the_capacity_is_unknown_until_measured(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine(engine=EngineConfig(calibration_calls=0))
    assert engine.calibrated_capacity == 0 and engine.capacity() == 0


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
    assert engine.book.vocoder.turns_running == 0 and len(engine.book) == 0


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
# calls). Its start cost (admission.start_cost=1) keeps the streams that start together
# within what the vocoder sustains: with 0.5, five start at once and their ramp chunks
# queue behind each other (a stall or two in each of three runs). The queue takes the
# next few, in arrival order; every other request gets its 429 at once.
BURST_OVERRIDES = ("engine.recalibrate_idle_s=0",)
BURST = 40
LONG_TEXT = "Every word of this request is here to make a long answer for the burst. " * 3


def test_a_burst_at_start_up_admits_what_fits_and_queues_in_order() -> None:
    from pathlib import Path

    sim_yaml = Path(str(packaged_config())).parent / "sim.yaml"
    settings = load_settings(sim_yaml, BURST_OVERRIDES, environ={})
    with live_server(settings) as server:
        engine = server.app.state.playhead.engine
        capacity = engine.calibrated_capacity
        assert capacity > 0
        # the order reservations were made in, and the order the queued ones were
        # granted in (the engine's own futures, resolved on its event loop)
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

                reservation._future.add_done_callback(done)
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
        held = (engine.admission.granted, engine.admission.waiting)

    admitted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] != 200]
    # every admitted stream never interrupted (the server's 1x playback clock)
    assert metric_value(metrics, "playhead_stalls_total") == 0
    assert 0 < len(admitted) < BURST
    # the queued ones were granted first come first served
    assert granted == [r for r in reserved if r in granted]
    assert all(status == 429 for status, *_ in refused)
    assert all(int(headers["retry-after"]) >= 1 for _, headers, _, _ in refused)
    assert held == (0, 0)
    # every admitted stream whole
    sizes = {len(body) for _, _, body, _ in admitted}
    assert len(sizes) == 1 and sizes.pop() > 0
    assert metric_value(metrics, "playhead_streams_total", 'state="done"') == len(admitted)
    slowest_refusal_ms = max(answered_s for *_, answered_s in refused) * 1000
    print(
        f"\ncalibrated capacity {capacity:.2f}; admitted {len(admitted)} of {BURST} "
        f"({len(granted)} after a wait); slowest 429 answered in {slowest_refusal_ms:.0f} ms"
    )

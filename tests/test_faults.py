"""Fault isolation: a model call that raises or hangs for one stream among several fails
that stream only; a hung call is cut by engine.call_timeout_s and reported; the loops go
on; and when a loop dies anyway, /ready turns 503.

A hang here is a call that waits on an event the test releases at the end, so that the
abandoned thread can finish.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import httpx
import numpy as np
import pytest
from api_support import (
    asgi_client,
    expected_audio_s,
    live_server,
    metric_value,
    parse_sse,
    sim_settings,
    speech_body,
)
from conftest import FAST_SIM, EngineFactory, read_all

from pipeline import StreamFailed, StreamState
from pipeline.backend import AbortHandle, TalkRequest, TalkStep, VocodeItem
from pipeline.backends.sim import SimBackend, SimSegment, decode_sim_signal, expected_frames
from pipeline.config import EngineConfig, SimConfig, TalkerConfig
from pipeline.events import NullEvents
from pipeline.executor import StageTimeout

TEXTS = [
    "The first stream talks about the weather for a while.",
    "The second stream is the one that gets stuck in its model call.",
    "The third stream reads a short list of groceries.",
    "The fourth stream says goodbye.",
]
SPEECH = "/v1/audio/speech"
TIMEOUT = EngineConfig(calibration_calls=0, call_timeout_s=0.3)


class HangingSim(SimBackend):
    """The sim backend, except that a talker step of a segment whose text has 'HANG', or a
    vocoder call with stream tag `hang_tag`, blocks until `release` is set."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.release = threading.Event()
        self.hang_tag = -1
        self.hang_segments: set[int] = set()
        self.hung = 0

    def open_segment(self, request: TalkRequest) -> SimSegment:
        segment = super().open_segment(request)
        if "HANG" in request.text:
            self.hang_segments.add(id(segment))
        return segment

    def step(self, segments: Sequence[SimSegment]) -> list[TalkStep]:
        if any(id(s) in self.hang_segments for s in segments):
            self.hung += 1
            self.release.wait(30)
        return super().step(segments)

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        if any(int(item.frames[0, 0]) == self.hang_tag for item in items):
            self.hung += 1
            self.release.wait(30)
        return super().vocode(items, abort)


class TimeoutRecorder(NullEvents):
    def __init__(self) -> None:
        self.timeouts: list[str] = []

    def stage_timeout(self, stage: str) -> None:
        self.timeouts.append(stage)


def check_whole(pcm: np.ndarray, text: str) -> None:
    pairs = decode_sim_signal(pcm, FAST_SIM.samples_per_frame)
    assert [index for _, index in pairs] == list(range(expected_frames(text)))


@pytest.mark.parametrize("stage", ["talker", "vocoder"])
async def test_a_hung_call_fails_its_stream_only_and_is_reported(
    make_engine: EngineFactory, stage: str
) -> None:
    backend = HangingSim(FAST_SIM)
    events = TimeoutRecorder()
    engine = await make_engine(
        backend,
        window=1,
        engine=TIMEOUT,
        talker=TalkerConfig(high_water_s=3600.0, batch=1, urgent_lane=False),
        events=events,
    )
    texts = list(TEXTS)
    if stage == "talker":
        texts[1] = "HANG " + texts[1]
    try:
        streams = [engine.submit(text, voice="sim") for text in texts]
        if stage == "vocoder":
            record = engine.book.record(streams[1].id)
            assert record is not None
            backend.hang_tag = record.tag
        results = await asyncio.gather(*(read_all(s) for s in streams), return_exceptions=True)
        assert isinstance(results[1], StreamFailed), results[1]
        assert isinstance(results[1].cause, StageTimeout)
        assert streams[1].state is StreamState.FAILED
        for index in (0, 2, 3):
            check_whole(results[index], texts[index])  # type: ignore[arg-type]
        assert backend.hung == 1
        assert events.timeouts == [stage]
        stage_executor = engine.talker_stage if stage == "talker" else engine.vocoder_stage
        assert stage_executor.abandoned == 1
        # the loops go on: a new stream is served on the stage's fresh thread
        assert engine.ready
        check_whole(await read_all(engine.submit(TEXTS[3], voice="sim")), TEXTS[3])
    finally:
        backend.release.set()


async def test_without_a_timeout_a_fast_call_is_unaffected(make_engine: EngineFactory) -> None:
    engine = await make_engine(engine=TIMEOUT)
    check_whole(await read_all(engine.submit(TEXTS[0], voice="sim")), TEXTS[0])
    assert engine.talker_stage.abandoned == engine.vocoder_stage.abandoned == 0


class RaisingSim(SimBackend):
    """Vocoding any chunk of a stream whose text had 'BOOM' raises (after its first)."""

    def __init__(self, config: SimConfig) -> None:
        super().__init__(config)
        self.bad_tags: set[int] = set()

    def open_segment(self, request: TalkRequest) -> SimSegment:
        if "BOOM" in request.text:
            self.bad_tags.add(request.stream_tag)
        return super().open_segment(request)

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        for item in items:
            if int(item.frames[0, 0]) in self.bad_tags and int(item.frames[0, 1]) > 0:
                raise RuntimeError("the vocoder blew up")
        return super().vocode(items, abort)


def test_over_http_a_failing_stream_ends_with_an_error_the_others_play() -> None:
    settings = sim_settings("scheduling.active_stream_window=1")
    factory = lambda: RaisingSim(settings.sim)  # noqa: E731
    long_text = "This stream is long enough to need several chunks of audio. " * 3
    with live_server(settings, backend_factory=factory) as server:

        async def three() -> list[object]:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:

                async def post(text: str, **fields: object) -> object:
                    try:
                        return await client.post(SPEECH, json=speech_body(text, **fields))
                    except httpx.HTTPError as exc:
                        return exc

                return await asyncio.gather(
                    post("BOOM " + long_text, stream_format="sse"),
                    post("BOOM " + long_text, response_format="pcm"),
                    post(long_text, response_format="pcm"),
                )

        bad_sse, bad_audio, good = asyncio.run(three())
        assert isinstance(bad_sse, httpx.Response) and bad_sse.status_code == 200
        events = parse_sse(bad_sse.content)
        assert events[0]["type"] == "speech.audio.delta"
        assert events[-1]["type"] == "error"
        assert events[-1]["error"]["code"] == "stream_failed"  # type: ignore[index]
        # the audio body is cut: the client sees an incomplete transfer, not a short file
        assert isinstance(bad_audio, httpx.RemoteProtocolError), bad_audio
        assert isinstance(good, httpx.Response) and good.status_code == 200
        assert len(good.content) == expected_audio_s(settings, long_text) * 24000 * 2
        assert httpx.get(f"{server.base_url}/ready").status_code == 200
        assert server.wait_metric("playhead_streams_total", lambda v: v == 2, 'state="failed"') == 2


async def test_ready_is_503_once_a_loop_dies() -> None:
    async with asgi_client(sim_settings()) as client:
        assert (await client.get("/ready")).status_code == 200
        engine = client.app.state.playhead.engine  # type: ignore[attr-defined]

        def broken() -> None:
            raise RuntimeError("a bug in the vocoder loop")

        engine.book.vocoder.refresh = broken  # the next vocoder turn dies
        engine.vocoder.wake.set()
        for _ in range(200):
            if not engine.ready:
                break
            await asyncio.sleep(0.01)
        response = await client.get("/ready")
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "engine_not_ready"
        metrics = (await client.get("/metrics")).text
        assert metric_value(metrics, "playhead_ready") == 0
        response = await client.post("/v1/audio/speech", json=speech_body("Hello."))
        assert response.status_code == 503

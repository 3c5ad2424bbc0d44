"""Helpers of the API tests: sim settings, an in-process client, a live uvicorn server,
and decoding of what came back."""

from __future__ import annotations

import asyncio
import io
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager

import av
import httpx
import numpy as np
import uvicorn

from app.audio_codecs import alaw_encode
from app.server import create_app
from app.settings import Settings, load_settings
from pipeline.backends.sim import SimBackend

# Fast sim costs: the talker runs at 50x real time (2 frames of 80 ms per 3.2 ms step for
# one stream) and a vocoder turn costs a few ms.
SIM_OVERRIDES = (
    "backend.kind=sim",
    "sim.talker_frames_per_step=2",
    "sim.talker_step_base_ms=2.4",
    "sim.talker_step_per_stream_ms=0.8",
    "sim.vocoder_base_ms=2",
    "sim.vocoder_per_frame_ms=0.2",
    "chunking.chunk_frames=8",
    "chunking.ramp=[2,4]",
    "chunking.left_context_frames=1",
    "chunking.right_context_frames=1",
    # no start-up calibration: tests that gate or count backend calls see only their own
    # (tests/test_calibration.py runs with it)
    "engine.calibration_calls=0",
    # no heap freeze after loading: its full collection costs ~0.3 s per app start in a
    # test process that also holds torch, transformers and ray, and hundreds of tests start
    # an app (tests/test_app_state.py runs with it, both ways)
    "server.freeze_heap_after_load=false",
)
# A talker at 4x real time for one stream (4 frames of 80 ms per 80 ms step): ~10 s of
# audio takes ~2.5 s, so a test can act while the stream is mid-way.
SLOW_TALKER = (
    "sim.talker_frames_per_step=4",
    "sim.talker_step_base_ms=60",
    "sim.talker_step_per_stream_ms=20",
)
DEMUXER = {"mp3": "mp3", "opus": "ogg", "aac": "aac", "flac": "flac", "wav": "wav"}


def sim_settings(*overrides: str) -> Settings:
    return load_settings(None, [*SIM_OVERRIDES, *overrides], environ={})


def expected_audio_s(settings: Settings, text: str, speed: float = 1.0) -> float:
    """What the sim backend produces for `text`: its frames times the frame duration."""
    frames = SimBackend.expected_frames(text.strip(), speed, settings.text)
    return frames * settings.sim.samples_per_frame / settings.sim.sample_rate_hz


def decode(data: bytes, fmt: str, rate_hz: int = 24000) -> tuple[np.ndarray, int]:
    """Decode a whole file with libavformat/libavcodec (pcm: raw s16le at `rate_hz`)."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0, rate_hz
    with av.open(io.BytesIO(data), format=DEMUXER[fmt]) as container:
        stream = container.streams.audio[0]
        planes = [frame.to_ndarray().reshape(-1) for frame in container.decode(stream)]
        rate_hz = stream.rate
    samples = np.concatenate(planes) if planes else np.zeros(0, np.float32)
    if samples.dtype == np.int16:
        samples = samples.astype(np.float32) / 32768.0
    return samples, rate_hz


def metric_value(text: str, name: str, labels: str = "") -> float:
    """One sample of Prometheus text, e.g. metric_value(body, "playhead_streams_total",
    'state="done"'); 0.0 when absent."""
    pattern = (
        rf"^{re.escape(name)}(\{{{re.escape(labels)}\}})? (\S+)$"
        if labels
        else rf"^{re.escape(name)} (\S+)$"
    )
    for line in text.splitlines():
        match = re.match(pattern, line)
        if match:
            return float(match.groups()[-1])
    return 0.0


@asynccontextmanager
async def asgi_client(
    settings: Settings, *, wait_ready: bool = True, **create_kwargs: object
) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on the app in this event loop, its lifespan running."""
    app = create_app(settings, **create_kwargs)  # type: ignore[arg-type]
    async with app.router.lifespan_context(app):
        if wait_ready:
            await asyncio.wait_for(app.state.playhead.wait_loaded(), 10)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://playhead") as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


class LiveServer:
    """uvicorn serving the app on a free loopback port, in a thread with its own loop."""

    def __init__(
        self, settings: Settings, *, send_buffer_bytes: int | None = None, **create_kwargs: object
    ) -> None:
        self.settings = settings
        self.app = create_app(settings, **create_kwargs)  # type: ignore[arg-type]
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if send_buffer_bytes is not None:
            # Accepted sockets inherit it; a fixed size turns off the kernel's autotuning
            # (up to 4 MiB here), as on a slow network path.
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="uvicorn", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        self.server.run(sockets=[self._sock])

    def start(self, timeout_s: float = 10.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.server.started:
                try:
                    if httpx.get(f"{self.base_url}/ready", timeout=1).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.02)
        raise TimeoutError("the live server did not become ready")

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def metrics(self) -> str:
        return httpx.get(f"{self.base_url}/metrics", timeout=5).text

    def wait_metric(
        self,
        name: str,
        predicate: Callable[[float], bool],
        labels: str = "",
        timeout_s: float = 5.0,
    ) -> float:
        """Polls /metrics until `predicate(value)` (the server is another thread: no event
        to wait on from here); returns the last value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = metric_value(self.metrics(), name, labels)
            if predicate(value) or time.monotonic() > deadline:
                return value
            time.sleep(0.02)


@contextmanager
def live_server(
    settings: Settings, *, send_buffer_bytes: int | None = None, **create_kwargs: object
) -> Iterator[LiveServer]:
    server = LiveServer(settings, send_buffer_bytes=send_buffer_bytes, **create_kwargs)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def engine_idle(server: LiveServer, timeout_s: float = 5.0) -> bool:
    """Whether the server's engine holds no stream (none active, none draining) within
    `timeout_s`."""
    engine = server.app.state.playhead.engine
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.active_streams + stats.draining_streams == 0:
            return True
        time.sleep(0.02)
    return False


def speech_body(text: str = "Hello there. This is a test.", **fields: object) -> dict[str, object]:
    return {"model": "tts-1", "input": text, "voice": "sim", **fields}


def parse_sse(data: bytes) -> list[dict[str, object]]:
    """The events of an SSE body; every event must be one `data:` line and a blank line."""
    text = data.decode()
    assert text.endswith("\n\n"), "an SSE body ends with a blank line"
    events = []
    for block in text[:-2].split("\n\n"):
        lines = block.split("\n")
        assert len(lines) == 1 and lines[0].startswith("data: "), block[:80]
        events.append(json.loads(lines[0][len("data: ") :]))
    return events


def request_bytes(
    body: bytes, port: int, path: str = "/v1/audio/speech", extra: Sequence[str] = ()
) -> bytes:
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *extra,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def alaw_decoded(data: bytes) -> np.ndarray:
    """Raw 8 kHz A-law decoded by ffmpeg's pcm_alaw decoder, as floats."""
    options = {"sample_rate": "8000", "ch_layout": "mono"}
    with av.open(io.BytesIO(data), format="alaw", options=options) as container:
        planes = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
    return np.concatenate(planes).astype(np.float32) / 32768.0


def assert_alaw_like_pcm(alaw: bytes, pcm: bytes, expected_s: float) -> None:
    """`alaw` (8 kHz) has the text's length and is the 8 kHz pcm of the same text in G.711
    A-law: the bytes of that pcm A-law encoded here, within one level, and, decoded by
    ffmpeg, within half a level's step of the pcm. The sim voice's audio of two requests
    differs only by its stream tag, by less than 16 of 32768, in one of the four blocks of
    each of its frames: the other three are the same bytes."""
    assert abs(len(alaw) / 8000 - expected_s) <= 0.01  # a byte a sample
    s16 = np.frombuffer(pcm, "<i2")
    got = np.frombuffer(alaw, np.uint8)
    assert got.size == s16.size
    here = np.frombuffer(alaw_encode(s16), np.uint8)
    level = lambda codes: (codes.astype(int) ^ 0x55) & 0x7F  # noqa: E731
    assert np.all(np.abs(level(got) - level(here)) <= 1)
    assert np.mean(got == here) > 0.7
    decoded = alaw_decoded(alaw) * 32768.0
    half_step = 8 << np.maximum((level(got) >> 4) - 1, 0)
    assert np.all(np.abs(decoded - s16) <= half_step + 16)

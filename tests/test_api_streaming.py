"""Streaming over a real uvicorn server on a loopback port (sim backend): every format
decodes whole and lasts what the sim predicts, SSE follows OpenAI's events, the official
SDK works, disconnects free the stream, a 429 is retried by the SDK, and a client that
stops reading does not slow the others.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from api_support import (
    SLOW_TALKER,
    LiveServer,
    decode,
    expected_audio_s,
    live_server,
    metric_value,
    parse_sse,
    request_bytes,
    sim_settings,
    speech_body,
)

from app.audio import EncoderError, StreamEncoder
from app.server import create_app
from app.streaming import ENCODER_THREAD_PREFIX
from pipeline.backend import AbortHandle, TalkRequest, VocodeItem
from pipeline.backends.sim import SimBackend, SimSegment, decode_sim_signal
from pipeline.config import TextConfig

SPEECH = "/v1/audio/speech"
TEXT = "Hello there. This is Playhead, streaming every format to you."
CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
# Decoded minus predicted duration, s: mp3 and aac decoders see the encoder's priming
# samples and last-frame padding (neither container can signal them); the rest are exact.
EXTRA_S_RANGE = {
    "mp3": (0.0, 0.1),
    "aac": (0.0, 0.1),
    "opus": (-0.002, 0.002),
    "flac": (-0.002, 0.002),
    "wav": (-0.002, 0.002),
    "pcm": (-0.002, 0.002),
}


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(sim_settings()) as live:
        yield live


def _post_stream(base_url: str, body: dict[str, object]) -> tuple[httpx.Response, bytes, int]:
    """(response, body bytes, number of body pieces received)."""
    with (
        httpx.Client(base_url=base_url, timeout=20) as client,
        client.stream("POST", SPEECH, json=body) as response,
    ):
        pieces = [piece for piece in response.iter_raw() if piece]
    return response, b"".join(pieces), len(pieces)


@pytest.mark.parametrize("fmt", list(CONTENT_TYPES))
def test_each_format_streams_chunked_and_decodes_whole(server: LiveServer, fmt: str) -> None:
    response, data, pieces = _post_stream(server.base_url, speech_body(TEXT, response_format=fmt))
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPES[fmt]
    assert response.headers["transfer-encoding"] == "chunked"
    assert "content-length" not in response.headers
    assert pieces > 1, "audio leaves chunk by chunk"
    samples, rate_hz = decode(data, fmt)
    assert rate_hz == (48000 if fmt == "opus" else 24000)  # libopus always decodes at 48 kHz
    extra_s = samples.size / rate_hz - expected_audio_s(server.settings, TEXT)
    low, high = EXTRA_S_RANGE[fmt]
    assert low <= extra_s <= high, (fmt, extra_s)


def test_pcm_carries_every_sim_frame_once_in_order(server: LiveServer) -> None:
    _, data, _ = _post_stream(server.base_url, speech_body(TEXT, response_format="pcm"))
    frames = decode_sim_signal(
        np.frombuffer(data, dtype="<i2"), server.settings.sim.samples_per_frame
    )
    assert [index for _, index in frames] == list(range(len(frames)))
    assert len({tag for tag, _ in frames}) == 1
    assert len(frames) == SimBackend.expected_frames(TEXT, 1.0, server.settings.text)


def test_the_served_engine_cuts_text_as_the_text_section_says() -> None:
    """`text:` reaches the served engine: cut into short segments, the text makes another
    number of sim frames than the default cut, and the stream carries that number."""
    text = "One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve."
    with live_server(sim_settings("text.max_segment_chars=20")) as live:
        _, data, _ = _post_stream(live.base_url, speech_body(text, response_format="pcm"))
        settings = live.settings
    frames = decode_sim_signal(np.frombuffer(data, dtype="<i2"), settings.sim.samples_per_frame)
    expected = SimBackend.expected_frames(text, 1.0, settings.text)  # 4 segments: 61 frames
    assert expected != SimBackend.expected_frames(text, 1.0, TextConfig())  # 1 segment: 62
    assert len(frames) == expected


@pytest.mark.parametrize(("fmt", "rate_hz"), [("wav", 16000), ("flac", 44100), ("mp3", 48000)])
def test_sample_rate_and_speed_shape_the_output(server: LiveServer, fmt: str, rate_hz: int) -> None:
    body = speech_body(TEXT, response_format=fmt, sample_rate=rate_hz, speed=2.0)
    _, data, _ = _post_stream(server.base_url, body)
    samples, decoded_rate_hz = decode(data, fmt)
    assert decoded_rate_hz == rate_hz
    extra_s = samples.size / rate_hz - expected_audio_s(server.settings, TEXT, speed=2.0)
    assert -0.002 <= extra_s <= 0.1


@pytest.mark.parametrize("fmt", ["mp3", "wav", "opus"])
def test_sse_events_follow_openai(server: LiveServer, fmt: str) -> None:
    body = speech_body(TEXT, response_format=fmt, stream_format="sse")
    response, data, _ = _post_stream(server.base_url, body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(data)
    *deltas, done = events
    assert deltas and all(set(e) == {"type", "audio"} for e in deltas)
    assert all(e["type"] == "speech.audio.delta" for e in deltas)
    audio = b"".join(base64.b64decode(str(e["audio"]), validate=True) for e in deltas)
    samples, rate_hz = decode(audio, fmt)
    extra_s = samples.size / rate_hz - expected_audio_s(server.settings, TEXT)
    assert EXTRA_S_RANGE[fmt][0] <= extra_s <= EXTRA_S_RANGE[fmt][1]
    assert done["type"] == "speech.audio.done" and set(done) == {"type", "usage"}
    usage = done["usage"]
    assert isinstance(usage, dict)
    assert set(usage) == {"input_tokens", "output_tokens", "total_tokens"}
    assert all(type(v) is int for v in usage.values())
    assert usage["input_tokens"] == len(TEXT)  # characters
    assert usage["output_tokens"] == SimBackend.expected_frames(TEXT, 1.0, server.settings.text)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_the_openai_sdk_streams_to_a_file(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    settings = sim_settings("server.api_key=sk-playhead")
    with live_server(settings) as live:
        client = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="sk-playhead", max_retries=0)
        target = tmp_path / "speech.mp3"
        with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=TEXT, response_format="mp3"
        ) as response:
            assert response.headers["content-type"] == "audio/mpeg"
            response.stream_to_file(target)
        samples, rate_hz = decode(target.read_bytes(), "mp3")
        extra_s = samples.size / rate_hz - expected_audio_s(settings, TEXT)
        assert 0.0 <= extra_s <= 0.1
        wrong = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as caught:
            wrong.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
        assert caught.value.code == "invalid_api_key"


# --- a backend whose talker waits for the test: a controllable fake beside the real sim ---


class GatedSimBackend(SimBackend):
    """The sim, except that a segment containing HOLD is talked only once `gate` is set,
    one containing FAIL raises once a first chunk was vocoded, one with BREAK at once."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gate = threading.Event()
        self.vocoded = threading.Event()

    def open_segment(self, request: TalkRequest) -> SimSegment:
        if "HOLD" in request.text:
            self.gate.wait(20)
        if "FAIL" in request.text:
            self.vocoded.wait(20)
            raise RuntimeError("the talker broke")
        if "BREAK" in request.text:
            raise RuntimeError("the talker broke at once")
        return super().open_segment(request)

    def vocode(
        self, items: Sequence[VocodeItem], abort: AbortHandle | None = None
    ) -> list[np.ndarray]:
        pcm = super().vocode(items, abort)
        self.vocoded.set()
        return pcm


def _gated_server(*overrides: str) -> tuple[LiveServer, GatedSimBackend]:
    settings = sim_settings(*overrides)
    backend = GatedSimBackend(settings.sim)
    live = LiveServer(settings, backend_factory=lambda: backend)
    live.start()
    return live, backend


def test_a_failure_after_the_first_byte_ends_the_stream() -> None:
    live, backend = _gated_server("text.first_fragment_words=0")
    try:
        text = "This first sentence is fine. FAIL comes next."
        body = speech_body(text, response_format="wav", stream_format="sse")
        response, data, _ = _post_stream(live.base_url, body)
        assert response.status_code == 200
        *deltas, last = parse_sse(data)
        assert deltas and all(e["type"] == "speech.audio.delta" for e in deltas)
        assert last["type"] == "error"
        error = last["error"]
        assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
        assert "the talker broke" in str(error["message"])
        # a raw audio body is cut (no last chunk), so a client cannot take it for whole
        backend.vocoded.clear()
        with pytest.raises(httpx.RemoteProtocolError):
            _post_stream(live.base_url, speech_body(text, response_format="wav"))
        assert live.wait_metric("playhead_streams_total", lambda v: v == 2, 'state="failed"') == 2
    finally:
        backend.gate.set()
        live.stop()


def test_a_failure_before_the_first_audio_is_a_500() -> None:
    live, _ = _gated_server()
    try:
        for stream_format in ("audio", "sse"):
            body = speech_body("BREAK.", stream_format=stream_format)
            response = httpx.post(f"{live.base_url}{SPEECH}", json=body)
            assert response.status_code == 500
            error = response.json()["error"]
            assert (error["type"], error["param"], error["code"]) == (
                "server_error",
                None,
                "stream_failed",
            )
            assert "the talker broke at once" in error["message"]
        assert live.wait_metric("playhead_streams_total", lambda v: v == 2, 'state="failed"') == 2
        assert metric_value(live.metrics(), "playhead_active_streams") == 0
    finally:
        live.stop()


def test_an_encoder_failure_after_the_first_byte_ends_the_stream(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    encode = StreamEncoder.encode
    calls: dict[int, int] = {}

    def encode_failing_second(self: StreamEncoder, pcm: np.ndarray) -> bytes:
        calls[id(self)] = calls.get(id(self), 0) + 1
        if calls[id(self)] == 2:
            raise EncoderError("the codec broke")
        return encode(self, pcm)

    monkeypatch.setattr(StreamEncoder, "encode", encode_failing_second)
    cancelled = metric_value(server.metrics(), "playhead_streams_total", 'state="cancelled"')
    body = speech_body(TEXT, response_format="wav", stream_format="sse")
    response, data, _ = _post_stream(server.base_url, body)
    assert response.status_code == 200
    first, last = parse_sse(data)
    assert first["type"] == "speech.audio.delta"
    assert last["type"] == "error"
    error = last["error"]
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("server_error", "encoding_failed")
    assert "the codec broke" in str(error["message"])
    # a raw audio body is cut (no last chunk), so a client cannot take it for whole
    with pytest.raises(httpx.RemoteProtocolError):
        _post_stream(server.base_url, speech_body(TEXT, response_format="wav"))
    assert server.wait_metric("playhead_active_streams", lambda v: v == 0) == 0
    assert (
        server.wait_metric(
            "playhead_streams_total", lambda v: v == cancelled + 2, 'state="cancelled"'
        )
        == cancelled + 2
    )


def test_long_chunks_of_a_codec_encode_in_the_encoders_own_threads(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    encode = StreamEncoder.encode
    threads: set[str] = set()

    def noting_thread(self: StreamEncoder, pcm: np.ndarray) -> bytes:
        threads.add(threading.current_thread().name)
        return encode(self, pcm)

    monkeypatch.setattr(StreamEncoder, "encode", noting_thread)
    # sim chunks are 8 frames of 80 ms: longer than inline_encode_max_s, so not inline
    response, _, _ = _post_stream(server.base_url, speech_body(TEXT, response_format="flac"))
    assert response.status_code == 200
    # not asyncio's default pool (its threads are asyncio_0, asyncio_1, ...)
    assert any(name.startswith(ENCODER_THREAD_PREFIX) for name in threads), threads
    assert not any(name.startswith("asyncio_") for name in threads), threads

    # pcm and wav have no codec: every chunk, however long, encodes on the event loop
    for response_format in ("pcm", "wav"):
        threads.clear()
        response, _, _ = _post_stream(
            server.base_url, speech_body(TEXT, response_format=response_format)
        )
        assert response.status_code == 200
        assert threads, response_format
        assert not any(name.startswith(ENCODER_THREAD_PREFIX) for name in threads), threads


def test_429_carries_retry_after_and_the_sdk_retry_succeeds() -> None:
    openai = pytest.importorskip("openai")
    # no queue (admission.queue_max_wait_s=0): every request beyond the slot is refused
    live, backend = _gated_server("admission.max_streams=1", "admission.queue_max_wait_s=0")
    try:
        holder = ThreadPoolExecutor(2)
        held = holder.submit(
            _post_stream, live.base_url, speech_body("HOLD.", response_format="pcm")
        )
        assert live.wait_metric("playhead_active_streams", lambda v: v == 1) == 1
        response = httpx.post(f"{live.base_url}{SPEECH}", json=speech_body("Ok."))
        assert response.status_code == 429
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"]["code"] == "rate_limit_exceeded"

        client = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="x", max_retries=3)

        def sdk_speech() -> bytes:
            return client.audio.speech.create(
                model="tts-1", voice="alloy", input=TEXT, response_format="wav"
            ).content

        started_s = time.monotonic()
        retried = holder.submit(sdk_speech)
        # the SDK's first try is refused; then the held stream is let go
        live.wait_metric(
            "playhead_admission_rejections_total", lambda v: v >= 2, 'reason="max_streams"'
        )
        backend.gate.set()
        assert held.result(10)[0].status_code == 200
        samples, rate_hz = decode(retried.result(10), "wav")
        assert abs(samples.size / rate_hz - expected_audio_s(live.settings, TEXT)) < 0.002
        assert time.monotonic() - started_s >= 0.9, "the SDK waited for Retry-After"
        holder.shutdown()
    finally:
        backend.gate.set()
        live.stop()


# --- disconnects and clients that stop reading ---


def _open_raw(
    live: LiveServer, body: dict[str, object], rcvbuf: int | None = None
) -> socket.socket:
    import json

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", live.port))
    sock.sendall(request_bytes(json.dumps(body).encode(), live.port))
    return sock


def _read_headers(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(4096)
        assert piece, "the server closed the connection"
        data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def test_a_disconnect_mid_stream_frees_the_stream() -> None:
    # a talker at 4x real time: ~10 s of audio takes ~2.5 s, so the stream is mid-way
    settings_overrides = (*SLOW_TALKER, "admission.enabled=false")
    with live_server(sim_settings(*settings_overrides)) as live:
        text = "A long sentence that keeps the talker busy for a while. " * 3
        sock = _open_raw(live, speech_body(text, response_format="pcm"))
        head, body = _read_headers(sock)
        assert head.startswith(b"HTTP/1.1 200")
        stream_id = next(
            line.split(b":", 1)[1].strip().decode()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"x-playhead-stream-id:")
        )
        while len(body) < 2000:
            body += sock.recv(4096)
        assert live.wait_metric("playhead_active_streams", lambda v: v == 1) == 1
        closed_s = time.monotonic()
        sock.close()
        assert live.wait_metric("playhead_active_streams", lambda v: v == 0) == 0
        freed_s = time.monotonic() - closed_s
        assert freed_s < 1.0
        assert (
            live.wait_metric("playhead_streams_total", lambda v: v == 1, 'state="cancelled"') == 1
        )
        assert metric_value(live.metrics(), "playhead_draining_streams") == 0
        engine = live.app.state.playhead.engine
        assert engine.traces(stream_id) == []
        assert metric_value(live.metrics(), "playhead_streams_total", 'state="done"') == 0


def test_a_disconnect_before_the_first_audio_frees_the_stream() -> None:
    live, backend = _gated_server()
    try:
        sock = _open_raw(live, speech_body("HOLD. Then more.", response_format="pcm"))
        assert live.wait_metric("playhead_active_streams", lambda v: v == 1) == 1
        sock.close()
        # the first chunk is still held: the stream goes with its client, not at the gate
        assert live.wait_metric("playhead_active_streams", lambda v: v == 0) == 0
        assert (
            live.wait_metric("playhead_streams_total", lambda v: v == 1, 'state="cancelled"') == 1
        )
        assert not backend.gate.is_set() and not backend.vocoded.is_set()
    finally:
        backend.gate.set()
        live.stop()


def test_first_bytes_leave_before_the_stream_is_done() -> None:
    with live_server(sim_settings(*SLOW_TALKER, "admission.enabled=false")) as live:
        text = "A long sentence that keeps the talker busy for a while. " * 2
        body = speech_body(text, response_format="mp3")
        first_s = None
        started_s = time.monotonic()
        with (
            httpx.Client(base_url=live.base_url, timeout=20) as client,
            client.stream("POST", SPEECH, json=body) as response,
        ):
            for piece in response.iter_raw():
                if piece and first_s is None:
                    first_s = time.monotonic() - started_s
        total_s = time.monotonic() - started_s
        assert first_s is not None
        # the first bytes leave while most of the stream is still to come (a server that
        # buffered the body would send its first byte near the end)
        assert total_s > 3 * first_s, (first_s, total_s)


def test_a_client_that_stops_reading_does_not_slow_the_others() -> None:
    overrides = ("engine.max_pending_audio_s=1.0", "admission.enabled=false")
    # Small socket buffers, so that a client that stops reading blocks the server's sends
    # after ~1.5 s of pcm instead of the megabytes loopback autotuning would hold.
    with live_server(sim_settings(*overrides), send_buffer_bytes=16384) as live:
        long_text = "This stream is never read by its client, sentence after sentence. " * 20
        stuck = _open_raw(live, speech_body(long_text, response_format="pcm"), rcvbuf=4096)
        try:
            assert live.wait_metric("playhead_parked_streams", lambda v: v == 1, timeout_s=10) == 1
            with ThreadPoolExecutor(4) as pool:
                body = speech_body(TEXT, response_format="pcm")
                results = list(pool.map(lambda _: _post_stream(live.base_url, body), range(4)))
            for response, data, _ in results:
                assert response.status_code == 200
                assert len(data) == round(expected_audio_s(live.settings, TEXT) * 24000) * 2
            metrics = live.metrics()
            assert metric_value(metrics, "playhead_streams_total", 'state="done"') == 4
            # A send blocked on the stuck socket would hold the others for seconds (or for
            # ever); allow only scheduling jitter from a busy CI machine (it measured one
            # stall of a few ms there).
            assert metric_value(metrics, "playhead_stall_seconds_total") < 0.1
            assert metric_value(metrics, "playhead_parked_streams") == 1
        finally:
            stuck.close()
        assert live.wait_metric("playhead_active_streams", lambda v: v == 0) == 0
        assert (
            live.wait_metric("playhead_streams_total", lambda v: v == 1, 'state="cancelled"') == 1
        )


async def _call_asgi(app: object, body: bytes, on_first_body: object) -> list[dict[str, object]]:
    """One POST /v1/audio/speech straight through the ASGI interface, in this loop; the
    client never goes away. Returns the messages the app sent."""
    messages: list[dict[str, object]] = []
    request_sent = False
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": SPEECH,
        "raw_path": SPEECH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }

    async def receive() -> dict[str, object]:
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect
        raise AssertionError("unreachable")

    async def send(message: dict[str, object]) -> None:
        messages.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            await on_first_body()  # type: ignore[operator]

    await app(scope, receive, send)  # type: ignore[operator]
    return messages


@pytest.mark.parametrize("stream_format", ["sse", "audio"])
async def test_an_engine_stop_mid_stream_is_not_a_whole_file(stream_format: str) -> None:
    settings = sim_settings(*SLOW_TALKER, "admission.enabled=false")
    app = create_app(settings)
    text = "A long sentence that keeps the talker busy for a while. " * 3
    body = json.dumps(speech_body(text, response_format="wav", stream_format=stream_format))
    async with app.router.lifespan_context(app):
        state = app.state.playhead
        await asyncio.wait_for(state.wait_loaded(), 5)
        stopped = False

        async def stop_engine_once() -> None:
            nonlocal stopped
            if not stopped:
                stopped = True
                await state.engine.stop()

        messages = await asyncio.wait_for(_call_asgi(app, body.encode(), stop_engine_once), 10)
    assert messages[0]["type"] == "http.response.start" and messages[0]["status"] == 200
    bodies = [m for m in messages if m["type"] == "http.response.body"]
    if stream_format == "sse":
        events = parse_sse(b"".join(bytes(m["body"]) for m in bodies))  # type: ignore[arg-type]
        assert events[0]["type"] == "speech.audio.delta"
        assert events[-1]["type"] == "error"
        assert "shutting down" in str(events[-1]["error"]["message"])  # type: ignore[index]
        assert bodies[-1]["more_body"] is False
    else:
        assert all(m["more_body"] is True for m in bodies), "no end of body: the file is cut"

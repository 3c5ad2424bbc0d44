"""The Wyoming server's protocol mechanics on the sim backend: the app runs in this event
loop (its lifespan opens the Wyoming port), the client is the wyoming package's own.

describe -> info; a one-shot synthesize and a streamed one (chunks, Home Assistant's
copy of the text as a plain synthesize, stop) give the text's audio exactly once; a
streamed request speaks once a sentence is complete, before its stop; every refusal is an
error event followed by the close; a client that leaves cancels its stream; admission
refuses with when to retry; the settings and the command line flag.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import pytest
import pytest_asyncio
from api_support import SLOW_TALKER, expected_audio_s, metric_value, sim_settings, speech_body
from conftest import until
from fastapi import FastAPI
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)
from wyoming_support import frame, free_port, raw_exchange, read_reply, read_until_closed

from app.cli import _load, _parser
from app.server import create_app
from app.settings import Settings, SettingsError, load_settings
from app.state import AppState, BackendFactory
from app.wyoming.server import WyomingServer
from pipeline import Engine
from pipeline.backends.sim import SimBackend

TEXT = "The first sentence is here. And a second one follows it."


@dataclass
class Served:
    app: FastAPI
    port: int
    state: AppState
    settings: Settings

    @property
    def engine(self) -> Engine:
        assert self.state.engine is not None
        return self.state.engine

    @property
    def wyoming(self) -> WyomingServer:
        (server,) = (s for s in self.state.services if isinstance(s, WyomingServer))
        return server

    def client(self) -> AsyncTcpClient:
        return AsyncTcpClient("127.0.0.1", self.port)


@asynccontextmanager
async def serve(
    *overrides: str, backend_factory: BackendFactory | None = None, wait_loaded: bool = True
) -> AsyncIterator[Served]:
    port = free_port()
    settings = sim_settings("wyoming.enabled=true", f"wyoming.port={port}", *overrides)
    app = create_app(settings, backend_factory=backend_factory)
    state: AppState = app.state.playhead
    async with app.router.lifespan_context(app):
        if wait_loaded:
            await asyncio.wait_for(state.wait_loaded(), 10)
        yield Served(app, port, state, settings)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with serve() as s:
        yield s


async def test_describe_lists_the_voices_and_streaming(served: Served) -> None:
    async with served.client() as client:
        await client.write_event(Describe().event())
        event = await asyncio.wait_for(client.read_event(), 5)
    assert event is not None and Info.is_type(event.type)
    (program,) = Info.from_event(event).tts
    assert program.name == "playhead" and program.installed
    assert program.supports_synthesize_streaming is True
    assert [(v.name, v.languages, v.installed) for v in program.voices] == [("sim", ["en"], True)]


async def test_one_shot_synthesize_gives_the_texts_audio(served: Served) -> None:
    async with served.client() as client:
        await client.write_event(Synthesize(text=TEXT).event())
        reply = await read_reply(client, streamed=False)
        # the connection serves another request after it
        await client.write_event(Ping(text="still there").event())
        pong = await asyncio.wait_for(client.read_event(), 5)
    assert reply.types[0] == "audio-start" and reply.types[-1] == "audio-stop"
    assert set(reply.types[1:-1]) == {"audio-chunk"}
    start = reply.start
    assert (start.rate, start.width, start.channels) == (24000, 2, 1)
    assert reply.audio_s == pytest.approx(expected_audio_s(served.settings, TEXT), abs=1e-6)
    # chunk timestamps are the audio position in ms
    stamps = [chunk.timestamp for chunk in reply.chunks]
    assert stamps[0] == 0 and stamps == sorted(stamps)
    assert pong is not None and Pong.from_event(pong).text == "still there"


async def test_streamed_text_is_spoken_once_starting_before_the_stop(served: Served) -> None:
    one_sentence = "The first sentence is here. "
    async with served.client() as client:
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk(text="The first sentence").event())
        # an unfinished sentence: nothing is said yet
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(client.read_event(), 0.5)
        await client.write_event(SynthesizeChunk(text=" is here. ").event())
        # the sentence is complete: its audio comes while the rest is not written yet
        first = await asyncio.wait_for(client.read_event(), 5)
        assert first is not None and first.type == "audio-start"
        for piece in ("And a second ", "one follows it."):
            await client.write_event(SynthesizeChunk(text=piece).event())
        # Home Assistant sends the whole text again, for servers without streaming
        await client.write_event(Synthesize(text=TEXT).event())
        await client.write_event(SynthesizeStop().event())
        reply = await read_reply(client, streamed=True)
        # and nothing after it: the copy is not spoken later either
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(client.read_event(), 0.5)
    assert reply.types[-2:] == ["audio-stop", "synthesize-stopped"]
    assert served.engine.in_flight == 0
    assert "audio-start" not in reply.types  # one audio stream for the whole request
    heard_s = sum(c.samples for c in reply.chunks) / 24000
    # the text once: the first sentence and the rest (the copy would double it)
    expected_s = expected_audio_s(served.settings, TEXT)
    assert heard_s == pytest.approx(expected_s, rel=0.15)
    assert heard_s > expected_audio_s(served.settings, one_sentence)


async def test_a_streamed_request_may_arrive_all_at_once(served: Served) -> None:
    async with served.client() as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="sim")).event())
        await client.write_event(SynthesizeChunk(text=TEXT).event())
        await client.write_event(Synthesize(text=TEXT).event())
        await client.write_event(SynthesizeStop().event())
        reply = await read_reply(client, streamed=True)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(client.read_event(), 0.5)
    assert reply.types[0] == "audio-start" and reply.types[-1] == "synthesize-stopped"
    assert reply.audio_s == pytest.approx(expected_audio_s(served.settings, TEXT), rel=0.15)


async def test_voice_by_language_and_unknown_events_ignored(served: Served) -> None:
    async with served.client() as client:
        await client.write_event(Event(type="transcribe", data={"language": "en"}))
        voice = SynthesizeVoice(language="en-GB")  # the main language matches "en"
        await client.write_event(Synthesize(text="Hello there.", voice=voice).event())
        reply = await read_reply(client, streamed=False)
    assert reply.types[0] == "audio-start" and reply.audio_s > 0


# Each refusal: one error event with its code, then the server closes the connection.
REFUSALS = [
    (frame("synthesize", {"text": "Hi.", "voice": {"name": "nope"}}), "voice_not_found"),
    (frame("synthesize", {"text": "Hi.", "voice": {"language": "de"}}), "language_not_supported"),
    (
        frame("synthesize", {"text": "Hi.", "voice": {"name": "sim", "speaker": "2"}}),
        "speaker_not_found",
    ),
    (frame("synthesize", {"text": "Hi.", "voice": "sim"}), "invalid_value"),
    (frame("synthesize", {"text": "   "}), "empty_text"),
    (frame("synthesize", {"text": 42}), "invalid_value"),
    (frame("synthesize", {"text": "a\x00b"}), "invalid_value"),
    (frame("synthesize", {"text": "😀 !!"}), "nothing_to_speak"),
    (frame("synthesize", {"text": "x" * 20000}), "text_too_long"),
    (
        frame("synthesize", {"text": "<speak>Hi</speak>", "text_format": "ssml"}),
        "unsupported_text_format",
    ),
    (frame("synthesize-chunk", {"text": "Hi."}), "no_synthesis"),
    (frame("synthesize-stop"), "no_synthesis"),
    (frame("synthesize-start") + frame("synthesize-start"), "synthesis_open"),
    (frame("synthesize-start") + frame("synthesize-stop"), "nothing_to_speak"),
    (frame("select-program", {"name": "piper"}), "program_not_found"),
    (b"this is not json\n", "invalid_json"),
    (b'{"type": "synthesize", "data": {"text": "\\ud800"}}\n', "invalid_unicode"),
    (b"[1, 2]\n", "invalid_event"),
    (b'{"data": {}}\n', "invalid_event"),
    (b'{"type": "synthesize", "data_length": -1}\n', "invalid_event"),
    (b'{"type": "synthesize", "data_length": 99999999}\n', "event_too_large"),
    (b'{"type": "synthesize", "payload_length": 99999999}\n', "event_too_large"),
    (b'{"type": "synthesize", "data_length": 5}\n[1,2]', "invalid_event"),
    (b'{"type": "describe"' + b" " * 70000 + b"}\n", "event_too_large"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def refusing() -> AsyncIterator[Served]:
    """One server for every refusal (each on its own connection)."""
    async with serve() as s:
        yield s


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("data", "code"), REFUSALS, ids=[c for _, c in REFUSALS])
async def test_bad_input_gets_an_error_event_then_the_close(
    refusing: Served, data: bytes, code: str
) -> None:
    reply = await raw_exchange(refusing.port, data)
    assert reply.closed
    assert reply.types == ["error"], reply.types
    error = reply.error
    assert error is not None and error.code == code and error.text
    assert refusing.engine.in_flight == 0


async def test_the_line_and_payload_limits_are_the_settings() -> None:
    async with serve("wyoming.max_line_bytes=2048", "wyoming.max_payload_bytes=16") as served:
        reply = await raw_exchange(served.port, b'{"type": "describe"' + b" " * 3000 + b"}\n")
        assert reply.error is not None and reply.error.code == "event_too_large"
        assert "2048 bytes (wyoming.max_line_bytes)" in reply.error.text
        reply = await raw_exchange(served.port, b'{"type": "ping", "payload_length": 17}\n')
        assert reply.error is not None and reply.error.code == "event_too_large"
        assert "at most 16 are accepted (wyoming.max_payload_bytes" in reply.error.text
        async with served.client() as client:  # a payload within the limit is skipped
            await client.write_event(Event(type="ping", data={}, payload=b"x" * 16))
            pong = await asyncio.wait_for(client.read_event(), 5)
        assert pong is not None and pong.type == "pong"


async def test_a_chunked_text_over_the_limit_is_refused() -> None:
    async with serve("wyoming.max_text_chars=40") as served:
        async with served.client() as client:
            await client.write_event(SynthesizeStart().event())
            for _ in range(3):
                await client.write_event(SynthesizeChunk(text="Fifteen chars. ").event())
            reply = await read_until_closed(client)
        assert reply.error is not None and reply.error.code == "text_too_long"
        await until(lambda: served.engine.in_flight == 0)


async def test_a_client_that_leaves_mid_synthesis_cancels_its_stream() -> None:
    async with serve(*SLOW_TALKER) as served:
        engine = served.engine
        async with served.client() as client:
            await client.write_event(Synthesize(text=TEXT * 30).event())
            first = await asyncio.wait_for(client.read_event(), 10)
            assert first is not None and first.type == "audio-start"
            (stream_id,) = engine.book.stream_ids()
            assert engine.traces(stream_id)
        # gone: the stream (tens of seconds of audio still to make) is freed at once
        await until(lambda: engine.in_flight == 0 and engine.traces(stream_id) == [], 2.0)
        await until(lambda: served.wyoming.connections == 0, 2.0)


async def test_a_client_that_leaves_during_a_streamed_request_cancels_it(served: Served) -> None:
    engine = served.engine
    async with served.client() as client:
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk(text="A sentence that is said. And ").event())
        first = await asyncio.wait_for(client.read_event(), 5)
        assert first is not None and first.type == "audio-start"
        (stream_id,) = engine.book.stream_ids()
        # the first sentence said, the stream waits for more text: nothing is written to
        # the connection, so only its close can tell that the client left
        with contextlib.suppress(TimeoutError):
            while True:
                await asyncio.wait_for(client.read_event(), 0.5)
        assert engine.in_flight == 1 and served.wyoming.connections == 1
    await until(lambda: engine.in_flight == 0 and engine.traces(stream_id) == [], 2.0)
    await until(lambda: served.wyoming.connections == 0, 2.0)


async def test_admission_refusal_says_when_to_retry() -> None:
    async with serve(*SLOW_TALKER, "admission.max_streams=1") as served:
        async with served.client() as busy, served.client() as refused:
            await busy.write_event(Synthesize(text=TEXT * 10).event())
            first = await asyncio.wait_for(busy.read_event(), 10)
            assert first is not None and first.type == "audio-start"
            await refused.write_event(Synthesize(text=TEXT).event())
            reply = await read_until_closed(refused)
        assert reply.types == ["error"]
        assert reply.error is not None and reply.error.code == "rate_limit_exceeded"
        assert "retry after" in reply.error.text.lower()


async def test_an_idle_connection_is_closed_with_an_error() -> None:
    async with serve("wyoming.idle_timeout_s=0.3") as served:
        async with served.client() as client:
            reply = await read_until_closed(client, timeout_s=5)
        assert reply.error is not None and reply.error.code == "idle_timeout"


async def test_shutdown_closes_the_connections_and_the_port() -> None:
    async with serve(*SLOW_TALKER) as served:
        client = served.client()
        await client.connect()
        await client.write_event(Synthesize(text=TEXT * 10).event())
        first = await asyncio.wait_for(client.read_event(), 10)
        assert first is not None and first.type == "audio-start"
        engine = served.engine
        port = served.port
    # the lifespan ended: the connection was closed, its stream cancelled, the port closed
    reply = await read_until_closed(client)
    assert reply.closed
    await client.disconnect()
    assert engine.in_flight == 0
    with pytest.raises(ConnectionRefusedError):  # no longer listening
        await asyncio.open_connection("127.0.0.1", port)


async def test_a_wyoming_port_in_use_fails_the_startup() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = create_app(sim_settings("wyoming.enabled=true", f"wyoming.port={port}"))
        with pytest.raises(RuntimeError, match=f"cannot listen for Wyoming on 127.0.0.1:{port}"):
            async with app.router.lifespan_context(app):
                pass


def test_the_wyoming_section_and_the_command_line_flag(tmp_path) -> None:
    defaults = load_settings(None, environ={}).wyoming
    assert (defaults.enabled, defaults.host, defaults.port) == (False, "127.0.0.1", 10200)
    args = _parser().parse_args(["serve", "--wyoming-port", "10205"])
    settings, _ = _load(args)
    assert settings.wyoming.enabled and settings.wyoming.port == 10205
    path = tmp_path / "bad.yaml"
    for body, field in [
        ("port: 0", "wyoming.port"),
        ("enabled: yes please", "wyoming.enabled"),
        ("idle_timeout_s: 0", "wyoming.idle_timeout_s"),
        ("max_text_chars: 0", "wyoming.max_text_chars"),
        ("host: ''", "wyoming.host"),
        ("max_line_bytes: 100", "wyoming.max_line_bytes"),
        ("max_payload_bytes: -1", "wyoming.max_payload_bytes"),
    ]:
        path.write_text(f"wyoming:\n  {body}\n")
        with pytest.raises(SettingsError, match=f"^{path}: {field}: "):
            load_settings(path, environ={})


async def test_connections_are_served_once_the_model_loaded() -> None:
    release = threading.Event()

    def slow_factory() -> SimBackend:  # runs in a worker thread
        assert release.wait(10)
        return SimBackend(sim_settings().sim)

    async with serve(backend_factory=slow_factory, wait_loaded=False) as served:
        # the port is taken (bound) but not listening while the model loads
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", served.port)
        release.set()
        await asyncio.wait_for(served.state.wait_loaded(), 10)
        await until(lambda: served.wyoming.listening)
        async with served.client() as client:
            await client.write_event(Describe().event())
            event = await asyncio.wait_for(client.read_event(), 5)
        assert event is not None and Info.is_type(event.type)
        assert Info.from_event(event).tts[0].voices[0].name == "sim"


async def test_a_model_that_failed_to_load_is_an_error_event() -> None:
    def failing_factory() -> SimBackend:
        raise OSError("no such voice file")

    async with serve(backend_factory=failing_factory) as served:
        reply = await raw_exchange(served.port, frame("describe"))
    assert reply.types == ["error"]
    assert reply.error is not None and reply.error.code == "model_load_failed"
    assert "no such voice file" in reply.error.text


async def test_a_draining_server_refuses_new_syntheses_and_ends_those_in_flight() -> None:
    async with serve(*SLOW_TALKER) as served:
        async with served.client() as client:
            await client.write_event(Synthesize(text=TEXT * 10).event())
            first = await asyncio.wait_for(client.read_event(), 10)
            assert first is not None and first.type == "audio-start"
            await served.state.drain(0.0)  # SIGTERM with no grace left: streams cancelled
            in_flight = await read_until_closed(client)
        assert in_flight.error is not None and in_flight.error.code == "shutting_down"
        assert "audio-stop" not in in_flight.types  # cut, not passed off as complete
        reply = await raw_exchange(served.port, frame("synthesize", {"text": "Hello."}))
        assert reply.types == ["error"]
        assert reply.error is not None and reply.error.code == "shutting_down"
        assert "retry" in reply.error.text.lower()


async def test_a_client_that_stops_reading_is_dropped_and_its_stream_freed() -> None:
    async with serve("wyoming.idle_timeout_s=0.5") as served:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", served.port))
        _, writer = await asyncio.open_connection(sock=sock)
        try:
            # minutes of audio, more than the sockets' buffers hold; nothing is read
            writer.write(frame("synthesize", {"text": TEXT * 60}))
            await until(lambda: served.engine.in_flight == 1)
            await until(lambda: served.engine.in_flight == 0, 15.0)
            await until(lambda: served.wyoming.connections == 0)
        finally:
            writer.close()


async def test_one_engine_for_http_and_wyoming() -> None:
    async with serve(*SLOW_TALKER, "admission.max_streams=1") as served:
        app_transport = httpx.ASGITransport(app=served.app)
        async with (
            served.client() as client,
            httpx.AsyncClient(transport=app_transport, base_url="http://playhead") as http,
        ):
            await client.write_event(Synthesize(text=TEXT * 10).event())
            first = await asyncio.wait_for(client.read_event(), 10)
            assert first is not None and first.type == "audio-start"
            # the Wyoming stream holds the one slot: HTTP is refused by the same admission
            refused = await http.post("/v1/audio/speech", json=speech_body())
            assert refused.status_code == 429
            metrics = (await http.get("/metrics")).text
            assert metric_value(metrics, "playhead_active_streams") == 1
            assert metric_value(metrics, "playhead_streams_started_total") == 1

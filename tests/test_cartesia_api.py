"""Cartesia's API (app/cartesia/) over a live uvicorn server on the sim backend, called by
the official `cartesia` SDK where it can speak (bytes, sse, websocket contexts, voices)
and by a bare socket or httpx where the test needs what the SDK hides (status codes,
headers, close codes, messages the SDK never sends)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct
import time
from collections.abc import Iterator
from typing import Any

import av
import cartesia
import httpx
import numpy as np
import pytest
import websockets
from api_support import (
    SLOW_TALKER,
    LiveServer,
    assert_alaw_like_pcm,
    expected_audio_s,
    live_server,
    metric_value,
    sim_settings,
)

KEY = "test-key"
TEXT = "Hello there. This is a test of the Cartesia API."
VERSION = "2025-04-16"
CARTESIA_UUID = "a0e99841-438c-4a64-b679-ae501e7d6091"
RAW = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
BYTES_PER_SAMPLE = {"pcm_s16le": 2, "pcm_f32le": 4, "pcm_mulaw": 1, "pcm_alaw": 1}


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    # admission off here: its refusals have a server of their own below
    settings = sim_settings(f"server.api_key={KEY}", "admission.enabled=false")
    with live_server(settings) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[cartesia.Cartesia]:
    with cartesia.Cartesia(base_url=server.base_url, api_key=KEY, max_retries=0) as sdk:
        yield sdk


def engine_streams(server: LiveServer) -> int:
    stats = server.app.state.playhead.engine.stats()
    return stats.active_streams + stats.draining_streams


def wait_idle(server: LiveServer, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while engine_streams(server) and time.monotonic() < deadline:
        time.sleep(0.02)
    return engine_streams(server)


@pytest.fixture(autouse=True)
def idle_engine(server: LiveServer) -> Iterator[None]:
    assert wait_idle(server) == 0
    yield
    assert wait_idle(server) == 0, "a test left an engine stream behind"


def sim_seconds(server: LiveServer, text: str = TEXT) -> float:
    return expected_audio_s(server.settings, text)


def ws_url(server: LiveServer, query: str = f"api_key={KEY}&cartesia_version={VERSION}") -> str:
    return server.base_url.replace("http", "ws") + "/tts/websocket?" + query


def request(context_id: str, transcript: str | None, **fields: Any) -> str:
    message = {
        "model_id": "sonic-2",
        "voice": {"mode": "id", "id": CARTESIA_UUID},
        "output_format": RAW,
        "context_id": context_id,
        "transcript": transcript,
        **fields,
    }
    return json.dumps(message)


async def receive_until_done(socket: Any, context_id: str, timeout_s: float = 20.0) -> list[dict]:
    messages: list[dict] = []
    async with asyncio.timeout(timeout_s):
        while True:
            message = json.loads(await socket.recv())
            assert "type" in message and "context_id" in message, message
            if message["context_id"] == context_id:
                messages.append(message)
                if message["type"] in ("done", "error"):
                    return messages


def audio_of(messages: list[dict]) -> bytes:
    return b"".join(base64.b64decode(m["data"]) for m in messages if m["type"] == "chunk")


# HTTP: /tts/bytes and /tts/sse through the SDK -------------------------------------------


@pytest.mark.filterwarnings("ignore:bytes\\(\\) is deprecated")
@pytest.mark.parametrize("encoding", ["pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw"])
@pytest.mark.parametrize("rate_hz", [8000, 24000, 44100])
def test_bytes_raw_encodings_and_rates(
    server: LiveServer, client: cartesia.Cartesia, encoding: str, rate_hz: int
) -> None:
    fmt = {"container": "raw", "encoding": encoding, "sample_rate": rate_hz}
    voice = {"mode": "id", "id": CARTESIA_UUID}
    pieces = client.tts.bytes(model_id="sonic-2", transcript=TEXT, voice=voice, output_format=fmt)  # type: ignore[arg-type]
    data = b"".join(pieces)
    seconds = len(data) / BYTES_PER_SAMPLE[encoding] / rate_hz
    assert seconds == pytest.approx(sim_seconds(server), abs=0.01)
    if encoding == "pcm_f32le":
        samples = np.frombuffer(data, "<f4")
        assert np.all(np.abs(samples) <= 1.0) and np.any(samples != 0)


@pytest.mark.parametrize(("encoding", "tag", "bits"), [
    ("pcm_s16le", 1, 16), ("pcm_f32le", 3, 32), ("pcm_mulaw", 7, 8), ("pcm_alaw", 6, 8),
])  # fmt: skip
def test_bytes_wav_containers_decode(
    server: LiveServer, client: cartesia.Cartesia, encoding: str, tag: int, bits: int
) -> None:
    fmt = {"container": "wav", "encoding": encoding, "sample_rate": 16000}
    response = client.tts.generate(
        model_id="sonic-3",
        transcript=TEXT,
        voice="sim",
        output_format=fmt,  # type: ignore[arg-type]
    )
    assert response.headers["content-type"] == "audio/wav"
    data = response.read()
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    assert struct.unpack("<HHI", data[20:28]) == (tag, 1, 16000)
    assert struct.unpack("<H", data[34:36]) == (bits,)
    with av.open(io.BytesIO(data), format="wav") as container:
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    assert decoded.size / 16000 == pytest.approx(sim_seconds(server), abs=0.01)


def test_raw_alaw_is_the_s16_audio_in_g711_a_law(server: LiveServer) -> None:
    """pcm_alaw, raw: audio/PCMA, the pcm_s16le the same text gives in G.711 A-law."""
    s16 = post(server, {**GOOD, "output_format": {**RAW, "sample_rate": 8000}})
    fmt = {**RAW, "encoding": "pcm_alaw", "sample_rate": 8000}
    alaw = post(server, {**GOOD, "output_format": fmt})
    assert alaw.status_code == 200 and alaw.headers["content-type"] == "audio/PCMA"
    assert_alaw_like_pcm(alaw.content, s16.content, sim_seconds(server))


def test_bytes_mp3_at_its_bit_rate(server: LiveServer, client: cartesia.Cartesia) -> None:
    fmt = {"container": "mp3", "sample_rate": 22050, "bit_rate": 32000}
    response = client.tts.generate(
        model_id="sonic-3",
        transcript=TEXT,
        voice="sim",
        output_format=fmt,  # type: ignore[arg-type]
    )
    assert response.headers["content-type"] == "audio/mpeg"
    data = response.read()
    with av.open(io.BytesIO(data), format="mp3") as container:
        stream = container.streams.audio[0]
        assert stream.rate == 22050 and stream.bit_rate == 32000
        decoded = sum(f.samples for f in container.decode(stream))
    # mp3 adds the encoder's priming and the last frame's padding (app/audio.py)
    assert decoded / 22050 == pytest.approx(sim_seconds(server), abs=0.12)


def test_sse_events_carry_the_audio_and_end_with_done(
    server: LiveServer, client: cartesia.Cartesia
) -> None:
    events = list(
        client.tts.sse(model_id="sonic-2", transcript=TEXT, voice={"mode": "id", "id": "sim"},
                       output_format=RAW, context_id="sse-1", add_timestamps=True)  # type: ignore[arg-type]
    )  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[-1] == "done" and kinds.count("done") == 1
    assert set(kinds) <= {"chunk", "timestamps", "done"}
    assert all(e.context_id == "sse-1" for e in events)
    audio = b"".join(e.audio or b"" for e in events if e.type == "chunk")
    assert len(audio) / 2 / 24000 == pytest.approx(sim_seconds(server), abs=0.01)


# HTTP errors in Cartesia's shape -------------------------------------------------------


def post(
    server: LiveServer, body: object, path: str = "/tts/bytes", **headers: str
) -> httpx.Response:
    sent = {"X-API-Key": KEY, "Cartesia-Version": VERSION, **headers}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.base_url + path, content=content, headers=sent, timeout=10)


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text[:300]
    body = response.json()
    assert set(body) == {"error_code", "title", "message", "request_id"}, body
    assert body["error_code"] == code, body
    return body


GOOD = {"model_id": "sonic-2", "transcript": TEXT, "voice": "sim", "output_format": RAW}


@pytest.mark.parametrize(("body", "status", "code"), [
    (b"{not json", 400, "invalid_json"),
    ([1, 2], 400, "invalid_request"),
    ({**GOOD, "transcript": None}, 400, "missing_field"),
    ({**GOOD, "transcript": "   "}, 400, "empty_transcript"),
    ({**GOOD, "transcript": "x" * 5000}, 400, "transcript_too_long"),
    ({**GOOD, "transcript": "!!! ..."}, 400, "nothing_to_speak"),
    ({**GOOD, "output_format": None}, 400, "missing_field"),
    ({**GOOD, "output_format": {**RAW, "encoding": "pcm_alaw8"}}, 400, "invalid_output_format"),
    ({**GOOD, "output_format": {**RAW, "sample_rate": 96000}}, 400, "invalid_output_format"),
    ({**GOOD, "output_format": {**RAW, "sample_rate": "fast"}}, 400, "invalid_request"),
    ({**GOOD, "output_format": {"container": "ogg", "sample_rate": 8000}}, 400,
     "invalid_output_format"),
    ({**GOOD, "output_format": {"container": "mp3", "sample_rate": 8000, "bit_rate": 1}}, 400,
     "invalid_output_format"),
    ({**GOOD, "voice": "nobody"}, 400, "voice_not_found"),
    ({**GOOD, "voice": {"mode": "embedding", "embedding": [0.1]}}, 400, "unsupported_voice_mode"),
    ({**GOOD, "model_id": "gpt-4"}, 404, "model_not_found"),
    ({**GOOD, "generation_config": {"speed": 9}}, 400, "invalid_request"),
    ({**GOOD, "speed": "ludicrous"}, 400, "invalid_request"),
])  # fmt: skip
def test_bad_requests_get_cartesia_errors(
    server: LiveServer, body: object, status: int, code: str
) -> None:
    assert_error(post(server, body), status, code)


def test_sse_takes_raw_audio_only(server: LiveServer) -> None:
    body = {**GOOD, "output_format": {**RAW, "container": "wav"}}
    assert_error(post(server, body, "/tts/sse"), 400, "invalid_output_format")


def test_the_key_comes_as_x_api_key_or_bearer(server: LiveServer) -> None:
    assert post(server, GOOD).status_code == 200
    assert post(server, GOOD, **{"X-API-Key": "wrong"}).status_code == 401
    bearer = httpx.post(server.base_url + "/tts/bytes", json=GOOD, timeout=10,
                        headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    assert bearer.status_code == 200
    missing = httpx.post(server.base_url + "/tts/bytes", json=GOOD, timeout=10)
    assert_error(missing, 401, "unauthorized")
    assert_error(httpx.get(server.base_url + "/voices", timeout=10), 401, "unauthorized")


def test_a_malformed_version_is_refused(server: LiveServer) -> None:
    assert_error(post(server, GOOD, **{"Cartesia-Version": "latest"}), 400, "invalid_version")


def test_voice_settings_playhead_ignores_are_accepted(server: LiveServer) -> None:
    controls = {"speed": "fast"}
    body = {**GOOD, "language": "en", "pronunciation_dict_id": "x", "save": True,
            "generation_config": {"volume": 1.5, "emotion": "excited", "speed": 1.0},
            "voice": {"mode": "id", "id": "sim", "__experimental_controls": controls}}  # fmt: skip
    response = post(server, body)
    assert response.status_code == 200
    assert len(response.content) / 2 / 24000 == pytest.approx(sim_seconds(server), abs=0.01)


def test_speed_maps_to_the_engine(server: LiveServer) -> None:
    slow = post(server, {**GOOD, "generation_config": {"speed": 0.6}})
    normal = post(server, GOOD)
    assert len(slow.content) > 1.4 * len(normal.content)


def test_voices_list_and_get(client: cartesia.Cartesia) -> None:
    voices = list(client.voices.list())
    assert [v.id for v in voices] == ["sim"]
    assert client.voices.get("sim").language == "en"
    with pytest.raises(cartesia.NotFoundError):
        client.voices.get("nobody")


# The socket ----------------------------------------------------------------------------


async def test_sdk_contexts_stream_live_text(server: LiveServer) -> None:
    # the SDK makes its socket URL wss:// from base_url: a plain-HTTP server needs ws://
    ws_base = server.base_url.replace("http", "ws")
    async with cartesia.AsyncCartesia(
        base_url=server.base_url, api_key=KEY, websocket_base_url=ws_base
    ) as sdk:
        connection = await sdk.tts.websocket_connect().enter()
        try:
            context = connection.context(
                model_id="sonic-2", voice={"mode": "id", "id": CARTESIA_UUID},
                output_format=RAW, add_timestamps=True,
            )  # fmt: skip
            await context.push("Hello there. ")
            await context.push("This is a test ")
            await context.push("of the Cartesia API.")
            await context.no_more_inputs()
            events = [event async for event in context.receive()]
        finally:
            await connection.close()
    assert events[-1].type == "done"
    audio = b"".join(e.audio or b"" for e in events if e.type == "chunk")
    assert len(audio) / 2 / 24000 == pytest.approx(sim_seconds(server), abs=0.01)


async def test_two_contexts_interleave_on_one_socket(server: LiveServer) -> None:
    async with websockets.connect(ws_url(server)) as socket:
        await socket.send(request("a", TEXT))
        await socket.send(request("b", "A second context speaks at the same time."))
        seen: dict[str, list[dict]] = {"a": [], "b": []}
        order = []
        async with asyncio.timeout(20):
            while not all(m and m[-1]["type"] == "done" for m in seen.values()):
                message = json.loads(await socket.recv())
                seen[message["context_id"]].append(message)
                order.append(message["context_id"])
    assert len(audio_of(seen["a"])) / 2 / 24000 == pytest.approx(sim_seconds(server), abs=0.01)
    # neither waited for the other to finish
    first_done = min(order.index("a", order.index("a")), len(order))
    assert "b" in order[: first_done + len(seen["a"]) - 1]


async def test_the_socket_sends_raw_alaw(server: LiveServer) -> None:
    fmt = {**RAW, "encoding": "pcm_alaw", "sample_rate": 8000}
    async with websockets.connect(ws_url(server)) as socket:
        await socket.send(request("law", TEXT, output_format=fmt))
        messages = await receive_until_done(socket, "law")
    audio = audio_of(messages)
    assert len(audio) / 8000 == pytest.approx(sim_seconds(server), abs=0.01)  # a byte a sample
    options = {"sample_rate": "8000", "ch_layout": "mono"}
    with av.open(io.BytesIO(audio), format="alaw", options=options) as container:
        decoded = sum(f.samples for f in container.decode(audio=0))
    assert decoded == len(audio)


async def test_flush_marks_chunks_and_answers_flush_done(server: LiveServer) -> None:
    async with websockets.connect(ws_url(server)) as socket:
        await socket.send(request("f", "Hello there. ", **{"continue": True}))
        await socket.send(request("f", "", flush=True, **{"continue": True}))
        await socket.send(request("f", "The second part is here.", **{"continue": True}))
        await socket.send(request("f", "", **{"continue": False}))
        messages = await receive_until_done(socket, "f")
    kinds = [m["type"] for m in messages]
    assert kinds.count("flush_done") == 1 and kinds[-1] == "done"
    flush_ids = [m["flush_id"] for m in messages if m["type"] == "chunk"]
    assert flush_ids == sorted(flush_ids) and set(flush_ids) <= {1, 2}
    assert messages[kinds.index("flush_done")]["flush_id"] == 1


async def test_a_flush_speaks_an_unfinished_sentence_at_once(server: LiveServer) -> None:
    """A flush in mid-sentence: the words so far are spoken now (a long buffer delay
    would otherwise hold them), and the context goes on."""
    first = "The words before the flush"
    async with websockets.connect(ws_url(server)) as socket:
        await socket.send(request("m", first, max_buffer_delay_ms=5000, **{"continue": True}))
        await socket.send(request("m", "", flush=True, **{"continue": True}))
        audio, expected_s = bytearray(), sim_seconds(server, first)
        async with asyncio.timeout(3):
            while len(audio) / 2 / 24000 < expected_s - 0.01:
                message = json.loads(await socket.recv())
                assert message["type"] in ("chunk", "timestamps", "flush_done"), message
                if message["type"] == "chunk":
                    audio += base64.b64decode(message["data"])
        await socket.send(request("m", " and the words after it.", **{"continue": False}))
        messages = await receive_until_done(socket, "m")
    assert len(audio) / 2 / 24000 == pytest.approx(expected_s, abs=0.01)
    rest_s = len(audio_of(messages)) / 2 / 24000
    assert rest_s == pytest.approx(sim_seconds(server, "and the words after it."), abs=0.01)


@pytest.mark.parametrize("delay_ms", [0, 300])
async def test_an_open_context_speaks_its_sentence_after_the_buffer_delay(
    server: LiveServer, delay_ms: int
) -> None:
    """As pipecat and LiveKit send it: a whole sentence, no space after it, more to come."""
    async with websockets.connect(ws_url(server)) as socket:
        sent_s = time.monotonic()
        await socket.send(
            request("b", "Hello there.", max_buffer_delay_ms=delay_ms, **{"continue": True})
        )
        async with asyncio.timeout(5):
            first = json.loads(await socket.recv())
        waited_s = time.monotonic() - sent_s
        assert first["type"] == "chunk" and first["context_id"] == "b", first
        assert waited_s >= delay_ms / 1000.0
        # the next sentence, no space before it either: it follows on the same stream
        await socket.send(request("b", "How are you?", **{"continue": False}))
        messages = [first, *await receive_until_done(socket, "b")]
    audio_s = len(audio_of(messages)) / 2 / 24000
    assert audio_s == pytest.approx(sim_seconds(server, "Hello there. How are you?"), abs=0.01)


async def test_cancel_stops_the_audio_within_a_chunk_and_frees_the_stream() -> None:
    # a server of its own whose talker runs at 4x real time: chunks come one by one, so
    # what arrives after the cancel is what the server sent after it
    long_text = " ".join([TEXT] * 6)
    settings = sim_settings(f"server.api_key={KEY}", "admission.enabled=false", *SLOW_TALKER)
    with live_server(settings) as server:
        await _cancel_mid_speech(server, long_text)


async def _cancel_mid_speech(server: LiveServer, long_text: str) -> None:
    async with websockets.connect(ws_url(server)) as socket:
        await socket.send(request("c", long_text))
        first = json.loads(await socket.recv())
        assert first["type"] == "chunk"
        await socket.send(json.dumps({"context_id": "c", "cancel": True}))
        after: list[dict] = []
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.0):
                while True:
                    after.append(json.loads(await socket.recv()))
        assert len(after) <= 1 and all(m["type"] == "chunk" for m in after), after
        # text after the cancel on the same context is dropped, and the socket still works
        await socket.send(request("c", "More text.", **{"continue": True}))
        await socket.send(request("d", "Hello."))
        messages = await receive_until_done(socket, "d")
    assert messages[-1]["type"] == "done"
    assert wait_idle(server, 5.0) == 0


async def test_capacity_refusal_is_an_error_message_with_the_context() -> None:
    # a server of its own, at most one stream: an open context holds it
    settings = sim_settings(f"server.api_key={KEY}", "admission.max_streams=1", *SLOW_TALKER)
    with live_server(settings) as small:
        async with websockets.connect(ws_url(small)) as socket:
            await socket.send(request("held", "Hold on. ", **{"continue": True}))
            await socket.send(request("more", "One too many. ", **{"continue": True}))
            async with asyncio.timeout(10):
                while (message := json.loads(await socket.recv()))["context_id"] != "more":
                    pass
            assert message["type"] == "error" and message["status_code"] == 429, message
            assert message["error_code"] == "concurrency_limited" and message["done"] is False
            # its later text is dropped (not a new context: the count below stays 1)
            await socket.send(request("more", "Still too many.", **{"continue": True}))
            await socket.send(request("more", "", **{"continue": False}))
            response = post(small, GOOD)
            assert_error(response, 429, "concurrency_limited")
            assert int(response.headers["retry-after"]) >= 1
            await socket.send(json.dumps({"context_id": "held", "cancel": True}))
            assert wait_idle(small, 5.0) == 0
        text = httpx.get(small.base_url + "/metrics", headers={"X-API-Key": KEY}).text
    # one refusal on the socket, one over HTTP (the dropped text was not a third)
    labels = 'outcome="rejected",protocol="cartesia"'
    assert metric_value(text, "playhead_protocol_streams_total", labels) == 2


@pytest.mark.parametrize(("message", "code"), [
    ("nonsense", "invalid_json"),
    ("[]", "invalid_request"),
    (json.dumps({"cancel": True}), "invalid_request"),
    (json.dumps({"context_id": "never", "cancel": True}), "context_not_found"),
    (json.dumps({"context_id": "x", "continue": False}), "missing_field"),
    (request("x", None), "missing_field"),  # transcript: null
    (json.dumps({"transcript": "Hi.", "output_format": RAW}), "missing_field"),
    (request("x", "Hi.", output_format={"container": "mp3", "sample_rate": 8000}),
     "invalid_output_format"),
    (request("x", "Hi.", voice="nobody"), "voice_not_found"),
    (request("x", "Hi.", add_timestamps="yes"), "invalid_request"),
    (request("x", "Hi.", max_buffer_delay_ms=9000), "invalid_request"),
])  # fmt: skip
async def test_bad_messages_get_errors_and_the_socket_stays(
    server: LiveServer, message: str, code: str
) -> None:
    async with websockets.connect(ws_url(server)) as socket:
        await socket.send(message)
        error = json.loads(await socket.recv())
        assert error["type"] == "error" and error["error_code"] == code, error
        assert "context_id" in error and error["status_code"] == 400
        await socket.send(request("ok", "Hello."))
        assert (await receive_until_done(socket, "ok"))[-1]["type"] == "done"


async def test_a_cancel_of_a_context_that_is_done_is_quiet(server: LiveServer) -> None:
    async with websockets.connect(ws_url(server)) as socket:
        await socket.send(request("once", "Hello."))
        assert (await receive_until_done(socket, "once"))[-1]["type"] == "done"
        await socket.send(json.dumps({"context_id": "once", "cancel": True}))
        await socket.send(request("next", "Hello."))
        async with asyncio.timeout(10.0):
            message = json.loads(await socket.recv())
        assert message["context_id"] == "next" and message["type"] != "error", message


async def test_a_closed_context_refuses_more_text(server: LiveServer) -> None:
    async with websockets.connect(ws_url(server)) as socket:
        await socket.send(request("z", " ".join([TEXT] * 3)))
        await socket.send(request("z", "More.", **{"continue": True}))
        messages = await receive_until_done(socket, "z")
    assert messages[-1]["type"] == "error" and messages[-1]["error_code"] == "context_closed"


async def test_a_too_large_message_closes_with_1009(server: LiveServer) -> None:
    async with websockets.connect(ws_url(server), max_size=None) as socket:
        await socket.send(request("big", "x" * 70000))
        error = json.loads(await socket.recv())
        assert error["error_code"] == "message_too_large"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await socket.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


@pytest.mark.parametrize(("query", "status"), [
    (f"cartesia_version={VERSION}", 401),
    (f"api_key=wrong&cartesia_version={VERSION}", 401),
    (f"api_key={KEY}&cartesia_version=yesterday", 400),
])  # fmt: skip
async def test_the_handshake_is_refused_with_an_http_status(
    server: LiveServer, query: str, status: int
) -> None:
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(ws_url(server, query)):
            pass
    assert refused.value.response.status_code == status
    body = json.loads(refused.value.response.body)
    assert body["error_code"] in ("unauthorized", "invalid_version")


async def test_the_key_may_come_as_a_header_on_the_socket(server: LiveServer) -> None:
    headers = {"X-API-Key": KEY, "Cartesia-Version": VERSION}
    url = server.base_url.replace("http", "ws") + "/tts/websocket"
    async with websockets.connect(url, additional_headers=headers) as socket:
        await socket.send(request("k", "Hello."))
        assert (await receive_until_done(socket, "k"))[-1]["type"] == "done"


async def test_the_clients_surface_a_refused_context() -> None:
    """LiveKit's stream fails with the server's error, pipecat reports it as an
    ErrorFrame: the refusal is not a silent context."""
    import aiohttp
    from livekit.agents import APIConnectOptions, APIError
    from livekit.plugins import cartesia as livekit_cartesia
    from pipecat.frames.frames import ErrorFrame, TTSSpeakFrame
    from pipecat.services.cartesia.tts import CartesiaTTSService
    from pipecat.tests.utils import SleepFrame, run_test

    settings = sim_settings(f"server.api_key={KEY}", "admission.max_streams=1")
    with live_server(settings) as small:
        async with websockets.connect(ws_url(small)) as holder:
            await holder.send(request("held", "Hold on. ", **{"continue": True}))
            await asyncio.sleep(0.2)  # admitted: the one stream is taken
            async with aiohttp.ClientSession() as session:
                tts = livekit_cartesia.TTS(api_key=KEY, base_url=small.base_url,
                                           http_session=session)  # fmt: skip
                stream = tts.stream(conn_options=APIConnectOptions(max_retry=0, timeout=5))
                stream.push_text("Hello there. ")
                stream.end_input()
                with pytest.raises(APIError, match="concurrency_limited"):
                    async with asyncio.timeout(15):
                        async for _ in stream:
                            pass
                await stream.aclose()
                await tts.aclose()
            url = small.base_url.replace("http", "ws") + "/tts/websocket"
            pipecat_tts = CartesiaTTSService(api_key=KEY, url=url, sample_rate=24000)
            _, up = await run_test(
                pipecat_tts,
                frames_to_send=[TTSSpeakFrame("Hello there."), SleepFrame(1.0)],
                start_timeout=10,
            )
            errors = [f for f in up if isinstance(f, ErrorFrame)]
            assert errors and "concurrency_limited" in errors[0].error, errors
            await holder.send(json.dumps({"context_id": "held", "cancel": True}))

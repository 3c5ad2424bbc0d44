"""The HTTP API's refusals and listings, in process (httpx ASGITransport, sim backend);
the request size limit also through a live uvicorn, where a socket shows what is read.

Every error is checked as the whole OpenAI envelope: exactly the four keys, with the
status, type, param and code the API promises.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator

import httpx
import pytest
from api_support import asgi_client, decode, live_server, sim_settings, speech_body

from benchmarks.player import parse_server_timing
from pipeline.backends.sim import SimBackend

SPEECH = "/v1/audio/speech"


def assert_error(
    response: httpx.Response,
    status: int,
    *,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None,
    message_has: str = "",
) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert (error["type"], error["param"], error["code"]) == (type_, param, code)
    assert message_has in error["message"]
    return error


@pytest.fixture
async def client():
    async with asgi_client(sim_settings("server.max_input_chars=60")) as c:
        yield c


async def test_a_valid_request_streams_audio(client: httpx.AsyncClient) -> None:
    response = await client.post(SPEECH, json=speech_body("Hi there."))
    assert response.status_code == 200
    assert response.headers["content-type"] == "audio/mpeg"
    assert response.headers["x-playhead-stream-id"]
    assert len(response.content) > 100
    # sent with the first audio: no wait for a start slot, then submit -> first audio
    timing = parse_server_timing(response.headers["server-timing"])
    assert timing["start-wait"] == 0.0 and timing["first-audio"] > 0


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "tts-1", "input": "x", "voice": "sim", "foo": 1}, "foo", "unknown_parameter"),
        ({"input": "x", "voice": "sim"}, "model", "missing_required_parameter"),
        ({"model": "tts-1", "voice": "sim"}, "input", "missing_required_parameter"),
        ({"model": "tts-1", "input": "x"}, "voice", "missing_required_parameter"),
        (speech_body(model=5), "model", "invalid_type"),
        (speech_body(model=None), "model", "invalid_type"),
        (speech_body(input=["x"]), "input", "invalid_type"),
        (speech_body(voice=5), "voice", "invalid_type"),
        (speech_body(voice={"id": 5}), "voice.id", "invalid_type"),
        (speech_body(voice={"name": "sim"}), "voice.id", "missing_required_parameter"),
        (speech_body(voice={"id": "sim", "x": 1}), "voice.x", "unknown_parameter"),
        (speech_body(instructions=5), "instructions", "invalid_type"),
        (speech_body(instructions="x" * 4097), "instructions", "invalid_value"),
        (speech_body(response_format="ogg"), "response_format", "invalid_value"),
        (speech_body(response_format=1), "response_format", "invalid_value"),
        (speech_body(speed="fast"), "speed", "invalid_type"),
        (speech_body(speed="1.0"), "speed", "invalid_type"),
        (speech_body(speed=True), "speed", "invalid_type"),
        (speech_body(speed=0.24), "speed", "invalid_value"),
        (speech_body(speed=4.01), "speed", "invalid_value"),
        (speech_body(stream_format="json"), "stream_format", "invalid_value"),
        (speech_body(sample_rate=7999), "sample_rate", "invalid_value"),
        (speech_body(sample_rate=48001), "sample_rate", "invalid_value"),
        (speech_body(sample_rate=16000.5), "sample_rate", "invalid_type"),
        (speech_body(sample_rate="16000"), "sample_rate", "invalid_type"),
        (speech_body(input=""), "input", "string_below_min_length"),
        (speech_body(input=" \n\t "), "input", "string_below_min_length"),
        (speech_body(input="x" * 61), "input", "string_above_max_length"),
    ],
)
async def test_each_field_rule_is_a_400_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, object], param: str, code: str
) -> None:
    response = await client.post(SPEECH, json=body)
    assert_error(response, 400, param=param, code=code)


@pytest.mark.parametrize(
    "fields",
    [
        {"speed": 0.25},
        {"speed": 4},
        {"sample_rate": 8000},
        {"sample_rate": 48000},
        {"instructions": "x" * 4096},
        {"input": "  " + "x" * 60 + "  "},  # 60 characters after trimming
        {"voice": {"id": "sim"}},
        {"voice": "alloy"},  # an OpenAI name maps to the default voice
        {"voice": "Sim"},  # the voice's name works too
        {"model": "gpt-4o-mini-tts"},
        {"model": "playhead"},
        {"speed": None, "instructions": None, "response_format": None, "sample_rate": None},
        {"stream_format": "audio"},
    ],
)
async def test_edges_of_each_rule_are_accepted(
    client: httpx.AsyncClient, fields: dict[str, object]
) -> None:
    response = await client.post(SPEECH, json=speech_body("Ok.", **fields))
    assert response.status_code == 200, response.text


async def test_malformed_json_is_a_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        SPEECH,
        content=b'{"model": "tts-1", "input": ',
        headers={"content-type": "application/json"},
    )
    assert_error(response, 400, code="invalid_json")


async def test_a_body_that_is_not_an_object_is_a_400(client: httpx.AsyncClient) -> None:
    response = await client.post(SPEECH, json=["tts-1", "hello", "sim"])
    assert_error(response, 400, code="invalid_type", message_has="an array")


async def test_json_without_content_type_is_still_read(client: httpx.AsyncClient) -> None:
    response = await client.post(SPEECH, content=json.dumps(speech_body("Ok.")).encode())
    assert response.status_code == 200


async def test_unknown_model_is_a_404_model_not_found(client: httpx.AsyncClient) -> None:
    response = await client.post(SPEECH, json=speech_body(model="tts-2"))
    assert_error(response, 404, param="model", code="model_not_found", message_has="tts-2")


async def test_unknown_voice_is_a_400_naming_the_voices(client: httpx.AsyncClient) -> None:
    response = await client.post(SPEECH, json=speech_body(voice="nobody"))
    error = assert_error(response, 400, param="voice", code="voice_not_found")
    assert "nobody" in str(error["message"]) and "sim" in str(error["message"])


async def test_unknown_route_and_method_use_the_envelope(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/nothing"), 404, code="not_found")
    assert_error(await client.get(SPEECH), 405, code="method_not_allowed")


async def test_listings(client: httpx.AsyncClient) -> None:
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    ids = [m["id"] for m in models["data"]]
    assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts", "playhead"} <= set(ids)
    for entry in models["data"]:
        assert set(entry) == {"id", "object", "created", "owned_by"}
        assert entry["object"] == "model" and isinstance(entry["created"], int)
    assert (await client.get("/v1/models/tts-1")).json()["id"] == "tts-1"
    assert_error(await client.get("/v1/models/nope"), 404, param="model", code="model_not_found")
    audio_models = (await client.get("/v1/audio/models")).json()
    assert [m["id"] for m in audio_models["models"]] == ids
    voices = (await client.get("/v1/audio/voices")).json()
    assert voices == {
        "voices": [{"id": "sim", "name": "Sim", "language": "en", "sample_rate": 24000}]
    }
    assert (await client.get("/health")).json() == {"status": "ok"}
    assert (await client.get("/ready")).status_code == 200


async def test_api_key_guards_every_route_but_health_and_ready() -> None:
    async with asgi_client(sim_settings("server.api_key=s3cret")) as client:
        for method, path in (("GET", "/v1/models"), ("GET", "/v1/audio/voices"), ("POST", SPEECH)):
            response = await client.request(method, path, json=speech_body("Ok."))
            assert_error(response, 401, code="missing_api_key")
            assert response.headers["www-authenticate"] == "Bearer"
            wrong = {"authorization": "Bearer nope"}
            response = await client.request(method, path, json=speech_body("Ok."), headers=wrong)
            assert_error(response, 401, code="invalid_api_key")
            right = {"authorization": "Bearer s3cret"}
            response = await client.request(method, path, json=speech_body("Ok."), headers=right)
            assert response.status_code == 200
        response = await client.post(SPEECH, headers={"authorization": "Basic s3cret"}, json={})
        assert_error(response, 401, code="missing_api_key")
        for path in ("/health", "/ready"):
            assert (await client.get(path)).status_code == 200
        for path in ("/metrics", "/", "/static/app.js", "/nothing", "/openapi.json"):
            assert_error(await client.get(path), 401, code="missing_api_key")


async def test_no_key_configured_accepts_any_authorization(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/models", headers={"authorization": "Bearer whatever"})
    assert response.status_code == 200


async def test_admission_reject_is_a_429_with_an_integer_retry_after() -> None:
    async with asgi_client(sim_settings("admission.max_streams=1")) as client:
        engine = client.app.state.playhead.engine  # type: ignore[attr-defined]
        held = engine.submit("A stream that holds the only slot. " * 3, voice="sim")
        try:
            response = await client.post(SPEECH, json=speech_body("Ok."))
            assert_error(response, 429, type_="rate_limit_error", code="rate_limit_exceeded")
            retry_after = response.headers["retry-after"]
            assert retry_after.isdigit() and int(retry_after) >= 1
            metrics = (await client.get("/metrics")).text
            assert "playhead_admission_rejections_total{" in metrics
        finally:
            engine.cancel(held.id)
        response = await client.post(SPEECH, json=speech_body("Ok."))
        assert response.status_code == 200


async def test_admission_is_decided_before_the_body_and_a_slot_is_never_leaked() -> None:
    """app/admission_gate.py: a full server refuses a speech request before reading its
    body (a bad body gets 429, not 400), and a slot reserved for a request that then
    fails (400) or is served is given back."""
    # no queue: a request beyond the slot is refused at once
    settings = sim_settings("admission.max_streams=1", "admission.queue_max_wait_s=0")
    async with asgi_client(settings) as client:
        engine = client.app.state.playhead.engine  # type: ignore[attr-defined]
        for _ in range(3):  # each 400 gives its reservation back
            response = await client.post(SPEECH, content=b"{not json")
            assert response.status_code == 400
        # the only slot is free (else this raises Rejected)
        held = engine.submit("A stream that holds the only slot. " * 3, voice="sim")
        try:
            response = await client.post(SPEECH, content=b"{not json")
            assert_error(response, 429, type_="rate_limit_error", code="rate_limit_exceeded")
        finally:
            engine.cancel(held.id)
        response = await client.post(SPEECH, json=speech_body("Ok."))
        assert response.status_code == 200
        assert engine.admission.granted == 0


async def test_503_while_the_model_loads_then_ready() -> None:
    release = threading.Event()
    settings = sim_settings()

    def slow_backend() -> SimBackend:
        release.wait(10)
        return SimBackend(settings.sim)

    async with asgi_client(settings, wait_ready=False, backend_factory=slow_backend) as client:
        try:
            assert (await client.get("/health")).json() == {"status": "ok"}
            assert_error(
                await client.get("/ready"), 503, type_="server_error", code="model_loading"
            )
            response = await client.post(SPEECH, json=speech_body("Ok."))
            assert_error(response, 503, type_="server_error", code="model_loading")
            assert_error(
                await client.get("/v1/audio/voices"),
                503,
                type_="server_error",
                code="model_loading",
            )
            # validation that needs no model still answers first
            assert_error(
                await client.post(SPEECH, json=speech_body(speed=9)),
                400,
                param="speed",
                code="invalid_value",
            )
            metrics = (await client.get("/metrics")).text
            assert "playhead_ready 0.0" in metrics
        finally:
            release.set()
        await asyncio.wait_for(client.app.state.playhead.wait_loaded(), 10)  # type: ignore[attr-defined]
        assert (await client.get("/ready")).json() == {"status": "ready"}
        assert (await client.post(SPEECH, json=speech_body("Ok."))).status_code == 200


async def test_a_failed_load_keeps_ready_at_503() -> None:
    def broken_backend() -> SimBackend:
        raise OSError("voice file missing")

    async with asgi_client(sim_settings(), backend_factory=broken_backend) as client:
        error = assert_error(
            await client.get("/ready"), 503, type_="server_error", code="model_load_failed"
        )
        assert "voice file missing" in str(error["message"])
        assert (await client.get("/health")).status_code == 200


async def test_pydantic_422_never_leaks(client: httpx.AsyncClient) -> None:
    for payload in ({}, {"model": {}}, {"voice": []}, speech_body(speed=[1])):
        response = await client.post(SPEECH, json=payload)
        assert response.status_code == 400
        assert "detail" not in response.json()


async def test_foreign_errors_become_the_envelope() -> None:
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    from app.errors import handle_error

    cases = [
        (
            RequestValidationError([{"type": "int_type", "loc": ("query", "n"), "input": "x"}]),
            400,
            ("invalid_request_error", "query.n", "invalid_type"),
        ),
        (HTTPException(404), 404, ("invalid_request_error", None, "not_found")),
        (RuntimeError("boom"), 500, ("server_error", None, None)),
        # a 5xx keeps its own status
        (HTTPException(500), 500, ("server_error", None, None)),
        (HTTPException(501), 501, ("server_error", None, None)),
        (HTTPException(503), 503, ("server_error", None, None)),
    ]
    for exc, status, (type_, param, code) in cases:
        response = await handle_error(None, exc)  # type: ignore[arg-type]
        assert response.status_code == status
        error = json.loads(response.body)["error"]
        assert (error["type"], error["param"], error["code"]) == (type_, param, code)
        assert "boom" not in error["message"]  # internal details stay in the log


# --- request body size limit (server.max_request_bytes) ------------------------------------

LIMIT_BYTES = 4096
PIECE_BYTES = 1024


def padded_speech(size_bytes: int) -> bytes:
    """A valid request body, padded with JSON whitespace to exactly `size_bytes`."""
    body = json.dumps(speech_body("Ok.")).encode()
    return body + b" " * (size_bytes - len(body))


def assert_too_large(response: httpx.Response) -> None:
    assert_error(response, 413, code="request_too_large", message_has=str(LIMIT_BYTES))
    assert response.headers["connection"] == "close"


LIMITED = ("server.max_input_chars=60", f"server.max_request_bytes={LIMIT_BYTES}")


@pytest.fixture
async def limited() -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(sim_settings(*LIMITED)) as c:
        yield c


async def test_a_body_at_the_limit_is_served_one_byte_more_is_a_413(
    limited: httpx.AsyncClient,
) -> None:
    response = await limited.post(SPEECH, content=padded_speech(LIMIT_BYTES))
    assert response.status_code == 200, response.text
    assert_too_large(await limited.post(SPEECH, content=padded_speech(LIMIT_BYTES + 1)))


async def test_a_too_large_content_length_is_refused_before_reading_the_body(
    limited: httpx.AsyncClient,
) -> None:
    pieces_read = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal pieces_read
        for _ in range(1000):
            pieces_read += 1
            yield b" " * PIECE_BYTES

    headers = {"content-length": str(1000 * PIECE_BYTES)}
    assert_too_large(await limited.post(SPEECH, content=body(), headers=headers))
    assert pieces_read == 0


async def test_a_chunked_body_is_refused_once_it_passes_the_limit(
    limited: httpx.AsyncClient,
) -> None:
    pieces_read = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal pieces_read
        for _ in range(1000):
            pieces_read += 1
            yield b" " * PIECE_BYTES

    request = limited.build_request("POST", SPEECH, content=body())
    assert "content-length" not in request.headers
    assert request.headers["transfer-encoding"] == "chunked"
    assert_too_large(await limited.send(request))
    assert pieces_read == LIMIT_BYTES // PIECE_BYTES + 1  # reading stopped at the first excess


async def test_a_chunked_body_under_the_limit_is_served(limited: httpx.AsyncClient) -> None:
    payload = padded_speech(LIMIT_BYTES)

    async def body() -> AsyncIterator[bytes]:
        for start in range(0, len(payload), PIECE_BYTES):
            yield payload[start : start + PIECE_BYTES]

    response = await limited.post(SPEECH, content=body())
    assert response.status_code == 200, response.text


def _exchange(port: int, head: list[str], body: bytes) -> bytes:
    """Send a raw request and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(("\r\n".join([*head, "", ""])).encode() + body)
        received = bytearray()
        while data := sock.recv(65536):
            received += data
    return bytes(received)


def test_uvicorn_answers_413_without_the_rest_of_the_body_and_closes() -> None:
    """A socket timeout (5 s) here would mean the server waited for a body never sent."""
    with live_server(sim_settings(*LIMITED)) as live:
        head = [f"POST {SPEECH} HTTP/1.1", f"Host: 127.0.0.1:{live.port}"]
        declared = _exchange(live.port, [*head, "Content-Length: 1000000000"], b"")
        just_over = b" " * (LIMIT_BYTES + 1)
        chunked = _exchange(
            live.port,
            [*head, "Transfer-Encoding: chunked"],
            f"{len(just_over):x}\r\n".encode() + just_over + b"\r\n",  # no last chunk
        )
    for raw in (declared, chunked):
        status_line, _, rest = raw.partition(b"\r\n")
        assert status_line == b"HTTP/1.1 413 Request Entity Too Large", raw[:200]
        headers, _, content = rest.partition(b"\r\n\r\n")
        assert b"connection: close" in headers.lower()
        assert json.loads(content)["error"]["code"] == "request_too_large"


# --- the encoding section reaches the encoders ---------------------------------------------


async def test_the_server_encodes_with_the_configured_encoding() -> None:
    text = "The same sentence, encoded twice with different settings."
    results = {}
    for mp3_bitrate_bps, ogg_page_ms in ((32_000, 1000), (128_000, 20)):
        settings = sim_settings(
            f"encoding.mp3_bitrate_bps={mp3_bitrate_bps}", f"encoding.ogg_page_ms={ogg_page_ms}"
        )
        async with asgi_client(settings) as client:
            mp3 = await client.post(SPEECH, json=speech_body(text))
            opus = await client.post(SPEECH, json=speech_body(text, response_format="opus"))
        assert mp3.status_code == opus.status_code == 200
        results[mp3_bitrate_bps] = (mp3.content, opus.content)
    (mp3_32k, opus_1s_pages), (mp3_128k, opus_20ms_pages) = results[32_000], results[128_000]
    assert len(mp3_128k) == 4 * len(mp3_32k)  # CBR, the same frames
    assert decode(mp3_32k, "mp3")[0].size == decode(mp3_128k, "mp3")[0].size
    assert opus_20ms_pages.count(b"OggS") > 10 * opus_1s_pages.count(b"OggS")


async def test_a_client_gone_mid_body_is_not_a_server_error() -> None:
    """Starlette raises ClientDisconnect while the body is read; it must not escape the
    app (uvicorn would log it as 'Exception in ASGI application')."""
    messages = [
        {"type": "http.request", "body": b'{"model": "tts-1", "inp', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": SPEECH,
        "raw_path": SPEECH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"200")],
        "client": ("127.0.0.1", 50000),
        "server": ("playhead", 80),
    }
    async with asgi_client(sim_settings()) as client:
        await client.app(scope, receive, send)  # type: ignore[attr-defined]
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == 400

"""The HTTP API's refusals and listings, in process (httpx ASGITransport, sim backend).

Every error is checked as the whole OpenAI envelope: exactly the four keys, with the
status, type, param and code the API promises.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from api_support import asgi_client, sim_settings, speech_body

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


async def test_api_key_guards_v1_only() -> None:
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
        for path in ("/health", "/ready", "/metrics"):
            assert (await client.get(path)).status_code == 200


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
    ]
    for exc, status, (type_, param, code) in cases:
        response = await handle_error(None, exc)  # type: ignore[arg-type]
        assert response.status_code == status
        error = json.loads(response.body)["error"]
        assert (error["type"], error["param"], error["code"]) == (type_, param, code)
        assert "boom" not in error["message"]  # internal details stay in the log

"""A hostile or careless client: no input makes a 5xx, every refusal is the envelope, a
5xx closes its connection properly, client strings never break a log line, and the
security settings (API key, public routes, OpenAPI, CORS) do what they say.

In process (httpx ASGITransport, sim backend), except where a socket must show what the
server does with a connection (a live uvicorn).
"""

from __future__ import annotations

import json
import logging
import socket

import httpx
import pytest
from api_support import asgi_client, live_server, request_bytes, sim_settings, speech_body
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.client_json import ClientJsonError, load_client_json, quote
from app.logs import EscapingFormatter, escape_log_text

SPEECH = "/v1/audio/speech"


def assert_envelope(response: httpx.Response) -> dict[str, object]:
    assert response.headers["content-type"] == "application/json", response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.fixture
async def client():
    async with asgi_client(sim_settings("server.max_input_chars=200")) as c:
        yield c


async def post_raw(client: httpx.AsyncClient, body: bytes) -> httpx.Response:
    return await client.post(SPEECH, content=body, headers={"content-type": "application/json"})


# Each of these answered 500 before (issue 11), or broke the envelope.
HOSTILE_BODIES = {
    "nul in input": b'{"model":"tts-1","input":"hi\\u0000there","voice":"sim"}',
    "lone surrogate in input": b'{"model":"tts-1","input":"hi \\ud800","voice":"sim"}',
    "lone surrogate in model": b'{"model":"tts-1\\ud800","input":"hi","voice":"sim"}',
    "lone surrogate in voice": b'{"model":"tts-1","input":"hi","voice":"a\\udfff\\nb"}',
    "lone surrogate in a key": b'{"model":"tts-1","input":"hi","voice":"sim","\\ud800":1}',
    "arrays 1000 deep": b"[" * 1000 + b"]" * 1000,
    "a field 1000 deep": b'{"model":' + b"[" * 1000 + b"]" * 1000 + b"}",
    "objects 10000 deep": b'{"a":' * 10000 + b"1" + b"}" * 10000,
    "an int of 4301 digits": b'{"model":"tts-1","input":"hi","voice":"sim","speed":'
    + b"1" * 4301
    + b"}",
    "an int too big for a float": b'{"model":"tts-1","input":"hi","voice":"sim","speed":'
    + b"9" * 60
    + b"}",
    "a float that overflows": b'{"model":"tts-1","input":"hi","voice":"sim","speed":1e999}',
    "NaN": b'{"model":"tts-1","input":"hi","voice":"sim","speed":NaN}',
    "-Infinity": b'{"model":"tts-1","input":"hi","voice":"sim","speed":-Infinity}',
    "invalid utf-8": b'{"model":"tts-1","input":"\xff\xfe","voice":"sim"}',
    "utf-8 encoded surrogate": b'{"model":"tts-1","input":"\xed\xa0\x80","voice":"sim"}',
    "emoji only": json.dumps(speech_body("\U0001f600" * 50)).encode(),
    "controls only": json.dumps(speech_body("\x01\x02\x1b\x7f")).encode(),
    "empty body": b"",
    "a bare string": b'"hello"',
    "null": b"null",
    "a huge string key": json.dumps({"k" * 20000: 1}).encode(),
}


@pytest.mark.parametrize("name", list(HOSTILE_BODIES))
async def test_hostile_bodies_are_a_400_envelope(client: httpx.AsyncClient, name: str) -> None:
    response = await post_raw(client, HOSTILE_BODIES[name])
    assert response.status_code == 400, (name, response.text)
    error = assert_envelope(response)
    message = str(error["message"])
    # written for people: no Python exception names or reprs
    for leak in ("Error", "Traceback", "None'", "sys.set_int_max_str_digits", "Input should"):
        assert leak not in message, message
    assert len(message) < 400
    # the envelope is plain ASCII JSON, whatever the client sent
    response.content.decode("ascii")


async def test_control_characters_in_input_are_spoken_as_spaces(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(SPEECH, json=speech_body("Hello\x07there\x1b[31m friend."))
    assert response.status_code == 200


async def test_messages_quote_client_strings_escaped(client: httpx.AsyncClient) -> None:
    response = await client.post(SPEECH, json=speech_body(model="m\n\u2028x" + "y" * 500))
    error = assert_envelope(response)
    message = str(error["message"])
    assert response.status_code == 404
    assert "\n" not in message and "\u2028" not in message and "y" * 100 not in message
    assert '"m\\n\\u2028x' in message


async def test_a_field_out_of_range_reads_as_a_sentence(client: httpx.AsyncClient) -> None:
    response = await client.post(SPEECH, json=speech_body(speed=10**30))
    error = assert_envelope(response)
    assert error["param"] == "speed"
    assert str(error["message"]).startswith("Invalid 'speed': it must be at most 4")
    response = await client.post(SPEECH, json=speech_body(speed=9.5))
    error = assert_envelope(response)
    assert str(error["message"]).startswith("Invalid 'speed': it must be at most 4")


# --- the fuzz test ------------------------------------------------------------------------

# Any code point, surrogates and NUL included.
any_text = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=40)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**80), max_value=10**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | any_text
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = ("model", "input", "voice", "instructions", "response_format", "speed")
FIELDS += ("stream_format", "sample_rate")
field_values = st.sampled_from(["tts-1", "sim", "Hi.", "wav", "sse", 1.0, 16000]) | json_values
bodies = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS) | any_text, field_values, max_size=9),
    st.fixed_dictionaries(
        {"model": st.just("tts-1"), "input": any_text, "voice": st.just("sim")},
        optional={f: field_values for f in FIELDS[3:]},
    ),
    json_values,
)


def encode_json(value: object) -> bytes:
    """JSON text as a client might send it: NaN allowed, surrogates as \\u escapes."""
    return json.dumps(value, ensure_ascii=True, allow_nan=True).encode()


nesting = st.integers(min_value=1, max_value=3000).map(
    lambda depth: b'{"model":' + b"[" * depth + b"]" * depth + b"}"
)
raw_bodies = bodies.map(encode_json) | nesting | st.binary(max_size=200)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=raw_bodies)
async def test_fuzzed_bodies_never_make_a_5xx(client: httpx.AsyncClient, body: bytes) -> None:
    response = await post_raw(client, body)
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert_envelope(response)
        response.content.decode("ascii")


@settings(max_examples=200, deadline=None)
@given(text=any_text)
def test_client_json_raises_only_its_own_error(text: str) -> None:
    for raw in (text, encode_json(text), text.encode("utf-8", "surrogatepass")):
        try:
            load_client_json(raw)
        except ClientJsonError as exc:
            assert exc.message
    assert quote(text).isascii()


# --- a 5xx closes its connection ----------------------------------------------------------


def test_a_5xx_says_connection_close_and_closes() -> None:
    with live_server(sim_settings()) as server:

        async def boom() -> None:
            raise RuntimeError("an internal detail")

        server.app.add_api_route("/boom", boom, methods=["POST"])
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(request_bytes(b"{}", server.port, path="/boom"))
            data = b""
            while chunk := sock.recv(65536):  # the server closes: recv returns b""
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 500")
        assert b"connection: close" in head.lower()
        error = json.loads(body)["error"]
        assert error["type"] == "server_error" and "internal detail" not in error["message"]


# --- logs ---------------------------------------------------------------------------------


def test_log_lines_escape_client_strings() -> None:
    formatter = EscapingFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord(
        "x", logging.INFO, __file__, 1, "model %s", ("a\nERROR forged\r\x1b[2J\u2028\ud800",), None
    )
    line = formatter.format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert line == "INFO model a\\x0aERROR forged\\x0d\\x1b[2J\\u2028\\ud800"
    assert escape_log_text("plain ascii, é, 日本") == "plain ascii, é, 日本"
    try:
        raise ValueError("x")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
        record.exc_text = None
    assert "Traceback (most recent call last):\n" in formatter.format(record)


async def test_input_text_is_not_logged_unless_debug(caplog: pytest.LogCaptureFixture) -> None:
    secret = "Margaret's password is swordfish"
    async with asgi_client(sim_settings()) as client:
        with caplog.at_level(logging.INFO):
            assert (await client.post(SPEECH, json=speech_body(secret))).status_code == 200
            await client.post(SPEECH, json=speech_body(secret, voice="nobody"))
            await client.post(SPEECH, json=speech_body(secret, model="no-such-model"))
    assert caplog.records
    assert all("swordfish" not in r.getMessage() for r in caplog.records)


# --- security settings --------------------------------------------------------------------


async def test_docs_pages_are_never_served_and_openapi_is_opt_in() -> None:
    async with asgi_client(sim_settings()) as client:
        for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
            assert (await client.get(path)).status_code == 404
    async with asgi_client(sim_settings("server.openapi=true")) as client:
        schema = (await client.get("/openapi.json")).json()
        assert "/v1/audio/speech" in schema["paths"]
        assert (await client.get("/docs")).status_code == 404


async def test_public_routes_open_only_what_the_operator_names() -> None:
    key = "server.api_key=k3y"
    async with asgi_client(sim_settings(key, "server.openapi=true")) as client:
        for path in ("/metrics", "/openapi.json", "/"):
            assert (await client.get(path)).status_code == 401
    opened = "server.public_routes=[metrics, openapi, page]"
    async with asgi_client(sim_settings(key, "server.openapi=true", opened)) as client:
        for path in ("/metrics", "/openapi.json", "/", "/static/app.js"):
            assert (await client.get(path)).status_code == 200, path
        assert (await client.get("/v1/models")).status_code == 401
        response = await client.get("/v1/models", headers={"authorization": "Bearer k3y"})
        assert response.status_code == 200


async def test_the_key_is_compared_whole() -> None:
    async with asgi_client(sim_settings("server.api_key=k3y")) as client:
        for token in (b"k3", b"k3yy", b"K3Y", b"k3y\x00", "ké3y".encode("latin-1"), b"\xff"):
            response = await client.get("/v1/models", headers={"authorization": b"Bearer " + token})
            assert_envelope(response)
            assert response.status_code == 401, token


async def test_cors_is_off_by_default_and_configurable() -> None:
    preflight = {
        "origin": "https://app.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type",
    }
    async with asgi_client(sim_settings()) as client:
        response = await client.options(SPEECH, headers=preflight)
        assert "access-control-allow-origin" not in response.headers
        response = await client.get("/health", headers={"origin": "https://app.example"})
        assert "access-control-allow-origin" not in response.headers
    origins = "server.cors_origins=[https://app.example]"
    async with asgi_client(sim_settings(origins, "server.api_key=k")) as client:
        response = await client.options(SPEECH, headers=preflight)
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == "https://app.example"
        response = await client.options(SPEECH, headers={**preflight, "origin": "https://evil"})
        assert response.headers.get("access-control-allow-origin") != "https://evil"
        response = await client.get(
            "/v1/models",
            headers={"origin": "https://app.example", "authorization": "Bearer k"},
        )
        assert response.headers["access-control-allow-origin"] == "https://app.example"
        exposed = response.headers["access-control-expose-headers"].lower().split(",")
        assert "server-timing" in [name.strip() for name in exposed]


@pytest.mark.parametrize("text", ["9" * 200, "$" + "9" * 150, "9" * 150 + "th", "1/" + "9" * 150])
async def test_a_number_too_long_for_words_is_read_digit_by_digit(
    client: httpx.AsyncClient, text: str
) -> None:
    response = await client.post(SPEECH, json=speech_body(text, response_format="pcm"))
    assert response.status_code == 200, response.text


def test_the_envelope_is_ascii_json_whatever_the_message_holds() -> None:
    from app.errors import InvalidRequest, error_response

    message = "bad \ud800 é \n 日本"
    response = error_response(InvalidRequest(message))
    body = bytes(response.body)
    body.decode("ascii")
    assert json.loads(body)["error"]["message"] == message

"""ElevenLabs' API (app/elevenlabs/) over a live uvicorn server, sim backend: formats,
errors in ElevenLabs' shape, the key, admission, the sockets' contexts (flush, close,
interruption, live text) and the alignment's two clocks. The real clients against the real
voice are in tests/test_elevenlabs_clients.py."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from collections.abc import Iterator
from typing import Any

import av
import httpx
import numpy as np
import pytest
import websockets
from api_support import (
    SLOW_TALKER,
    LiveServer,
    assert_alaw_like_pcm,
    engine_idle,
    expected_audio_s,
    live_server,
    metric_value,
    sim_settings,
)

from app.elevenlabs.socket_messages import ws_alignment
from app.settings import SettingsError, load_settings
from pipeline.alignment import CharTiming
from pipeline.normalize import normalize_mapped

TEXT = "Hello there. This is a test of the multi context socket."
KEY = "sk-test-key"


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    """A talker at 4x real time: a test can act while a context is mid-way."""
    with live_server(sim_settings(*SLOW_TALKER, "admission.enabled=false")) as live:
        yield live


@pytest.fixture(scope="module")
def fast() -> Iterator[LiveServer]:
    """The fast sim: for what the audio and its alignment are, not when they come."""
    with live_server(sim_settings("admission.enabled=false")) as live:
        yield live


def tts_url(server: LiveServer, path: str = "/stream", voice: str = "sim", fmt: str = "") -> str:
    query = f"?output_format={fmt}" if fmt else ""
    return f"{server.base_url}/v1/text-to-speech/{voice}{path}{query}"


def ws_url(server: LiveServer, kind: str, fmt: str = "pcm_24000", extra: str = "") -> str:
    base = server.base_url.replace("http://", "ws://")
    return f"{base}/v1/text-to-speech/sim/{kind}?output_format={fmt}{extra}"


async def _context_audio(
    ws: websockets.ClientConnection, context_id: str, *, timeout_s: float = 30.0
) -> tuple[bytes, list[dict[str, Any]]]:
    """Audio and messages of one context until its isFinal."""
    audio, messages = bytearray(), []
    async with asyncio.timeout(timeout_s):
        while True:
            message = json.loads(await ws.recv())
            if message.get("contextId") not in (None, context_id):
                continue
            messages.append(message)
            if message.get("audio"):
                audio += base64.b64decode(message["audio"])
            if message.get("isFinal") or ("error" in message and "contextId" not in message):
                return bytes(audio), messages


# HTTP


def test_stream_pcm_and_ulaw_have_the_length_of_the_text(fast: LiveServer) -> None:
    expected_s = expected_audio_s(fast.settings, TEXT)
    pcm = httpx.post(tts_url(fast, fmt="pcm_16000"), json={"text": TEXT}, timeout=30)
    assert pcm.status_code == 200 and pcm.headers["content-type"] == "audio/pcm"
    assert len(pcm.content) / 2 / 16000 == pytest.approx(expected_s, abs=0.01)
    ulaw = httpx.post(tts_url(fast, "", fmt="ulaw_8000"), json={"text": TEXT}, timeout=30)
    assert ulaw.status_code == 200 and ulaw.headers["content-type"] == "audio/basic"
    assert len(ulaw.content) / 8000 == pytest.approx(expected_s, abs=0.01)  # a byte a sample
    assert int(ulaw.headers["x-character-count"]) == len(TEXT)


@pytest.mark.parametrize("path", ["", "/stream", "/stream/with-timestamps", "/with-timestamps"])
def test_alaw_8000_on_every_http_route_is_the_pcm_in_g711_a_law(
    fast: LiveServer, path: str
) -> None:
    pcm = httpx.post(tts_url(fast, "", fmt="pcm_8000"), json={"text": TEXT}, timeout=30)
    response = httpx.post(tts_url(fast, path, fmt="alaw_8000"), json={"text": TEXT}, timeout=30)
    assert response.status_code == 200, response.text[:200]
    if path.endswith("with-timestamps"):
        lines = [json.loads(line) for line in response.text.splitlines() if line]
        audio = b"".join(base64.b64decode(line["audio_base64"]) for line in lines)
    else:
        assert response.headers["content-type"] == "audio/PCMA"
        assert int(response.headers["x-character-count"]) == len(TEXT)
        audio = response.content
    assert_alaw_like_pcm(audio, pcm.content, expected_audio_s(fast.settings, TEXT))


@pytest.mark.parametrize("kind", ["stream-input", "multi-stream-input"])
async def test_alaw_8000_on_both_sockets(fast: LiveServer, kind: str) -> None:
    text = "Hello there. How are you?"
    async with websockets.connect(ws_url(fast, kind, "alaw_8000")) as ws:
        if kind == "stream-input":
            await ws.send(json.dumps({"text": text + " "}))
            await ws.send(json.dumps({"text": ""}))
            audio, _ = await _context_audio(ws, "default")
        else:
            await ws.send(json.dumps({"text": text + " ", "context_id": "a"}))
            await ws.send(json.dumps({"context_id": "a", "flush": True}))
            await ws.send(json.dumps({"context_id": "a", "close_context": True}))
            audio, _ = await _context_audio(ws, "a")
    async with httpx.AsyncClient(timeout=30) as client:
        pcm = await client.post(tts_url(fast, "", fmt="pcm_8000"), json={"text": text})
    assert_alaw_like_pcm(audio, pcm.content, expected_audio_s(fast.settings, text))


def test_default_format_is_mp3_44100_128(server: LiveServer) -> None:
    response = httpx.post(tts_url(server, ""), json={"text": "Hello there."}, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("audio/")  # LiveKit requires audio/*
    with av.open(io.BytesIO(response.content), format="mp3") as container:
        stream = container.streams.audio[0]
        assert stream.rate == 44100 and stream.codec_context.bit_rate == 128000


def test_stream_with_timestamps_is_json_lines_of_audio(fast: LiveServer) -> None:
    response = httpx.post(
        tts_url(fast, "/stream/with-timestamps", fmt="pcm_24000"), json={"text": TEXT}
    )
    assert response.status_code == 200
    lines = [json.loads(line) for line in response.text.splitlines() if line]
    assert all(set(line) == {"audio_base64", "alignment", "normalized_alignment"} for line in lines)
    audio = b"".join(base64.b64decode(line["audio_base64"]) for line in lines)
    expected_s = expected_audio_s(fast.settings, TEXT)
    assert len(audio) / 2 / 24000 == pytest.approx(expected_s, abs=0.01)
    whole = httpx.post(tts_url(fast, "/with-timestamps", fmt="pcm_24000"), json={"text": TEXT})
    assert len(base64.b64decode(whole.json()["audio_base64"])) == len(audio)


@pytest.mark.parametrize(
    ("path", "body", "fmt", "status", "code"),
    [
        ("/stream", "not json", "", 400, "invalid_json"),
        ("/stream", {"model_id": "eleven_flash_v2_5"}, "", 400, "missing_required_parameter"),
        ("/stream", {"text": "  "}, "", 400, "invalid_text"),
        ("/stream", {"text": "Hi.", "voice_settings": {"speed": 9}}, "", 400, "invalid_value"),
        ("/stream", {"text": "Hi."}, "alaw_16000", 400, "invalid_output_format"),
        ("/stream", {"text": "Hi."}, "alaw_8000_64", 400, "invalid_output_format"),
        ("/stream", {"text": "Hi."}, "mp3_44100", 400, "invalid_output_format"),
        ("/stream", {"text": "Hi."}, "wav_44100", 400, "invalid_output_format"),
        ("/stream", {"text": "x" * 5000}, "", 400, "max_character_limit_exceeded"),
    ],
)
def test_bad_input_is_a_400_in_elevenlabs_shape(
    server: LiveServer, path: str, body: object, fmt: str, status: int, code: str
) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    response = httpx.post(tts_url(server, path, fmt=fmt), content=content, timeout=10)
    assert response.status_code == status
    detail = response.json()["detail"]
    assert detail["status"] == code and detail["message"]


def test_unknown_voice_is_a_404_and_elevenlabs_ids_take_the_default(server: LiveServer) -> None:
    missing = httpx.post(tts_url(server, voice="no-such-voice"), json={"text": "Hi."})
    assert missing.status_code == 404
    assert missing.json()["detail"]["status"] == "voice_not_found"
    default = httpx.post(tts_url(server, voice="hpp4J3VqNfWAUOO0d1Us"), json={"text": "Hi."})
    assert default.status_code == 200  # LiveKit's default voice id: the default voice


def test_voices_and_models(server: LiveServer) -> None:
    voices = httpx.get(server.base_url + "/v1/voices").json()
    assert [v["voice_id"] for v in voices["voices"]] == ["sim"]
    assert {"name", "category"} <= set(voices["voices"][0])
    elevenlabs = httpx.get(server.base_url + "/v1/models", headers={"xi-api-key": "k"}).json()
    assert "eleven_flash_v2_5" in [m["model_id"] for m in elevenlabs]
    assert all(m["can_do_text_to_speech"] for m in elevenlabs)
    openai = httpx.get(server.base_url + "/v1/models").json()  # the shared path's other API
    assert openai["object"] == "list"


def test_the_key_in_xi_api_key_and_a_401_in_elevenlabs_shape() -> None:
    with live_server(sim_settings(f"server.api_key={KEY}")) as live:
        url = tts_url(live, fmt="pcm_24000")
        ok = httpx.post(url, json={"text": "Hi."}, headers={"xi-api-key": KEY})
        assert ok.status_code == 200
        for headers in ({}, {"xi-api-key": "wrong"}):
            refused = httpx.post(url, json={"text": "Hi."}, headers=headers)
            assert refused.status_code == 401
            assert refused.json()["detail"]["status"] in ("needs_authorization", "invalid_api_key")
        # the OpenAI route takes the same key in its own header, and answers its own shape
        openai = httpx.post(
            live.base_url + "/v1/audio/speech",
            json={"model": "tts-1", "input": "Hi.", "voice": "sim"},
            headers={"xi-api-key": "wrong"},
        )
        assert openai.status_code == 401 and "detail" in openai.json()

        async def sockets() -> None:
            with pytest.raises(websockets.InvalidStatus) as denied:
                async with websockets.connect(ws_url(live, "multi-stream-input")):
                    pass
            assert denied.value.response.status_code == 401
            assert json.loads(denied.value.response.body)["detail"]["status"]
            headers = {"xi-api-key": KEY}
            async with websockets.connect(
                ws_url(live, "stream-input"), additional_headers=headers
            ) as ws:
                await ws.send(json.dumps({"text": "Hello. "}))
                await ws.send(json.dumps({"text": ""}))
                audio, messages = await _context_audio(ws, "default")
            assert audio and messages[-1] == {"isFinal": True}

        asyncio.run(sockets())


def test_capacity_is_a_429_with_retry_after_and_a_socket_error() -> None:
    with live_server(sim_settings(*SLOW_TALKER, "admission.max_streams=1")) as live:

        async def run() -> None:
            async with websockets.connect(ws_url(live, "multi-stream-input")) as ws:
                await ws.send(json.dumps({"text": "Held open. ", "context_id": "held"}))
                while not json.loads(await ws.recv()).get("audio"):
                    pass  # the first context plays: the engine is full
                response = httpx.post(tts_url(live, fmt="pcm_24000"), json={"text": "Hi."})
                assert response.status_code == 429
                assert int(response.headers["Retry-After"]) >= 1
                assert response.json()["detail"]["status"] == "too_many_concurrent_requests"
                await ws.send(json.dumps({"text": "Refused. ", "context_id": "second"}))
                error = json.loads(await ws.recv())
                while error.get("contextId") != "second":
                    error = json.loads(await ws.recv())
                assert error["error"] == "too_many_concurrent_requests" and error["code"] == 429
                assert error["context_id"] == "second" and error["retry_after_s"] >= 1
                final = json.loads(await ws.recv())
                while final.get("contextId") != "second":
                    final = json.loads(await ws.recv())
                assert final == {"isFinal": True, "contextId": "second"}
                await ws.send(json.dumps({"context_id": "held", "close_context": True}))
                await _context_audio(ws, "held")  # the socket stayed open

        asyncio.run(run())
        metrics = live.metrics()
        assert (
            metric_value(
                metrics,
                "playhead_protocol_streams_total",
                'outcome="rejected",protocol="elevenlabs"',
            )
            >= 2
        )


# Sockets


async def test_flush_then_close_context_ends_with_all_audio_and_is_final(
    server: LiveServer,
) -> None:
    async with websockets.connect(ws_url(server, "multi-stream-input")) as ws:
        await ws.send(json.dumps({"text": " ", "context_id": "c1", "voice_settings": {}}))
        for sentence in ("Hello there. ", "This is a test of the multi context socket. "):
            await ws.send(json.dumps({"text": sentence, "context_id": "c1"}))
        await ws.send(json.dumps({"text": ""}))  # a keep-alive changes nothing
        await ws.send(json.dumps({"context_id": "c1", "flush": True}))
        await ws.send(json.dumps({"context_id": "c1", "close_context": True}))
        audio, messages = await _context_audio(ws, "c1")
    text = "Hello there. This is a test of the multi context socket."
    expected_s = expected_audio_s(server.settings, text)
    assert len(audio) / 2 / 24000 == pytest.approx(expected_s, abs=0.01)
    assert messages[-1] == {"isFinal": True, "contextId": "c1"}
    assert all(m["contextId"] == "c1" for m in messages)
    assert engine_idle(server)


async def test_close_context_without_flush_interrupts_within_one_chunk(
    server: LiveServer,
) -> None:
    long_text = " ".join(["This sentence is one of many that make a long answer."] * 6)
    async with websockets.connect(ws_url(server, "multi-stream-input")) as ws:
        await ws.send(json.dumps({"text": long_text + " ", "context_id": "talk"}))
        chunk_sizes: list[int] = []
        while len(chunk_sizes) < 2:
            message = json.loads(await ws.recv())
            if message.get("audio"):
                chunk_sizes.append(len(base64.b64decode(message["audio"])))
        await ws.send(json.dumps({"context_id": "talk", "close_context": True}))
        after, messages = await _context_audio(ws, "talk", timeout_s=5)
    assert messages[-1] == {"isFinal": True, "contextId": "talk"}
    assert len(after) <= max(chunk_sizes)  # at most the chunk that was on its way
    full_s = expected_audio_s(server.settings, long_text)
    assert (sum(chunk_sizes) + len(after)) / 2 / 24000 < full_s / 2
    assert engine_idle(server)  # the engine stream is freed


async def test_live_text_speaks_its_first_sentence_before_the_rest_arrives(
    server: LiveServer,
) -> None:
    async with websockets.connect(ws_url(server, "multi-stream-input")) as ws:
        await ws.send(json.dumps({"text": "The first sentence is complete. ", "context_id": "a"}))
        await ws.send(json.dumps({"text": "The second one is still ", "context_id": "a"}))
        async with asyncio.timeout(5):  # no flush, no close: the first sentence speaks
            while not json.loads(await ws.recv()).get("audio"):
                pass
        await ws.send(json.dumps({"text": "being written. ", "context_id": "a"}))
        await ws.send(json.dumps({"text": "", "flush": True, "context_id": "a"}))  # LiveKit's
        await ws.send(json.dumps({"context_id": "a", "close_context": True}))
        await _context_audio(ws, "a")


async def test_a_flush_speaks_an_unfinished_sentence_and_the_context_goes_on(
    server: LiveServer,
) -> None:
    """ElevenLabs' `flush`: the text so far is spoken now, though its sentence has not
    ended; the context stays open for more."""
    first, rest = "The words before the flush ", "and the words after it. "
    async with websockets.connect(ws_url(server, "multi-stream-input")) as ws:
        await ws.send(json.dumps({"text": first, "context_id": "f"}))
        await ws.send(json.dumps({"context_id": "f", "flush": True}))
        audio = bytearray()
        expected_first_s = expected_audio_s(server.settings, first.strip())
        async with asyncio.timeout(5):
            while len(audio) / 2 / 24000 < expected_first_s - 0.01:
                message = json.loads(await ws.recv())
                assert not message.get("isFinal"), message
                audio += base64.b64decode(message.get("audio") or "")
        await ws.send(json.dumps({"text": rest, "context_id": "f"}))
        await ws.send(json.dumps({"context_id": "f", "flush": True}))
        await ws.send(json.dumps({"context_id": "f", "close_context": True}))
        after, messages = await _context_audio(ws, "f")
    assert messages[-1] == {"isFinal": True, "contextId": "f"}
    assert len(audio) / 2 / 24000 == pytest.approx(expected_first_s, abs=0.01)
    assert len(after) / 2 / 24000 == pytest.approx(
        expected_audio_s(server.settings, rest.strip()), abs=0.01
    )


async def test_two_contexts_and_the_socket_closes_on_close_socket(server: LiveServer) -> None:
    async with websockets.connect(ws_url(server, "multi-stream-input", "mp3_22050_32")) as ws:
        for context_id in ("one", "two"):
            await ws.send(json.dumps({"text": "Hello there. ", "context_id": context_id}))
            await ws.send(json.dumps({"text": "How are you? ", "context_id": context_id}))
            await ws.send(json.dumps({"context_id": context_id, "flush": True}))
            await ws.send(json.dumps({"context_id": context_id, "close_context": True}))
        audio: dict[str, bytearray] = {"one": bytearray(), "two": bytearray()}
        finals = set()
        while finals != {"one", "two"}:
            message = json.loads(await ws.recv())
            if message.get("audio"):
                audio[message["contextId"]] += base64.b64decode(message["audio"])
            if message.get("isFinal"):
                finals.add(message["contextId"])
        await ws.send(json.dumps({"close_socket": True}))
        with pytest.raises(websockets.ConnectionClosedOK):
            await ws.recv()
    # each context is one continuous mp3 stream (LiveKit's decoder needs that)
    expected_s = expected_audio_s(server.settings, "Hello there. How are you?")
    for data in audio.values():
        with av.open(io.BytesIO(bytes(data)), format="mp3") as container:
            decoded = sum(f.samples for f in container.decode(audio=0)) / 22050
        assert expected_s <= decoded <= expected_s + 0.08


async def test_bad_messages_get_an_error_and_the_socket_stays(server: LiveServer) -> None:
    async with websockets.connect(ws_url(server, "multi-stream-input")) as ws:
        for bad in ("not json", "[1, 2]", json.dumps({"text": 5, "context_id": "x"})):
            await ws.send(bad)
            error = json.loads(await ws.recv())
            assert error["error"] and error["message"]
        await ws.send(json.dumps({"text": "Still here. ", "context_id": "ok"}))
        await ws.send(json.dumps({"context_id": "ok", "flush": True}))
        await ws.send(json.dumps({"context_id": "ok", "close_context": True}))
        audio, _ = await _context_audio(ws, "ok")
        assert audio
    with pytest.raises(websockets.InvalidStatus) as denied:
        async with websockets.connect(ws_url(server, "multi-stream-input", "flac_44100")):
            pass
    assert denied.value.response.status_code == 400


async def test_the_single_socket_ends_with_is_final_and_closes(server: LiveServer) -> None:
    started = time.monotonic()
    async with websockets.connect(ws_url(server, "stream-input")) as ws:
        await ws.send(json.dumps({"text": " ", "voice_settings": {"speed": 1.0}}))
        await ws.send(json.dumps({"text": "Hello there. ", "try_trigger_generation": True}))
        await ws.send(json.dumps({"text": ""}))
        audio, messages = await _context_audio(ws, "default")
        assert messages[-1] == {"isFinal": True}
        with pytest.raises(websockets.ConnectionClosedOK):
            await ws.recv()
    audio_s = expected_audio_s(server.settings, "Hello there.")
    assert len(audio) / 2 / 24000 == pytest.approx(audio_s, abs=0.01)
    assert time.monotonic() - started < audio_s + 2.0  # every message handled as it came


def _chars(text: str, step_s: float = 0.05) -> list[CharTiming]:
    return [CharTiming(i, c, i * step_s, step_s) for i, c in enumerate(text)]


def test_alignment_clocks_sync_and_restarting() -> None:
    chars = _chars("Hello world again")
    pieces = (chars[:4], chars[4:11], chars[11:])
    base: int | None = None
    absolute = []
    for piece in pieces:
        message, base = ws_alignment(piece, base)
        assert message is not None
        absolute += message["charStartTimesMs"]
    assert absolute == [round(c.start_s * 1000) for c in chars]  # sync: the context's clock
    # restarting at zero where the last message ended: pipecat's running sum gets them back
    base, clock_ms, rebuilt = 0, 0, []
    for piece in pieces:
        message, base = ws_alignment(piece, base)
        assert message is not None and message["charStartTimesMs"][0] <= 50
        rebuilt += [clock_ms + s for s in message["charStartTimesMs"]]
        clock_ms += message["charStartTimesMs"][-1] + message["charDurationsMs"][-1]
    assert rebuilt == absolute
    assert ws_alignment([], 120) == (None, 120)
    assert np.all(np.diff(absolute) >= 0)


def spoken_text(server: LiveServer, text: str) -> str:
    """`text` as the sim voice says it (the server's normaliser)."""
    language = server.app.state.playhead.engine.resolve_voice("sim").language
    return str(normalize_mapped(text, language, server.settings.normalize))


def check_http_alignment(alignment: dict[str, list[Any]], text: str, audio_s: float) -> None:
    """The characters join to `text`; starts never decrease, each end after its start,
    the last character ending with the audio."""
    assert "".join(alignment["characters"]) == text
    starts = alignment["character_start_times_seconds"]
    ends = alignment["character_end_times_seconds"]
    assert len(starts) == len(ends) == len(text)
    assert starts == sorted(starts)
    assert all(0 <= start <= end for start, end in zip(starts, ends, strict=True))
    assert ends[-1] == pytest.approx(audio_s, abs=0.002)


def test_alignment_is_of_the_text_as_sent_and_normalized_of_the_spoken(
    fast: LiveServer,
) -> None:
    text = "It costs $5. Call me at 10 tomorrow."
    spoken = spoken_text(fast, text)
    assert "five dollars" in spoken and "ten" in spoken  # what the voice says
    whole = httpx.post(tts_url(fast, "/with-timestamps", fmt="pcm_24000"), json={"text": text})
    body = whole.json()
    audio_s = len(base64.b64decode(body["audio_base64"])) / 2 / 24000
    check_http_alignment(body["alignment"], text, audio_s)  # "$5", not "five dollars"
    normalized = body["normalized_alignment"]
    check_http_alignment(normalized, spoken, audio_s)  # "five dollars", each its own time
    # the spoken words have their own times, "dollars" after "five", both within the
    # time the client's alignment gives "$5." (the span they stand for)
    n_starts = normalized["character_start_times_seconds"]
    five, dollars = spoken.index("five"), spoken.index("dollars")
    assert n_starts[five] < n_starts[dollars]
    c_starts = body["alignment"]["character_start_times_seconds"]
    c_ends = body["alignment"]["character_end_times_seconds"]
    dollar = text.index("$5.")
    assert c_starts[dollar] == pytest.approx(n_starts[five], abs=0.002)
    assert n_starts[dollars] < c_ends[dollar + 2]
    # streamed as JSON lines, the same two texts, piece by piece
    response = httpx.post(
        tts_url(fast, "/stream/with-timestamps", fmt="pcm_24000"), json={"text": text}
    )
    lines = [json.loads(line) for line in response.text.splitlines() if line]
    joined = {"alignment": "", "normalized_alignment": ""}
    for line in lines:
        for key in joined:
            if line[key] is not None:
                joined[key] += "".join(line[key]["characters"])
    assert joined == {"alignment": text, "normalized_alignment": spoken}


def test_normalization_off_gives_two_alignments_of_the_text_as_sent(server: LiveServer) -> None:
    text = "It costs $5."
    body = {"text": text, "apply_text_normalization": "off"}
    whole = httpx.post(tts_url(server, "/with-timestamps", fmt="pcm_24000"), json=body).json()
    audio_s = len(base64.b64decode(whole["audio_base64"])) / 2 / 24000
    check_http_alignment(whole["alignment"], text, audio_s)
    check_http_alignment(whole["normalized_alignment"], text, audio_s)


async def test_socket_alignment_restarts_or_counts_from_the_context(fast: LiveServer) -> None:
    """Both alignments, each on its own clock: `alignment` of the text as sent,
    `normalizedAlignment` of the text as spoken ("five dollars" for "$5")."""
    pieces = ("It costs $5. ", "Call me at 10 tomorrow. ")
    spoken = spoken_text(fast, "".join(pieces))
    for extra, sync in (("&sync_alignment=true", True), ("", False)):
        async with websockets.connect(ws_url(fast, "multi-stream-input", extra=extra)) as ws:
            for piece in pieces:
                await ws.send(json.dumps({"text": piece, "context_id": "t"}))
            await ws.send(json.dumps({"context_id": "t", "flush": True}))
            await ws.send(json.dumps({"context_id": "t", "close_context": True}))
            audio, messages = await _context_audio(ws, "t")
        audio_ms = len(audio) / 2 / 24
        for key in ("alignment", "normalizedAlignment"):
            chars, starts, clock_ms = [], [], 0
            for message in messages:
                alignment = message.get(key)
                if alignment:
                    chars += alignment["chars"]
                    # sync: the context's clock; else pipecat's running sum of the spans
                    starts += [s + (0 if sync else clock_ms) for s in alignment["charStartTimesMs"]]
                    last_ms = alignment["charStartTimesMs"][-1] + alignment["charDurationsMs"][-1]
                    clock_ms += last_ms
            if key == "alignment":
                assert "".join(chars) == "".join(pieces)
            else:  # the live normaliser's words are the whole text's
                assert "".join(chars).split() == spoken.split()
                assert "five dollars" in "".join(chars)
            assert starts == sorted(starts), (key, sync)
            assert starts[-1] <= audio_ms
            if not sync:
                assert clock_ms <= audio_ms + 1


async def test_socket_limits_nul_contexts_size_and_inactivity(server: LiveServer) -> None:
    async with websockets.connect(ws_url(server, "multi-stream-input")) as ws:
        await ws.send(json.dumps({"text": "Bad\x00text. ", "context_id": "nul"}))
        error = json.loads(await ws.recv())
        assert error["error"] == "invalid_text" and error["contextId"] == "nul"
        for n in range(6):  # five contexts may be open at once
            await ws.send(json.dumps({"text": " ", "context_id": f"c{n}"}))
        error = json.loads(await ws.recv())
        assert error["error"] == "max_active_contexts_exceeded" and error["contextId"] == "c5"
        limit = server.settings.websocket.max_message_bytes
        await ws.send(json.dumps({"text": "x" * limit, "context_id": "c0"}))
        error = json.loads(await ws.recv())
        assert error["error"] == "message_too_large"
        finals = set()
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:  # the open contexts end (isFinal each), then the socket closes
                finals.add(json.loads(await ws.recv())["contextId"])
        assert finals == {f"c{n}" for n in range(5)}
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    started = time.monotonic()
    extra = "&inactivity_timeout=1"
    async with websockets.connect(ws_url(server, "multi-stream-input", extra=extra)) as ws:
        error = json.loads(await ws.recv())  # nothing sent: closed after about a second
        assert error["error"] == "input_timeout_exceeded"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert 1.0 <= time.monotonic() - started < 3.0


def test_the_sdk_reads_voices_models_and_whole_timestamps(server: LiveServer) -> None:
    from elevenlabs import ElevenLabs

    client = ElevenLabs(base_url=server.base_url, api_key="any")
    assert [v.voice_id for v in client.voices.get_all().voices] == ["sim"]
    assert "eleven_flash_v2_5" in [m.model_id for m in client.models.list()]
    whole = client.text_to_speech.convert_with_timestamps(
        "sim", text="Hello there.", output_format="pcm_24000"
    )
    assert whole.alignment is not None
    assert "".join(whole.alignment.characters) == "Hello there."
    audio_s = len(base64.b64decode(whole.audio_base_64)) / 2 / 24000
    assert audio_s == pytest.approx(expected_audio_s(server.settings, "Hello there."), abs=0.01)
    # the SDK asks for A-law by ElevenLabs' name, and takes what comes back
    alaw = b"".join(client.text_to_speech.convert("sim", text="Hi.", output_format="alaw_8000"))
    assert len(alaw) / 8000 == pytest.approx(expected_audio_s(server.settings, "Hi."), abs=0.01)


def test_a_client_leaving_mid_stream_frees_its_engine_stream(server: LiveServer) -> None:
    long_text = " ".join(["This sentence is one of many that make a long answer."] * 6)
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", tts_url(server, fmt="pcm_24000"), json={"text": long_text}) as r,
    ):
        assert r.status_code == 200
        next(r.iter_raw())  # the first audio, then the client hangs up
    left_s = time.monotonic()
    assert engine_idle(server, timeout_s=1.0)
    assert time.monotonic() - left_s < 1.0


# Every malformed message is answered at once (issue #55): the multi-context socket goes on,
# the single one closes (1008) after the error, as for any refused message there.
MULTI_MALFORMED = [
    ({"context_id": "m"}, "invalid_message", "text"),  # no text, nothing to control
    ({"text": None, "context_id": "m"}, "invalid_message", "text"),
    ({"context_id": "nowhere", "close_context": True}, "context_not_found", '"nowhere"'),
    ({"context_id": "nowhere", "flush": True}, "context_not_found", '"nowhere"'),
    ({"text": "", "context_id": "nowhere", "flush": True}, "context_not_found", '"nowhere"'),
    ({"text": "Hi. ", "context_id": "m", "flush": "yes"}, "invalid_message", "flush"),
    ({"context_id": "m", "close_context": 1}, "invalid_message", "close_context"),
    (
        {"text": " ", "context_id": "m", "voice_settings": [1]},
        "invalid_message",
        "voice_settings",
    ),
]


async def test_each_malformed_multi_message_is_answered_at_once_and_the_socket_goes_on(
    server: LiveServer,
) -> None:
    async with websockets.connect(ws_url(server, "multi-stream-input")) as ws:
        for bad, code, param in MULTI_MALFORMED:
            await ws.send(json.dumps(bad))
            async with asyncio.timeout(1.0):  # at once, not at the inactivity timeout
                error = json.loads(await ws.recv())
            assert error["error"] == code, (bad, error)
            assert error["contextId"] == bad["context_id"] and error["message"], (bad, error)
            if param is not None:
                assert param in error["message"], (bad, error)
        # what the protocol allows without text is still quiet: keep-alives of either kind
        for quiet in (
            {"text": "", "context_id": "nowhere"},
            {"context_id": "k", "keep_alive": True},
        ):
            await ws.send(json.dumps(quiet))
        await ws.send(json.dumps({"text": "Still here. ", "context_id": "ok"}))
        await ws.send(json.dumps({"context_id": "ok", "flush": True}))
        await ws.send(json.dumps({"context_id": "ok", "close_context": True}))
        audio, messages = await _context_audio(ws, "ok")
        assert audio and messages[-1] == {"isFinal": True, "contextId": "ok"}
        # the context ended with isFinal: closing it again names a context that is gone
        await ws.send(json.dumps({"context_id": "ok", "close_context": True}))
        async with asyncio.timeout(1.0):
            error = json.loads(await ws.recv())
        assert error["error"] == "context_not_found" and error["contextId"] == "ok"


@pytest.mark.parametrize(
    "first", [{"voice_settings": {"speed": 1.0}}, {"text": None}, {"flush": True}]
)
async def test_a_single_socket_message_without_text_is_answered_at_once(
    server: LiveServer, first: dict[str, Any]
) -> None:
    async with websockets.connect(ws_url(server, "stream-input")) as ws:
        await ws.send(json.dumps(first))
        async with asyncio.timeout(1.0):
            error = json.loads(await ws.recv())
            assert error["error"] == "invalid_message" and "text is required" in error["message"]
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


async def test_the_contexts_per_socket_are_the_setting() -> None:
    with live_server(sim_settings("websocket.max_contexts=2", "admission.enabled=false")) as live:
        async with websockets.connect(ws_url(live, "multi-stream-input")) as ws:
            for n in range(3):
                await ws.send(json.dumps({"text": " ", "context_id": f"c{n}"}))
            async with asyncio.timeout(2.0):
                error = json.loads(await ws.recv())
    assert error["error"] == "max_active_contexts_exceeded" and error["contextId"] == "c2"
    assert error["message"].startswith("At most 2 contexts")
    with pytest.raises(SettingsError, match=r"websocket\.max_contexts: "):
        load_settings(None, ["websocket.max_contexts=0"], environ={})

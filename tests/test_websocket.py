"""WS /v1/audio/speech/stream end to end over a live uvicorn server (sim backend): live
text, utterances, barge-in, admission, bad messages and every limit."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
from api_support import LiveServer, expected_audio_s, live_server, sim_settings
from ws_client import connect, speak

from pipeline.backends.sim import decode_sim_signal
from pipeline.normalize import normalize_text

CONFIG = {"voice": "sim", "response_format": "pcm"}
FIRST = "Hello there, this is live text arriving in pieces. "
REST = "A second sentence follows it, and a third one ends it. "
TEXT = FIRST + REST


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(sim_settings()) as live:
        yield live


def _engine_streams(server: LiveServer) -> int:
    engine = server.app.state.playhead.engine
    stats = engine.stats()
    return stats.active_streams + stats.draining_streams


async def _wait_engine_idle(server: LiveServer, timeout_s: float = 5.0) -> int:
    """Polls the engine (another thread) until it holds no stream; returns how many remain."""
    for _ in range(int(timeout_s / 0.02)):
        if _engine_streams(server) == 0:
            return 0
        await asyncio.sleep(0.02)
    return _engine_streams(server)


def _frames(server: LiveServer, pcm: np.ndarray) -> list[tuple[int, int]]:
    return decode_sim_signal(pcm, server.settings.sim.samples_per_frame)


async def test_audio_starts_before_the_text_is_done(server: LiveServer) -> None:
    async with connect(server.base_url, config=CONFIG) as client:
        await client.send("input.text", text=FIRST)
        start = await client.until("audio.start")  # no input.done yet: the first fragment
        assert start.event == {
            "type": "audio.start",
            "utterance": 0,
            "sample_rate": 24000,
            "format": "pcm",
        }
        for word in REST.split(" "):
            await client.send("input.text", text=word + " ")
        await client.send("input.done")
        done = (await client.until("audio.done")).event
    pcm = client.pcm(0)
    assert done == {"type": "audio.done", "utterance": 0, "audio_ms": pytest.approx(pcm.size / 24)}
    # The pieces segment like the whole text, in one engine stream (one tag, frames in order).
    assert pcm.size / 24000 == pytest.approx(expected_audio_s(server.settings, TEXT), abs=1e-3)
    frames = _frames(server, pcm)
    assert len({tag for tag, _ in frames}) == 1
    assert [index for _, index in frames] == list(range(len(frames)))


async def test_two_utterances_on_one_socket(server: LiveServer) -> None:
    second = "Now a second utterance. It has two sentences. "
    async with connect(server.base_url, config={**CONFIG, "response_format": "wav"}) as client:
        await speak(client, TEXT)
        # The next utterance starts while nothing else is said; its audio follows.
        done = await speak(client, second)
        assert done["utterance"] == 1 and "cancelled" not in done
        starts = client.events("audio.start")
    assert [s["utterance"] for s in starts] == [0, 1]
    for index, text in ((0, TEXT), (1, second)):
        data = bytes(client.audio[index])
        assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"  # each utterance is one wav file
        samples = np.frombuffer(data[44:], dtype="<i2")
        assert samples.size / 24000 == pytest.approx(
            expected_audio_s(server.settings, text), abs=1e-3
        )
    tags = [
        {t for t, _ in _frames(server, np.frombuffer(client.audio[i][44:], "<i2"))} for i in (0, 1)
    ]
    assert len(tags[0]) == len(tags[1]) == 1 and tags[0] != tags[1]


async def test_a_second_utterance_sent_during_the_first_is_spoken_after_it(
    server: LiveServer,
) -> None:
    async with connect(server.base_url, config=CONFIG) as client:
        for text in (TEXT, "And then this. "):
            await client.send("input.text", text=text)
            await client.send("input.done")
        await client.until(lambda e: e["type"] == "audio.done" and e["utterance"] == 1)
        order = [(e["type"], e["utterance"]) for e in client.events() if "utterance" in e]
    assert order == [("audio.start", 0), ("audio.done", 0), ("audio.start", 1), ("audio.done", 1)]
    assert client.pcm(1).size / 24000 == pytest.approx(
        expected_audio_s(server.settings, "And then this. "), abs=1e-3
    )


async def test_speed_and_sample_rate_apply_to_the_socket(server: LiveServer) -> None:
    config = {**CONFIG, "speed": 2.0, "sample_rate": 16000}
    async with connect(server.base_url, config=config) as client:
        await speak(client, TEXT)
    start = client.events("audio.start")[0]
    assert start["sample_rate"] == 16000
    seconds = client.pcm(0).size / 16000
    assert seconds == pytest.approx(expected_audio_s(server.settings, TEXT, speed=2.0), abs=0.01)


async def test_session_close_answers_session_closed(server: LiveServer) -> None:
    async with connect(server.base_url, config=CONFIG) as client:
        await client.send("session.close")
        code, events = await client.closed()
    assert code == 1000
    assert events == [{"type": "session.closed"}]


async def test_session_close_cancels_what_is_in_progress(server: LiveServer) -> None:
    long_text = "This utterance is long enough to be closed on. " * 40
    async with connect(server.base_url, config=CONFIG) as client:
        await client.send("input.text", text=long_text)
        await client.until("audio.start")
        await client.send("session.close")
        code, events = await client.closed()
    assert code == 1000
    assert [e["type"] for e in events] == ["audio.done", "session.closed"]
    assert events[0]["cancelled"] is True
    assert await _wait_engine_idle(server) == 0


async def test_a_dropped_socket_frees_its_streams(server: LiveServer) -> None:
    long_text = "This utterance is long enough to be cut off. " * 40
    async with connect(server.base_url, config=CONFIG) as client:
        await client.send("input.text", text=long_text)
        await client.until("audio.start")
        assert _engine_streams(server) == 1
    # The client left without a word (no cancel, no input.done).
    assert await _wait_engine_idle(server) == 0


BAD_MESSAGES = [
    ("not json", "invalid_json", None),
    ("[1, 2]", "invalid_type", None),
    ('{"text": "no type"}', "missing_required_parameter", "type"),
    ('{"type": "input.txt", "text": "typo"}', "unknown_type", "type"),
    ('{"type": "input.text", "text": 5}', "invalid_type", "text"),
    ('{"type": "input.text"}', "missing_required_parameter", "text"),
    ('{"type": "input.text", "text": "a\\u0000b"}', "invalid_value", "text"),  # as on HTTP
    ('{"type": "input.done", "now": true}', "unknown_parameter", "now"),
    ('{"type": "playback.position", "played_ms": -1}', "invalid_value", "played_ms"),
    ('{"type": "playback.position", "played_ms": "1"}', "invalid_type", "played_ms"),
    ('{"type": "session.config", "response_format": "mp3"}', "invalid_value", "response_format"),
    ('{"type": "session.config", "voice": "nobody"}', "voice_not_found", "voice"),
    ('{"type": "session.config", "speed": 9}', "invalid_value", "speed"),
    ('{"type": "input.done"}', "no_utterance", None),
    ('{"type": "playback.position", "played_ms": 5, "utterance": 3}', "no_utterance", "utterance"),
    ('{"type": "playback.position", "played_ms": 5, "utterance": -1}', "no_utterance", "utterance"),
    ('{"type": "playback.position", "played_ms": 5, "utterance": []}', "invalid_type", "utterance"),
    (b"\x00\x01", "invalid_type", None),
]


@pytest.mark.parametrize(("raw", "code", "param"), BAD_MESSAGES)
async def test_a_bad_message_gets_an_error_event_and_the_socket_stays(
    server: LiveServer, raw: str | bytes, code: str, param: str | None
) -> None:
    async with connect(server.base_url, config=CONFIG) as client:
        await client.send_raw(raw)
        error = (await client.until("error")).event
        assert error["error"]["code"] == code
        assert error["error"]["param"] == param
        assert error["error"]["type"] == "invalid_request_error"
        assert set(error["error"]) == {"message", "type", "param", "code"}
        done = await speak(client, "Still here. ")  # the session goes on as configured
    assert done["utterance"] == 0 and "cancelled" not in done
    assert client.pcm(0).size > 0


async def test_the_first_message_must_be_session_config(server: LiveServer) -> None:
    async with connect(server.base_url) as client:
        await client.send("input.text", text="Hello. ")
        code, events = await client.closed()
    assert code == 1008
    assert [e["error"]["code"] for e in events] == ["session_config_required"]


async def test_api_key_on_the_socket() -> None:
    with live_server(sim_settings("server.api_key=sk-ws")) as live:
        async with connect(live.base_url) as client:  # refused before any message
            code, events = await client.closed()
        assert code == 1008
        assert [e["error"]["code"] for e in events] == ["missing_api_key"]
        async with connect(live.base_url, query="?api_key=wrong") as client:
            code, events = await client.closed()
        assert (code, events[0]["error"]["code"]) == (1008, "invalid_api_key")
        async with connect(live.base_url, config=CONFIG, query="?api_key=sk-ws") as client:
            assert (await speak(client, "Keyed. "))["utterance"] == 0
        headers = {"Authorization": "Bearer sk-ws"}
        async with connect(live.base_url, config=CONFIG, additional_headers=headers) as client:
            assert (await speak(client, "Keyed. "))["utterance"] == 0


# Limits.


async def test_limits() -> None:
    settings = sim_settings(
        "websocket.first_message_timeout_s=0.3",
        "websocket.idle_timeout_s=0.5",
        "websocket.max_message_bytes=1024",
        "websocket.max_text_chars=60",
    )
    with live_server(settings) as live:
        # No first message.
        async with connect(live.base_url) as client:
            code, events = await client.closed()
        assert (code, [e["error"]["code"] for e in events]) == (1008, ["session_timeout"])

        # Idle: nothing playing and no message.
        async with connect(live.base_url, config=CONFIG) as client:
            await speak(client, "Short. ")
            code, events = await client.closed()
        assert (code, events[-1]["error"]["code"]) == (1008, "idle_timeout")

        # A message over max_message_bytes.
        async with connect(live.base_url, config=CONFIG) as client:
            await client.send("input.text", text="x" * 1100)
            code, events = await client.closed()
        assert (code, [e["error"]["code"] for e in events]) == (1009, ["message_too_large"])

        # Text of one utterance over max_text_chars, summed over its messages.
        async with connect(live.base_url, config=CONFIG) as client:
            await client.send("input.text", text="Thirty characters of text. ab ")
            await client.send("input.text", text="Thirty more characters here.  ")  # 60: fine
            await client.send("input.text", text="!")
            code, events = await client.closed()
        assert code == 1008, events
        assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["text_too_long"]
        assert events[-1] == {
            "type": "audio.done",
            "utterance": 0,
            "audio_ms": pytest.approx(events[-1]["audio_ms"]),
            "cancelled": True,
        }
        assert await _wait_engine_idle(live) == 0  # the utterance was cancelled and freed

        # The limit is per utterance: two utterances of 50 characters each are fine.
        async with connect(live.base_url, config=CONFIG) as client:
            for index in range(2):
                assert (await speak(client, "y " * 25))["utterance"] == index


async def test_idle_timeout_waits_while_audio_plays() -> None:
    """An utterance in progress keeps the socket open with no client message."""
    settings = sim_settings("websocket.idle_timeout_s=0.2", "sim.vocoder_per_frame_ms=10")
    with live_server(settings) as live:
        async with connect(live.base_url, config=CONFIG) as client:
            await client.send("input.text", text="A long one. " * 10)
            await client.send("input.done")
            done = (await client.until("audio.done")).event
            code, events = await client.closed()
    # 50 frames of 10 ms each: the utterance outlasts the idle timeout several times over
    assert "cancelled" not in done and done["audio_ms"] > 3000
    assert (code, events[-1]["error"]["code"]) == (1008, "idle_timeout")


async def test_an_utterance_left_open_and_silent_times_out() -> None:
    with live_server(sim_settings("websocket.idle_timeout_s=0.5")) as live:
        async with connect(live.base_url, config=CONFIG) as client:
            await client.send("input.text", text="Said, and then nothing more. ")  # no input.done
            code, events = await client.closed()
        assert code == 1008
        assert [e["type"] for e in events][-2:] == ["error", "audio.done"]
        assert events[-2]["error"]["code"] == "idle_timeout"
        assert events[-1]["cancelled"] is True
        assert client.pcm(0).size > 0  # what was said was spoken before
        assert await _wait_engine_idle(live) == 0


# Admission.


async def test_a_refused_utterance_gets_retry_after_and_the_socket_stays() -> None:
    with live_server(sim_settings("admission.max_streams=1")) as live:
        async with (
            connect(live.base_url, config=CONFIG) as holder,
            connect(live.base_url, config=CONFIG) as client,
        ):
            await holder.send("input.text", text="Held open. ")  # no input.done: it stays
            await holder.until("audio.start")
            await client.send("input.text", text="Refused. ")
            await client.send("input.text", text="Its rest is dropped. ")
            await client.send("input.done")
            error = (await client.until("error")).event
            assert error["error"]["type"] == "rate_limit_error"
            assert error["error"]["code"] == "rate_limit_exceeded"
            assert error["utterance"] == 0
            assert isinstance(error["retry_after_s"], int) and error["retry_after_s"] >= 1
            await holder.send("input.done")
            await holder.until("audio.done")
            # The holder's player is counted until its audio has played: retry as told.
            for _ in range(10):
                await asyncio.sleep(error["retry_after_s"])
                await client.send("input.text", text="Admitted now. ")
                await client.send("input.done")
                reply = (await client.until(lambda e: e["type"] in ("error", "audio.done"))).event
                if reply["type"] == "audio.done":
                    break
                error = reply
    index = reply["utterance"]
    assert index >= 1 and "cancelled" not in reply  # a refused utterance keeps its number
    assert client.pcm(index).size / 24000 == pytest.approx(
        expected_audio_s(live.settings, "Admitted now. "), abs=1e-3
    )
    assert set(client.audio) == {index}


async def test_live_text_is_normalised_like_a_whole_request(server: LiveServer) -> None:
    """Numbers, money and a date split across input.text pieces are read as words, as
    /v1/audio/speech reads the whole text (the sim's audio length follows the characters
    the talker gets)."""
    written = "It costs $3.50 on 12/05/2024, Dr. Smith said. Call at 3:45 PM. "
    spoken = normalize_text(written, "en_US", server.settings.normalize)
    assert spoken != written.strip()
    async with connect(server.base_url, config=CONFIG) as client:
        for piece in [
            "It costs $3",
            ".50 on 12/0",
            "5/2024, Dr. Smi",
            "th said. Call at 3:4",
            "5 PM. ",
        ]:
            await client.send("input.text", text=piece)
        await client.send("input.done")
        await client.until("audio.done")
    pcm = client.pcm(0)
    assert pcm.size / 24000 == pytest.approx(expected_audio_s(server.settings, spoken), abs=1e-3)

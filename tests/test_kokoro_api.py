"""Japanese through every protocol, beside English, in one server (configs/piper-kokoro.yaml:
Piper and Kokoro behind one engine): the listings of each protocol with both voices and
their languages; OpenAI HTTP in every format; timestamps on ElevenLabs, Playhead's
WebSocket and Cartesia; Wyoming; bad input never a 5xx. Real voices: slow (Kokoro costs
~0.4 RTF: the texts are short)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_support import LiveServer, decode, live_server
from ws_client import connect, speak
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe
from wyoming.tts import Synthesize, SynthesizeVoice
from wyoming_support import free_port, read_reply

from app.settings import load_settings

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
JA = "今日はいい天気ですね。"
EN_VOICE, JA_VOICE = "en_US-joe-medium", "jf_alpha"


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    settings = load_settings(
        ROOT / "configs" / "piper-kokoro.yaml",
        [
            "engine.calibration_calls=0",
            "wyoming.enabled=true",
            f"wyoming.port={free_port()}",
        ],
        environ={},
    )
    with live_server(settings) as live:
        yield live


def speech(server: LiveServer, text: str, voice: str = JA_VOICE, **fields: object):
    body = {"model": "tts-1", "input": text, "voice": voice, **fields}
    return httpx.post(server.base_url + "/v1/audio/speech", json=body, timeout=120)


def test_every_listing_has_both_voices_with_their_languages(server: LiveServer) -> None:
    voices = httpx.get(server.base_url + "/v1/audio/voices").json()["voices"]
    languages = {v["id"]: v["language"] for v in voices}
    assert languages[EN_VOICE] == "en_US" and languages[JA_VOICE] == "ja"
    assert {"jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo"} <= set(languages)
    eleven = httpx.get(server.base_url + "/v1/voices").json()["voices"]
    assert {EN_VOICE, JA_VOICE} <= {v["voice_id"] for v in eleven}
    assert "ja" in json.dumps([v for v in eleven if v["voice_id"] == JA_VOICE])
    cartesia = httpx.get(server.base_url + "/voices").json()
    entries = cartesia["data"] if isinstance(cartesia, dict) else cartesia
    assert {v["language"] for v in entries if v["id"] in (EN_VOICE, JA_VOICE)} >= {"ja"}


async def test_wyoming_describes_both_and_speaks_japanese(server: LiveServer) -> None:
    port = server.settings.wyoming.port
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        info = (await client.read_event()).data
    voices = {v["name"]: v["languages"] for p in info["tts"] for v in p["voices"]}
    assert voices[JA_VOICE] == ["ja"] and EN_VOICE in voices
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Synthesize(JA, voice=SynthesizeVoice(name=JA_VOICE)).event())
        reply = await read_reply(client, streamed=False)
    assert reply.audio_s > 1.0


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_japanese_in_every_openai_format(server: LiveServer, fmt: str) -> None:
    response = speech(server, "こんにちは。", response_format=fmt)
    assert response.status_code == 200, response.text[:200]
    audio, rate = decode(response.content, fmt)
    assert 0.8 < audio.size / rate < 3.0  # こんにちは: ~1.2 s with Kokoro's pauses


def test_english_and_japanese_are_routed_by_voice(server: LiveServer) -> None:
    english = speech(server, "Hello there.", EN_VOICE, response_format="pcm")
    japanese = speech(server, "こんにちは。", response_format="pcm")
    assert english.status_code == japanese.status_code == 200
    assert english.content and japanese.content and english.content != japanese.content


def test_elevenlabs_timestamps_cover_the_japanese_text(server: LiveServer) -> None:
    url = f"{server.base_url}/v1/text-to-speech/{JA_VOICE}/with-timestamps?output_format=pcm_24000"
    body = httpx.post(url, json={"text": JA}, timeout=120).json()
    alignment = body["alignment"]
    assert "".join(alignment["characters"]) == JA
    starts = alignment["character_start_times_seconds"]
    assert starts == sorted(starts)
    # the durations are the voice's, not spread evenly: the first word starts after
    # Kokoro's leading pause (its pad token's frames)
    assert starts[0] >= 0.15 and starts[JA.index("天")] > starts[0] + 0.3
    audio_s = len(base64.b64decode(body["audio_base64"])) / 2 / 24000
    assert alignment["character_end_times_seconds"][-1] <= audio_s + 0.05


async def test_websocket_alignment_of_japanese(server: LiveServer) -> None:
    config = {"voice": JA_VOICE, "response_format": "pcm", "alignment": True}
    async with connect(server.base_url, config=config) as client:
        await speak(client, "今日は", "いい天気ですね。")
    events = client.events("alignment")
    assert "".join(c for e in events for c in e["chars"]) == JA
    starts = [s for e in events for s in e["char_start_ms"]]
    assert starts == sorted(starts) and starts[0] >= 150 and starts[-1] > 300


def test_cartesia_sse_has_word_timestamps_for_japanese(server: LiveServer) -> None:
    body = {
        "model_id": "sonic-2",
        "transcript": JA,
        "voice": {"mode": "id", "id": JA_VOICE},
        "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000},
        "add_timestamps": True,
    }
    headers = {"Cartesia-Version": "2025-04-16", "X-API-Key": "any"}
    response = httpx.post(server.base_url + "/tts/sse", json=body, headers=headers, timeout=120)
    assert response.status_code == 200, response.text[:300]
    events = [
        json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")
    ]
    stamps = [e["word_timestamps"] for e in events if e.get("type") == "timestamps"]
    words = [w for s in stamps for w in s["words"]]
    assert "".join(words).replace(" ", "") == JA.replace(" ", "")
    starts = [t for s in stamps for t in s["start"]]
    assert starts == sorted(starts) and starts[0] >= 0.15 and starts[-1] > 0.3


@pytest.mark.parametrize(
    ("text", "statuses"),
    [
        ("مرحبا بالعالم", (400,)),  # a script the Japanese reading cannot read
        ("", (400,)),
    ],
)
def test_bad_japanese_input_is_never_a_server_error(
    server: LiveServer, text: str, statuses: tuple[int, ...]
) -> None:
    response = speech(server, text, response_format="pcm")
    assert response.status_code in statuses, response.text[:300]
    if text:
        assert "(ja) cannot read" in response.json()["error"]["message"]


def test_an_unknown_voice_names_the_voices(server: LiveServer) -> None:
    response = speech(server, JA, "jf_nobody")
    assert response.status_code == 400
    assert JA_VOICE in response.text and EN_VOICE in response.text


def test_4096_kanji_start_speaking(server: LiveServer) -> None:
    text = ("漢字仮名交" * 820)[:4096]
    body = {"model": "tts-1", "input": text, "voice": JA_VOICE, "response_format": "pcm"}
    with httpx.stream("POST", server.base_url + "/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200
        first = next(r.iter_bytes())  # first audio, then the client leaves (cancels)
    assert len(first) > 0

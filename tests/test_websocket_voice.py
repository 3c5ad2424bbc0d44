"""WS /v1/audio/speech/stream on the real voice (Piper, en_US-joe-medium, noise scales 0)
through a live server: text arriving word by word is heard (pocketsphinx), two utterances
share a socket, and a cancel stops within one chunk.

Two figures are printed, not asserted (speed is a benchmark's business): first audio after
the first complete fragment arrives, and cancel to audio.done.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_support import LiveServer, live_server
from asr import transcribe, word_error_rate
from ws_client import WsClient, connect, speak

from app.settings import Settings, load_settings
from pipeline.backends.piper import PiperBackend
from pipeline.text import Segmenter

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
RATE_HZ = 24000
CONFIG = {"voice": "alloy", "response_format": "pcm", "sample_rate": RATE_HZ}
MAX_WER = 0.35
WORD_GAP_S = 0.03  # a language model writing ~33 words per second
ANSWER = (
    "Sure, the station is two blocks north. Turn left at the next corner, "
    "then walk past the bakery and the bank."
)


@pytest.fixture(scope="module")
def settings() -> Settings:
    return load_settings(
        ROOT / "configs" / "default.yaml",
        [
            "backend.kind=piper",
            "server.log_level=warning",
            # one socket after another on a shared CPU: the capacity estimate must not
            # refuse them (admission on the socket is tested on the sim backend)
            "admission.enabled=false",
            "engine.calibration_calls=0",
            "piper.noise_scale=0",
            "piper.noise_w=0",
        ],
        environ={},
    )


@pytest.fixture(scope="module")
def server(settings: Settings) -> Iterator[LiveServer]:
    backend = PiperBackend(settings.piper)
    with live_server(settings, backend_factory=lambda: backend) as live:
        # One request first: the first run of the ONNX sessions is slower than the rest,
        # and the figures printed below are about the steady state.
        warm = {"model": "tts-1", "voice": "alloy", "input": "Warm up.", "response_format": "pcm"}
        assert httpx.post(live.base_url + "/v1/audio/speech", json=warm, timeout=60).content
        yield live


def _words(text: str) -> list[str]:
    return [word + " " for word in text.split()]


def _first_fragment_piece(settings: Settings, pieces: list[str]) -> int:
    """Index of the piece after which the engine's segmenter releases the first fragment."""
    segmenter = Segmenter(
        first_fragment_words=settings.text.first_fragment_words,
        max_segment_chars=settings.text.max_segment_chars,
    )
    for index, piece in enumerate(pieces):
        if segmenter.push(piece):
            return index
    raise AssertionError("no fragment completes before the text ends")


async def _type(client: WsClient, pieces: list[str], sent_at: list[float]) -> None:
    for piece in pieces:
        sent_at.append(await client.send("input.text", text=piece))
        await asyncio.sleep(WORD_GAP_S)
    await client.send("input.done")


async def test_live_text_is_heard_and_starts_on_the_first_fragment(server: LiveServer) -> None:
    pieces = _words(ANSWER)
    first = _first_fragment_piece(server.settings, pieces)
    async with connect(server.base_url, config=CONFIG) as client:
        sent_at: list[float] = []
        typing = asyncio.create_task(_type(client, pieces, sent_at))
        start = await client.until("audio.start", timeout_s=60)
        first_audio = await client.receive(timeout_s=60)
        assert first_audio.event is None  # audio follows audio.start at once
        await typing
        done = (await client.until("audio.done", timeout_s=60)).event
    fragment_at_s = sent_at[first]
    print(
        f"\nfirst audio {1000 * (first_audio.at_s - fragment_at_s):.0f} ms after the first "
        f"complete fragment ({''.join(pieces[: first + 1]).strip()!r}) was sent; "
        f"audio.start came after piece {sum(t <= start.at_s for t in sent_at)} of {len(pieces)}"
    )
    # Speech started while the text was still arriving.
    assert start.at_s < sent_at[-1]
    pcm = client.pcm(0)
    assert done["audio_ms"] == pytest.approx(1000 * pcm.size / RATE_HZ, abs=0.1)
    heard = transcribe(pcm, RATE_HZ)
    wer = word_error_rate(ANSWER, heard)
    assert wer <= MAX_WER, (heard, wer)


async def test_two_utterances_on_one_socket_are_heard(server: LiveServer) -> None:
    texts = ("The quick brown fox jumps over the lazy dog.", "We will meet at half past seven.")
    async with connect(server.base_url, config=CONFIG) as client:
        for index, text in enumerate(texts):
            done = await speak(client, *_words(text))
            assert done["utterance"] == index and "cancelled" not in done
    for index, text in enumerate(texts):
        heard = transcribe(client.pcm(index), RATE_HZ)
        assert word_error_rate(text, heard) <= MAX_WER, (text, heard)


async def test_cancel_stops_within_one_chunk(server: LiveServer, settings: Settings) -> None:
    long_text = "This is a long answer that the listener interrupts halfway through. " * 6
    chunk_bytes = 2 * round(
        settings.chunking.chunk_frames * 256 * RATE_HZ / 22050 + 64  # + resampler slack
    )
    async with connect(server.base_url, config=CONFIG) as client:
        await client.send("input.text", text=long_text)
        await client.send("input.done")
        while client.pcm(0).size < RATE_HZ:  # a second of audio in
            await client.receive(timeout_s=60)
        before = len(client.audio[0])
        cancelled_at_s = await client.send("cancel")
        done = await client.until("audio.done", timeout_s=60)
        after = len(client.audio[0]) - before
        assert done.event is not None and done.event.get("cancelled") is True
        # At most the chunk that was in flight when the cancel arrived.
        assert after <= chunk_bytes
        print(
            f"\ncancel -> audio.done {1000 * (done.at_s - cancelled_at_s):.1f} ms "
            f"({after} bytes after the cancel; a steady chunk is {chunk_bytes} bytes)"
        )
        # The socket goes on: the next utterance is spoken and heard.
        started_s = time.monotonic()
        done2 = await speak(client, "Yes, go ahead.")
        assert done2["utterance"] == 1 and "cancelled" not in done2
        print(f"next utterance complete {1000 * (time.monotonic() - started_s):.0f} ms later")
    assert word_error_rate("yes go ahead", transcribe(client.pcm(1), RATE_HZ)) <= 0.5

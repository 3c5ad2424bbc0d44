"""The real Cartesia clients, unmodified, against a live Playhead server on the bundled
voice (Piper, en_US-joe-medium): pipecat's CartesiaTTSService (socket) and
CartesiaHttpTTSService in a pipeline, LiveKit's cartesia plugin (streamed and chunked),
and the official `cartesia` SDK (bytes, sse, websocket contexts).

In each, the audio is intelligible (pocketsphinx, tests/asr.py); the word timestamps the
client reports agree with pocketsphinx's word segmentation of the same audio (median start
error <= 80 ms, none above 250 ms) whenever the engine fills `Stream.alignment`; a cancel
stops the audio within one chunk and frees the engine stream; live text starts speaking
at its first complete sentence, before the rest of the text is sent.
"""

from __future__ import annotations

import asyncio
import base64
import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import cartesia
import numpy as np
import pytest
from api_support import LiveServer, live_server
from asr import _LOCK, ASR_RATE_HZ, _decoder, transcribe, word_error_rate

from app.settings import Settings, load_settings
from pipeline.backends.piper import PiperBackend

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
KEY = "slow-key"
RATE_HZ = 16000
MAX_WER = 0.35
MEDIAN_START_ERROR_S = 0.08
MAX_START_ERROR_S = 0.25
SENTENCE = "The quick brown fox jumps over the lazy dog."
TWO_SENTENCES = "Please call me back tomorrow morning. We will meet at the station at seven."
RAW = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": RATE_HZ}
# every client that reported word timestamps (the last test asserts they all did)
REPORTED: dict[str, int] = {}


@pytest.fixture(scope="module")
def settings() -> Settings:
    return load_settings(
        ROOT / "configs" / "default.yaml",
        ["server.log_level=warning", f"server.api_key={KEY}", "piper.noise_scale=0",
         "piper.noise_w=0"],
        environ={},
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(settings: Settings) -> Iterator[LiveServer]:
    backend = PiperBackend(settings.piper, settings.talker, settings.vocoder)
    with live_server(settings, backend_factory=lambda: backend) as live:
        yield live


def engine_streams(server: LiveServer) -> int:
    stats = server.app.state.playhead.engine.stats()
    return stats.active_streams + stats.draining_streams


async def wait_engine_idle(server: LiveServer, timeout_s: float = 5.0) -> float:
    """Seconds until the engine holds no stream (the timeout if it never gets there)."""
    started = time.monotonic()
    while engine_streams(server) and time.monotonic() - started < timeout_s:
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def asr_words(pcm: np.ndarray, rate_hz: int) -> list[tuple[str, float, float]]:
    """pocketsphinx's word segmentation: (word, start_s, end_s), fillers dropped."""
    assert rate_hz == ASR_RATE_HZ
    pcm16_bytes = (np.clip(pcm, -1.0, 1.0) * 32767.0).astype(np.int16).tobytes()
    with _LOCK:
        decoder = _decoder()
        decoder.start_utt()
        decoder.process_raw(pcm16_bytes, no_search=False, full_utt=True)
        decoder.end_utt()
        segments = [(s.word, s.start_frame, s.end_frame) for s in decoder.seg()]
    return [
        (re.sub(r"\(\d+\)$", "", word), start / 100.0, end / 100.0)
        for word, start, end in segments
        if not word.startswith(("<", "["))
    ]


def assert_intelligible(text: str, pcm: np.ndarray) -> None:
    heard = transcribe(pcm, RATE_HZ)
    assert word_error_rate(text, heard) <= MAX_WER, (text, heard)


def _norm(word: str) -> str:
    return re.sub(r"[^a-z0-9']", "", word.lower())


def assert_timestamps_match(
    client: str, reported: list[tuple[str, float]], pcm: np.ndarray
) -> None:
    """The reported (word, start_s) against pocketsphinx's segmentation, word by word
    (the words both agree on, in order). Nothing reported: noted for the last test."""
    if not reported:
        return
    REPORTED[client] = len(reported)
    heard = asr_words(pcm, RATE_HZ)
    errors = []
    position = 0
    for word, start_s in reported:
        for index in range(position, len(heard)):
            if heard[index][0] == _norm(word):
                errors.append(abs(heard[index][1] - start_s))
                position = index + 1
                break
    assert len(errors) >= len(reported) // 2, (reported, heard)
    assert statistics.median(errors) <= MEDIAN_START_ERROR_S, (client, errors, reported, heard)
    assert max(errors) <= MAX_START_ERROR_S, (client, errors, reported, heard)


# The official SDK ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sdk(server: LiveServer) -> Iterator[cartesia.Cartesia]:
    with cartesia.Cartesia(base_url=server.base_url, api_key=KEY, max_retries=0) as client:
        yield client


@pytest.mark.filterwarnings("ignore:bytes\\(\\) is deprecated")
def test_sdk_bytes_is_intelligible(sdk: cartesia.Cartesia) -> None:
    voice = {"mode": "id", "id": "a0e99841-438c-4a64-b679-ae501e7d6091"}  # -> the default
    pieces = sdk.tts.bytes(model_id="sonic-2", transcript=SENTENCE, voice=voice, output_format=RAW)  # type: ignore[arg-type]
    assert_intelligible(SENTENCE, pcm16(b"".join(pieces)))


def test_sdk_sse_audio_and_word_timestamps(sdk: cartesia.Cartesia) -> None:
    events = list(
        sdk.tts.sse(model_id="sonic-3", transcript=TWO_SENTENCES, voice={"mode": "id", "id": ""},
                    output_format=RAW, add_timestamps=True)  # type: ignore[arg-type]
    )  # fmt: skip
    assert events[-1].type == "done"
    pcm = pcm16(b"".join(e.audio or b"" for e in events if e.type == "chunk"))
    assert_intelligible(TWO_SENTENCES, pcm)
    reported = [
        (word, start)
        for e in events
        if e.type == "timestamps"
        for word, start in zip(e.word_timestamps.words, e.word_timestamps.start, strict=True)
    ]
    assert_timestamps_match("sdk-sse", reported, pcm)


async def test_sdk_websocket_live_text_timestamps_and_cancel(server: LiveServer) -> None:
    ws_base = server.base_url.replace("http", "ws")
    async with cartesia.AsyncCartesia(
        base_url=server.base_url, api_key=KEY, websocket_base_url=ws_base
    ) as client:
        connection = await client.tts.websocket_connect().enter()
        try:
            options = {"model_id": "sonic-3", "voice": {"mode": "id", "id": None},
                       "output_format": RAW, "add_timestamps": True}  # fmt: skip
            first, second = TWO_SENTENCES.split(". ", 1)
            context = connection.context(**options)  # type: ignore[arg-type]
            await context.push(first + ". ")
            events = context.receive()
            # live text: the first sentence speaks before the rest is sent
            async with asyncio.timeout(10):
                chunk = await anext(e async for e in events if e.type == "chunk")
            await context.push(second)
            await context.no_more_inputs()
            rest = [e async for e in events]
            everything = [chunk, *rest]
            assert rest[-1].type == "done"
            pcm = pcm16(b"".join(e.audio or b"" for e in everything if e.type == "chunk"))
            assert_intelligible(TWO_SENTENCES, pcm)
            reported = [
                (word, start)
                for e in everything
                if e.type == "timestamps"
                for word, start in zip(
                    e.word_timestamps.words, e.word_timestamps.start, strict=True
                )
            ]
            assert_timestamps_match("sdk-websocket", reported, pcm)

            # cancel mid-speech: at most one more chunk, and the engine stream is freed
            long = connection.context(**options)  # type: ignore[arg-type]
            await long.push(" ".join([TWO_SENTENCES] * 4), continue_=False)
            queue = connection._context_queues[long._context_id]
            async with asyncio.timeout(10):
                while (await queue.get()).type != "chunk":
                    pass
            await long.cancel()  # the SDK forgets the context; keep reading its queue
            connection._context_queues[long._context_id] = queue
            late = []
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(1.5):
                    while True:
                        late.append((await queue.get()).type)
            assert late.count("chunk") <= 1 and "done" not in late, late
            assert await wait_engine_idle(server, 2.0) < 2.0
        finally:
            await connection.close()

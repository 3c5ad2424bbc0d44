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
from livekit.plugins import cartesia as livekit_cartesia
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.cartesia.tts import CartesiaHttpTTSService, CartesiaTTSService
from pipecat.workers.runner import WorkerRunner

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


@pytest.fixture(scope="module")
def settings() -> Settings:
    return load_settings(
        ROOT / "configs" / "default.yaml",
        # admission off: the tests run one after another, but each one's audio still
        # "plays" a while after it was read, and on a busy 2-core machine Piper's capacity
        # is a few streams (admission's 429s are tests/test_cartesia_api.py's)
        ["backend.kind=piper", "server.log_level=warning", f"server.api_key={KEY}",
         "piper.noise_scale=0", "piper.noise_w=0", "admission.enabled=false",
         "engine.calibration_calls=0"],  # nothing admits: no capacity to measure
        environ={},
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(settings: Settings) -> Iterator[LiveServer]:
    backend = PiperBackend(settings.piper)
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
    assert pcm.size > RATE_HZ // 2, f"{pcm.size} samples"
    heard = transcribe(pcm, RATE_HZ)
    assert word_error_rate(text, heard) <= MAX_WER, (text, heard)


def _norm(word: str) -> str:
    return re.sub(r"[^a-z0-9']", "", word.lower())


def assert_timestamps_match(
    client: str, reported: list[tuple[str, float]], pcm: np.ndarray
) -> None:
    """The reported (word, start_s) against pocketsphinx's segmentation, word by word
    (the words both agree on, in order)."""
    assert reported, f"{client} reported no word timestamps"
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


# pipecat ---------------------------------------------------------------------------------


class _Sink(FrameProcessor):
    """The end of the pipeline: keeps every frame with its arrival time."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[tuple[float, Frame]] = []
        self.audio = asyncio.Event()
        self.stopped = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, StartFrame):
            self.frames.append((time.monotonic(), frame))
        if isinstance(frame, TTSAudioRawFrame):
            self.audio.set()
        if isinstance(frame, TTSStoppedFrame | ErrorFrame):
            self.stopped.set()
        await self.push_frame(frame, direction)

    def of(self, kind: type) -> list:
        return [frame for _, frame in self.frames if isinstance(frame, kind)]


async def run_pipecat(tts: FrameProcessor, script) -> _Sink:
    """`tts` in a pipeline between two _Sinks; `script(worker, sink)` drives it, then the
    pipeline ends. No ErrorFrame may pass either way."""
    source, sink = _Sink(), _Sink()  # the source sees what goes upstream: errors
    worker = PipelineWorker(
        Pipeline([source, tts, sink]),
        cancel_on_idle_timeout=False,
        params=PipelineParams(audio_out_sample_rate=RATE_HZ),
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    async def drive() -> None:
        try:
            await asyncio.wait_for(started.wait(), 20)
            await script(worker, sink)
        except BaseException:
            await worker.cancel()  # not EndFrame: that waits for the audio still coming
            raise
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    async with asyncio.timeout(90):
        await asyncio.gather(runner.run(), drive())
    errors = source.of(ErrorFrame) + sink.of(ErrorFrame)
    assert not errors, errors
    return sink


def pipecat_socket(server: LiveServer) -> CartesiaTTSService:
    url = server.base_url.replace("http", "ws") + "/tts/websocket"
    return CartesiaTTSService(api_key=KEY, url=url, sample_rate=RATE_HZ)


async def test_pipecat_socket_live_text_with_word_timestamps(server: LiveServer) -> None:
    first, second = TWO_SENTENCES.split(". ", 1)
    head_word, rest = second.split(" ", 1)

    async def script(worker: PipelineWorker, sink: _Sink) -> None:
        # an LLM's reply as it is written: pipecat sends each sentence once it ends
        await worker.queue_frame(LLMFullResponseStartFrame())
        await worker.queue_frame(LLMTextFrame(f"{first}. {head_word}"))
        await asyncio.wait_for(sink.audio.wait(), 30)  # before the rest is written
        await worker.queue_frame(LLMTextFrame(f" {rest}"))
        await worker.queue_frame(LLMFullResponseEndFrame())
        await asyncio.wait_for(sink.stopped.wait(), 60)

    sink = await run_pipecat(pipecat_socket(server), script)
    pcm = pcm16(b"".join(f.audio for f in sink.of(TTSAudioRawFrame)))
    assert_intelligible(TWO_SENTENCES, pcm)
    words = [f for f in sink.of(TTSTextFrame) if f.pts]
    assert " ".join(f.text for f in words).split() == TWO_SENTENCES.split()
    assert len(words) == len(TWO_SENTENCES.split())  # a frame per word: its timestamps
    # pipecat reports presentation times (its clock at the first audio + the word's
    # start): compared from its first word, anchored at that word's time in the audio
    first = asr_words(pcm, RATE_HZ)[0][1]
    reported = [(f.text, first + (f.pts - words[0].pts) / 1e9) for f in words]
    assert_timestamps_match("pipecat", reported, pcm)


async def test_pipecat_interruption_cancels_the_context(server: LiveServer) -> None:
    long = " ".join([TWO_SENTENCES] * 3)

    async def script(worker: PipelineWorker, sink: _Sink) -> None:
        await worker.queue_frame(TTSSpeakFrame(long))
        await asyncio.wait_for(sink.audio.wait(), 30)
        await worker.queue_frame(InterruptionFrame())
        # the cancel reaches the server: its engine stream is freed at once
        assert await wait_engine_idle(server, 2.0) < 2.0

    sink = await run_pipecat(pipecat_socket(server), script)
    audio_s = sum(len(f.audio) for f in sink.of(TTSAudioRawFrame)) / 2 / RATE_HZ
    assert audio_s < 6.0  # far less than the whole text (about 15 s)


async def test_pipecat_http_service_in_a_pipeline(server: LiveServer) -> None:
    async with aiohttp.ClientSession() as session:
        tts = CartesiaHttpTTSService(
            api_key=KEY, base_url=server.base_url, aiohttp_session=session, sample_rate=RATE_HZ
        )

        async def script(worker: PipelineWorker, sink: _Sink) -> None:
            await worker.queue_frame(TTSSpeakFrame(SENTENCE))
            await asyncio.wait_for(sink.stopped.wait(), 60)

        sink = await run_pipecat(tts, script)
    assert_intelligible(SENTENCE, pcm16(b"".join(f.audio for f in sink.of(TTSAudioRawFrame))))


# LiveKit ---------------------------------------------------------------------------------


def livekit_tts(server: LiveServer, session: aiohttp.ClientSession) -> livekit_cartesia.TTS:
    return livekit_cartesia.TTS(
        api_key=KEY, base_url=server.base_url, http_session=session, sample_rate=RATE_HZ
    )


def frame_pcm(frames: list) -> np.ndarray:
    return np.concatenate([np.frombuffer(f.data, dtype=np.int16) for f in frames]) / 32768.0


async def test_livekit_chunked_is_intelligible(server: LiveServer) -> None:
    async with aiohttp.ClientSession() as session:
        tts = livekit_tts(server, session)
        frames = [event.frame async for event in tts.synthesize(SENTENCE)]
        await tts.aclose()
    assert_intelligible(SENTENCE, frame_pcm(frames))


async def test_livekit_stream_live_text_and_timestamps(server: LiveServer) -> None:
    first, second = TWO_SENTENCES.split(". ", 1)
    async with aiohttp.ClientSession() as session:
        tts = livekit_tts(server, session)
        stream = tts.stream()
        # as an LLM writes it: the first sentence and the next word (which tells LiveKit's
        # sentence tokenizer the first one ended); the rest only once audio came
        head_words, rest_words = second.split(" ", 1)
        stream.push_text(f"{first}. {head_words} ")
        events = aiter(stream)
        async with asyncio.timeout(15):
            head = await anext(events)
        stream.push_text(rest_words)
        stream.end_input()
        frames = [head.frame] + [event.frame async for event in events]
        await stream.aclose()
        await tts.aclose()
    pcm = frame_pcm(frames)
    assert_intelligible(TWO_SENTENCES, pcm)
    timed = [t for f in frames for t in f.userdata.get("lk.timed_transcripts", [])]
    reported = [(str(t).strip(), t.start_time) for t in timed if str(t).strip()]
    assert_timestamps_match("livekit", reported, pcm)


async def test_livekit_closing_a_stream_mid_speech_frees_the_engine(server: LiveServer) -> None:
    async with aiohttp.ClientSession() as session:
        tts = livekit_tts(server, session)
        stream = tts.stream()
        stream.push_text(" ".join([TWO_SENTENCES] * 3))
        stream.end_input()
        async with asyncio.timeout(15):
            await anext(aiter(stream))
        await stream.aclose()  # LiveKit drops the socket: every context on it ends
        await tts.aclose()
    assert await wait_engine_idle(server, 2.0) < 2.0

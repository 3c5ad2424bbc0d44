"""The real ElevenLabs clients, unmodified, against a live Playhead on the real voice (Piper):
the official SDK, pipecat's ElevenLabsTTSService (multi-context socket) and
ElevenLabsHttpTTSService inside a pipeline, LiveKit's elevenlabs plugin (streamed and
chunked). In each: pocketsphinx understands the audio, the word times the client reports
agree with pocketsphinx's own segmentation of that audio, an interruption stops the audio
and frees the engine stream, and live text speaks from its first complete sentence.

One server (and one loaded voice) for the module. Timings are checked against pocketsphinx's
word segmentation (10 ms frames, itself a few tens of ms off): median start error <= 80 ms,
none > 250 ms, over the words both sides have.
"""

from __future__ import annotations

import asyncio
import base64
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import median

import aiohttp
import numpy as np
import pytest
import soxr

from app.settings import Settings, load_settings
from pipeline.backends.piper import PiperBackend
from tests.api_support import LiveServer, decode, engine_idle, live_server, metric_value
from tests.asr import ASR_RATE_HZ, _decoder, normalize, transcribe, word_error_rate

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
RATE_HZ = 22050
MAX_WER = 0.35
FIRST = "The quick brown fox jumps over the lazy dog. "
SECOND = "Please call me back tomorrow morning after nine o'clock. "
LONG = " ".join(
    [
        "We will meet at the station at half past seven, and then walk to the harbour.",
        "Turn left at the next corner and walk two blocks north to the old market.",
        "The weather is nice today, and the sun is shining over the quiet water.",
    ]
)


@pytest.fixture(scope="module")
def settings() -> Settings:
    """Admission off: the tests follow each other faster than their audio would play
    (admission's 429 is tested with the sim backend, tests/test_elevenlabs_api.py). Noise
    scales 0: the same text gives the same speech, so pocketsphinx's word times, against
    which the clients' times are checked, do not depend on the voice's sampling (with
    Piper's noise, "five dollars" was once heard as "by ago" and the words lost step)."""
    overrides = [
        "backend.kind=piper",
        "server.log_level=warning",
        "admission.enabled=false",
        "piper.noise_scale=0",
        "piper.noise_w=0",
        "engine.calibration_calls=0",  # nothing admits: no capacity to measure
    ]
    return load_settings(ROOT / "configs" / "default.yaml", overrides, environ={})


@pytest.fixture(scope="module")
def backend(settings: Settings) -> PiperBackend:
    return PiperBackend(settings.piper)


@pytest.fixture(scope="module")
def server(settings: Settings, backend: PiperBackend) -> Iterator[LiveServer]:
    with live_server(settings, backend_factory=lambda: backend) as live:
        yield live


@pytest.fixture(scope="module")
def voice(backend: PiperBackend) -> str:
    return backend.default_voice()


# Checks.


def asr_words(pcm: np.ndarray, rate_hz: int) -> list[tuple[str, float]]:
    """pocketsphinx's words and their start times (s) in `pcm`."""
    audio = soxr.resample(pcm.astype(np.float32), rate_hz, ASR_RATE_HZ)
    pcm16 = (np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)
    decoder = _decoder()
    decoder.start_utt()
    decoder.process_raw(pcm16.tobytes(), no_search=False, full_utt=True)
    decoder.end_utt()
    words = []
    for seg in decoder.seg():
        word = normalize(re.sub(r"\(\d+\)$", "", seg.word))
        if word and not seg.word.startswith(("<", "[")):
            words.append((word, seg.start_frame / 100.0))
    return words


def assert_intelligible(pcm: np.ndarray, rate_hz: int, text: str) -> None:
    heard = transcribe(pcm, rate_hz)
    assert word_error_rate(text, heard) <= MAX_WER, heard


def assert_times_agree(reported: list[tuple[str, float]], pcm: np.ndarray, rate_hz: int) -> None:
    """The client's word start times against pocketsphinx's, word by word in order."""
    heard = asr_words(pcm, rate_hz)
    errors, at = [], 0
    for word, start_s in reported:
        word = normalize(word)
        for j in range(at, min(at + 4, len(heard))):
            if heard[j][0] == word:
                errors.append(abs(heard[j][1] - start_s))
                at = j + 1
                break
    assert len(errors) >= len(reported) / 2, (reported, heard)
    assert median(errors) <= 0.08, (errors, reported, heard)
    assert max(errors) <= 0.25, (errors, reported, heard)


class EngineWatch:
    """Samples whether the server's engine holds a stream, every 10 ms, in a thread."""

    def __init__(self, server: LiveServer) -> None:
        self._engine = server.app.state.playhead.engine
        self.samples: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            stats = self._engine.stats()
            busy = stats.active_streams + stats.draining_streams > 0
            self.samples.append((time.monotonic(), busy))
            time.sleep(0.01)

    def __enter__(self) -> EngineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def idle_after(self, at_s: float) -> float:
        """Seconds from `at_s` until the engine held no stream (inf: never, while watched)."""
        return next((t - at_s for t, busy in self.samples if t >= at_s and not busy), np.inf)


def cancelled_streams(server: LiveServer) -> float:
    return metric_value(server.metrics(), "playhead_streams_total", 'state="cancelled"')


# The official SDK.


def test_sdk_convert_stream_and_stream_with_timestamps(server: LiveServer, voice: str) -> None:
    from elevenlabs import ElevenLabs
    from elevenlabs.core.api_error import ApiError

    client = ElevenLabs(base_url=server.base_url, api_key="any")
    text = FIRST + SECOND
    pcm = b"".join(client.text_to_speech.convert(voice, text=text, output_format="pcm_22050"))
    assert_intelligible(decode(pcm, "pcm", RATE_HZ)[0], RATE_HZ, text)
    mp3 = b"".join(client.text_to_speech.stream(voice, text=FIRST, model_id="eleven_flash_v2_5"))
    samples, rate_hz = decode(mp3, "mp3")  # the default: mp3_44100_128
    assert rate_hz == 44100
    assert_intelligible(samples, rate_hz, FIRST)
    chunks = list(
        client.text_to_speech.stream_with_timestamps(voice, text=text, output_format="pcm_22050")
    )
    audio = decode(b"".join(base64.b64decode(c.audio_base_64) for c in chunks), "pcm", RATE_HZ)[0]
    chars, starts = [], []
    for chunk in chunks:
        if chunk.alignment is not None:
            chars += chunk.alignment.characters
            starts += chunk.alignment.character_start_times_seconds
    assert "".join(chars).strip() == text.strip()  # every character, in order
    words = [(m.group(), starts[m.start()]) for m in re.finditer(r"\S+", "".join(chars))]
    assert_times_agree(words, audio, RATE_HZ)
    with pytest.raises(ApiError) as refused:
        b"".join(client.text_to_speech.convert("no-such-voice", text="Hello."))
    assert refused.value.status_code == 404
    assert refused.value.body["detail"]["status"] == "voice_not_found"


def test_sdk_normalized_alignment_times_the_spoken_words(server: LiveServer, voice: str) -> None:
    """`normalized_alignment` on the real voice: the words it spoke ("five dollars" for
    "$5"), each at the time pocketsphinx hears it; `alignment` stays the text as sent."""
    from elevenlabs import ElevenLabs

    client = ElevenLabs(base_url=server.base_url, api_key="any")
    text = "It costs $5 to call me at 10 tomorrow, or 25 dollars on Sunday."
    whole = client.text_to_speech.convert_with_timestamps(
        voice, text=text, output_format="pcm_22050"
    )
    assert whole.alignment is not None and whole.normalized_alignment is not None
    assert "".join(whole.alignment.characters) == text
    spoken = "".join(whole.normalized_alignment.characters)
    assert "five dollars" in spoken and "twenty-five" in spoken and "$" not in spoken
    starts = whole.normalized_alignment.character_start_times_seconds
    assert starts == sorted(starts)
    audio = decode(base64.b64decode(whole.audio_base_64), "pcm", RATE_HZ)[0]
    words = [(m.group(), starts[m.start()]) for m in re.finditer(r"[^\s-]+", spoken)]
    assert_times_agree(words, audio, RATE_HZ)


# pipecat.


def _pipecat_run(service, frames, *, sleep_s: float, mark: type | None = None):
    """Run `service` in a pipeline on `frames`; (pcm, the word times pipecat computed, when
    each audio frame arrived, when each `mark` frame (LLM text) entered, upstream frames)."""
    from pipecat.frames.frames import LLMTextFrame, TTSAudioRawFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.tests.utils import SleepFrame, run_test

    words: list[tuple[str, float]] = []
    arrivals: list[float] = []
    texts: list[float] = []
    original = service.add_word_timestamps

    async def recording(word_times, *args, **kwargs):  # what pipecat computed from us
        words.extend(word_times)
        return await original(word_times, *args, **kwargs)

    service.add_word_timestamps = recording

    class Times(FrameProcessor):
        def __init__(self, kind, times):
            super().__init__()
            self._kind, self._times = kind, times

        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if isinstance(frame, self._kind):
                self._times.append(time.monotonic())
            await self.push_frame(frame, direction)

    marks = Times(mark or LLMTextFrame, texts)
    pipeline = Pipeline([marks, service, Times(TTSAudioRawFrame, arrivals)])
    down, up = asyncio.run(run_test(pipeline, frames_to_send=[*frames, SleepFrame(sleep=sleep_s)]))
    audio = b"".join(f.audio for f in down if isinstance(f, TTSAudioRawFrame))
    return decode(audio, "pcm", RATE_HZ)[0], words, arrivals, texts, up


def _pipecat_socket_service(server: LiveServer, voice: str):  # type: ignore[no-untyped-def]
    """pipecat's ElevenLabsTTSService (the multi-context socket) pointed at `server`."""
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService

    return ElevenLabsTTSService(
        api_key="any",
        url=server.base_url.replace("http://", "ws://"),
        sample_rate=RATE_HZ,
        settings=ElevenLabsTTSService.Settings(voice=voice, model="eleven_flash_v2_5"),
    )


def test_pipecat_websocket_service_in_a_pipeline(server: LiveServer, voice: str) -> None:
    from pipecat.frames.frames import (
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
    )
    from pipecat.tests.utils import SleepFrame

    service = _pipecat_socket_service(server, voice)
    frames = [
        LLMFullResponseStartFrame(),
        LLMTextFrame(FIRST),
        LLMTextFrame("Please call"),  # the next sentence has begun: the first is complete
        SleepFrame(sleep=1.5),  # the first sentence's audio comes in ~0.1 s here
        LLMTextFrame(SECOND[len("Please call") :]),
        LLMFullResponseEndFrame(),
    ]
    # the rest (~3 s of audio) is made in well under a second
    pcm, words, arrivals, texts, up = _pipecat_run(service, frames, sleep_s=3.0)
    assert not up, up  # no ErrorFrame
    assert arrivals and arrivals[0] < texts[2]  # it spoke before the rest was sent
    assert_intelligible(pcm, RATE_HZ, FIRST + SECOND)
    assert [normalize(w) for w, _ in words] == normalize(FIRST + SECOND).split()
    assert_times_agree(words, pcm, RATE_HZ)
    assert engine_idle(server, 2.0)


def test_pipecat_interruption_stops_the_audio(server: LiveServer, voice: str) -> None:
    from pipecat.frames.frames import (
        InterruptionFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
    )
    from pipecat.tests.utils import SleepFrame

    service = _pipecat_socket_service(server, voice)
    cancelled = cancelled_streams(server)
    frames = [
        LLMFullResponseStartFrame(),
        LLMTextFrame(LONG),
        SleepFrame(sleep=2.0),  # it speaks; its text is not ended (no flush)
        InterruptionFrame(),  # the user barges in: close_context without a flush
    ]
    with EngineWatch(server) as watch:
        # the socket stays open 3 s after the interruption: the stop is the context's
        _, _, arrivals, interrupted, up = _pipecat_run(
            service, frames, sleep_s=3.0, mark=InterruptionFrame
        )
    assert arrivals and not up
    assert watch.idle_after(interrupted[0]) < 0.5  # within the chunk being made
    assert cancelled_streams(server) == cancelled + 1  # cut short, not finished


def test_pipecat_http_service_in_a_pipeline(server: LiveServer, voice: str) -> None:
    from pipecat.frames.frames import TTSSpeakFrame
    from pipecat.services.elevenlabs.tts import ElevenLabsHttpTTSService

    holder: dict[str, object] = {}

    def build():
        session = aiohttp.ClientSession()
        holder["session"] = session
        return ElevenLabsHttpTTSService(
            api_key="any",
            aiohttp_session=session,
            base_url=server.base_url,
            sample_rate=RATE_HZ,
            settings=ElevenLabsHttpTTSService.Settings(voice=voice, model="eleven_flash_v2_5"),
        )

    from pipecat.frames.frames import TTSAudioRawFrame
    from pipecat.tests.utils import SleepFrame, run_test

    words: list[tuple[str, float]] = []

    async def run():
        service = build()
        original = service.add_word_timestamps

        async def recording(word_times, *args, **kwargs):
            words.extend(word_times)
            return await original(word_times, *args, **kwargs)

        service.add_word_timestamps = recording
        try:
            return await run_test(
                service, frames_to_send=[TTSSpeakFrame(FIRST + SECOND), SleepFrame(sleep=1.0)]
            )
        finally:
            await holder["session"].close()  # type: ignore[attr-defined]

    down, up = asyncio.run(run())
    assert not up, up
    pcm = decode(
        b"".join(f.audio for f in down if isinstance(f, TTSAudioRawFrame)), "pcm", RATE_HZ
    )[0]
    assert_intelligible(pcm, RATE_HZ, FIRST + SECOND)
    assert [normalize(w) for w, _ in words] == normalize(FIRST + SECOND).split()
    assert_times_agree(words, pcm, RATE_HZ)


# LiveKit.


def _livekit_tts(server: LiveServer, voice: str, session: aiohttp.ClientSession, **kwargs):
    from livekit.plugins import elevenlabs

    return elevenlabs.TTS(
        voice_id=voice,
        api_key="any",
        base_url=server.base_url + "/v1",
        http_session=session,
        **kwargs,
    )


def _frames_pcm(frames) -> tuple[np.ndarray, int]:
    data = b"".join(bytes(f.data) for f in frames)
    return np.frombuffer(data, "<i2").astype(np.float32) / 32768.0, frames[0].sample_rate


def test_livekit_stream_and_synthesize(server: LiveServer, voice: str) -> None:
    from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

    async def run():
        async with aiohttp.ClientSession() as session:
            tts = _livekit_tts(server, voice, session)  # mp3_22050_32 by default
            stream = tts.stream()
            stream.push_text(FIRST)
            stream.push_text("Please call")  # the next sentence begun: the first is complete
            frames, words, first_at = [], [], None
            pushed_rest = asyncio.Event()

            async def push_rest():
                await asyncio.sleep(2.5)
                stream.push_text(SECOND[len("Please call") :])
                stream.end_input()
                pushed_rest.set()

            pusher = asyncio.create_task(push_rest())
            async for event in stream:
                if first_at is None:
                    first_at = pushed_rest.is_set()
                frames.append(event.frame)
                for timed in event.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []):
                    words.append((str(timed), timed.start_time))
            await pusher
            await stream.aclose()
            chunked = [ev.frame async for ev in tts.synthesize(FIRST)]
            await tts.aclose()
            return frames, words, first_at, chunked

    frames, words, rest_sent_first, chunked = asyncio.run(run())
    assert rest_sent_first is False  # audio came while the second sentence was unfinished
    pcm, rate_hz = _frames_pcm(frames)
    assert_intelligible(pcm, rate_hz, FIRST + SECOND)
    spoken = [(w.strip(), t) for w, t in words if w.strip()]
    assert [normalize(w) for w, _ in spoken] == normalize(FIRST + SECOND).split()
    assert_times_agree(spoken, pcm, rate_hz)  # sync_alignment: the context's clock
    pcm, rate_hz = _frames_pcm(chunked)
    assert_intelligible(pcm, rate_hz, FIRST)


def test_livekit_interruption_stops_the_audio(server: LiveServer, voice: str) -> None:
    cancelled = cancelled_streams(server)
    closed_at: list[float] = []

    async def run():
        async with aiohttp.ClientSession() as session:
            tts = _livekit_tts(server, voice, session, encoding="pcm_22050")
            stream = tts.stream()
            stream.push_text(LONG)  # no end_input: the answer is still being written
            async for _ in stream:
                break  # the first audio: the user barges in
            closed_at.append(time.monotonic())
            await stream.aclose()  # close_context without a flush
            await asyncio.sleep(2.0)  # the socket stays open: the stop is the context's
            await tts.aclose()

    with EngineWatch(server) as watch:
        asyncio.run(run())
    assert watch.idle_after(closed_at[0]) < 0.5
    assert cancelled_streams(server) == cancelled + 1  # cut short, not finished

"""The real voice (Piper, en_US-joe-medium) through the HTTP API of a live server.

One PiperBackend is loaded for the module, with noise scales 0 (`piper.noise_scale=0`,
`piper.noise_w=0`) so that every output is deterministic, and served by one live uvicorn
server (`create_app(..., backend_factory=)`, so the tests can use the same loaded voice).

What "streamed and non-streamed output match" means here, since Playhead only ever streams:

1. Transport: the same request read incrementally (chunked transfer, piece by piece) and
   read in one go by a plain client give the same bytes, and the SSE deltas of the same
   request, concatenated, are those bytes too. With noise scales 0, and the engine's two
   timing-led choices pinned (`settings` below), this is byte-exact.
2. Audio: the engine decodes each segment in chunks with a few frames of context (the
   HiFi-GAN decoder is non-causal), so its output is not bit-exact against the original,
   uncut Piper graph run on each whole segment; it must be within 30 dB SNR of it, with
   exactly the same length (the sum of the segments' frames times 256 samples).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.settings import Settings, load_settings
from pipeline.backends.piper import PiperBackend
from pipeline.backends.piper.reference import synthesize_whole, whole_model_session
from pipeline.text import split_text
from tests.api_support import LiveServer, decode, live_server, parse_sse
from tests.asr import transcribe, word_error_rate

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SPEECH = "/v1/audio/speech"
VOICE_RATE_HZ = 22050
MAX_WER = 0.35  # per sentence; pocketsphinx on this voice measured 0.0-0.11 for these

# Sentences of this module's own, each one request.
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back tomorrow morning after nine o'clock.",
    "We will meet at the station at half past seven.",
    "Turn left at the next corner and walk two blocks north.",
)
# Three segments: a short first sentence, one cut at its clause, one whole.
LONG_TEXT = (
    "Hello there. The weather is nice today, and the sun is shining over the quiet "
    "harbour. Please call me back tomorrow morning after nine o'clock."
)


@pytest.fixture(scope="module")
def settings() -> Settings:
    """Noise scales 0, and the two choices that follow the stream's timing pinned, so that
    the same request gives the same bytes: every segment urgent (its flow in the same
    chunks whenever it is opened), which changes the audio only within float noise of the
    whole flow. Admission off (below)."""
    return load_settings(
        ROOT / "configs" / "default.yaml",
        [
            "backend.kind=piper",
            "server.log_level=warning",
            "piper.noise_scale=0",
            "piper.noise_w=0",
            # what is heard, not who is admitted: four requests at once must all be served
            # however slow the machine reads while they start (admission: test_admission*)
            "admission.enabled=false",
            "engine.calibration_calls=0",
            "talker.urgent_slack_s=1000000.0",
            "alone.urgent_slack_s=1000000.0",
        ],
        environ={},
    )


@pytest.fixture(scope="module")
def backend(settings: Settings) -> PiperBackend:
    """The bundled voice, noise scales 0 (default graph cache: the cut is done once)."""
    return PiperBackend(settings.piper)


@pytest.fixture(scope="module")
def server(settings: Settings, backend: PiperBackend) -> Iterator[LiveServer]:
    with live_server(settings, backend_factory=lambda: backend) as live:
        yield live


def body(text: str, **fields: object) -> dict[str, object]:
    return {"model": "tts-1", "input": text, "voice": "alloy", **fields}


def post(server: LiveServer, payload: dict[str, object]) -> httpx.Response:
    response = httpx.post(server.base_url + SPEECH, json=payload, timeout=60)
    assert response.status_code == 200, response.text[:300]
    return response


def read_incrementally(
    server: LiveServer, payload: dict[str, object]
) -> tuple[httpx.Response, list[bytes]]:
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", server.base_url + SPEECH, json=payload) as response,
    ):
        assert response.status_code == 200
        pieces = [piece for piece in response.iter_raw() if piece]
    return response, pieces


def pcm_samples(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((reference - test) ** 2))
    return 10.0 * float(np.log10(float(np.sum(reference**2)) / max(noise, 1e-30)))


def test_speech_through_the_api_is_intelligible(server: LiveServer) -> None:
    """Four requests at once (they share vocoder turns), wav at 16 kHz; WER per sentence."""
    payloads = [body(text, response_format="wav", sample_rate=16000) for text in SENTENCES]
    with ThreadPoolExecutor(len(payloads)) as pool:
        responses = list(pool.map(lambda p: post(server, p), payloads))
    heard = []
    for text, response in zip(SENTENCES, responses, strict=True):
        assert response.headers["content-type"] == "audio/wav"
        samples, rate_hz = decode(response.content, "wav")
        assert rate_hz == 16000
        assert 1.5 < samples.size / rate_hz < 6.0, samples.size / rate_hz  # a sentence
        hypothesis = transcribe(samples, rate_hz)
        heard.append((text, hypothesis, word_error_rate(text, hypothesis)))
    assert all(wer <= MAX_WER for _, _, wer in heard), heard


def _same_speech(heard: bytes, expected: bytes) -> None:
    """The same PCM but for the seams: where a stream's chunks are cut may depend on timing
    (an urgent stream's chunk waits for no lookahead), which moves a few samples near a
    seam by a few steps; a lost, repeated or misplaced piece would differ everywhere after
    it. So: the same length, and the difference 40 dB under the signal (the seams' bound)."""
    a, b = (np.frombuffer(pcm, dtype="<i2").astype(np.float64) for pcm in (heard, expected))
    assert a.size == b.size > 0
    assert np.sum((a - b) ** 2) <= 1e-4 * np.sum(b**2)


def test_a_stream_read_piece_by_piece_equals_one_read_and_the_sse_deltas(
    server: LiveServer,
) -> None:
    payload = body(LONG_TEXT, response_format="pcm", sample_rate=VOICE_RATE_HZ)
    response, pieces = read_incrementally(server, payload)
    assert response.headers["transfer-encoding"] == "chunked"
    assert "content-length" not in response.headers
    assert len(pieces) > 3, "the audio leaves chunk by chunk"
    streamed = b"".join(pieces)
    assert len(streamed) > 2 * VOICE_RATE_HZ * 5  # more than 5 s of speech

    _same_speech(post(server, payload).content, streamed)

    sse = post(server, {**payload, "stream_format": "sse"})
    *deltas, done = parse_sse(sse.content)
    assert done["type"] == "speech.audio.done"
    assert len(deltas) > 3 and all(e["type"] == "speech.audio.delta" for e in deltas)
    _same_speech(b"".join(base64.b64decode(str(e["audio"])) for e in deltas), streamed)


def test_streamed_audio_is_within_30_db_of_whole_segment_synthesis(
    server: LiveServer, settings: Settings, backend: PiperBackend
) -> None:
    """The reference runs the uncut Piper graph on each segment the engine talks (same
    segmentation, same scales, same fixed gain), concatenated."""
    streamed = pcm_samples(
        post(server, body(LONG_TEXT, response_format="pcm", sample_rate=VOICE_RATE_HZ)).content
    )

    voice = backend.default_voice()
    noise_scale, length_scale, noise_w = backend.scales(voice)
    assert (noise_scale, noise_w) == (0.0, 0.0)
    session = whole_model_session(backend.voice_spec(voice).model_path)
    segments = split_text(
        LONG_TEXT,
        first_fragment_words=settings.text.first_fragment_words,
        max_segment_chars=settings.text.max_segment_chars,
    )
    assert len(segments) == 3
    reference = np.concatenate(
        [
            synthesize_whole(
                session,
                backend.phoneme_ids(voice, segment),
                noise_scale=noise_scale,
                length_scale=length_scale,
                noise_w=noise_w,
            )
            for segment in segments
        ]
    )
    reference = np.clip(reference * settings.piper.output_gain, -1.0, 1.0)
    assert streamed.size == reference.size
    assert snr_db(reference, streamed) >= 30.0


def test_the_openai_sdk_writes_an_mp3_that_decodes_and_is_understood(
    server: LiveServer, tmp_path: Path
) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    text = SENTENCES[3]
    target = tmp_path / "speech.mp3"
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=text, response_format="mp3"
    ) as response:
        assert response.headers["content-type"] == "audio/mpeg"
        response.stream_to_file(target)
    samples, rate_hz = decode(target.read_bytes(), "mp3")
    assert rate_hz == 24000
    pcm = pcm_samples(post(server, body(text, response_format="pcm")).content)
    # mp3 adds the encoder's priming samples and the last frame's padding
    assert 0.0 <= (samples.size - pcm.size) / rate_hz <= 0.1
    hypothesis = transcribe(samples, rate_hz)
    assert word_error_rate(text, hypothesis) <= MAX_WER, hypothesis

"""Text as people write it, through the HTTP API of a live server with the real voice.

- intelligibility: sentences full of numbers, money, dates and abbreviations, sent as
  written, are heard (pocketsphinx) as their spoken forms;
- long unbroken tokens (URLs of 200 and 1,000 characters, 4,096 x "é", 4,096 emoji) give
  first audio and no server-side stall, with the normaliser on and off;
- nothing speakable -> 400; `x-request-id` on every response; model id families;
  OpenAI voice names in any case.

One PiperBackend (noise scales 0) serves two live servers: normalisation on (the default)
and off.
"""

from __future__ import annotations

import random
import string
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.settings import Settings, load_settings
from pipeline.backends.piper import PiperBackend
from pipeline.stream import StreamStats
from tests.api_support import LiveServer, decode, live_server
from tests.asr import normalize, transcribe, word_error_rate

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SPEECH = "/v1/audio/speech"
MAX_WER = 0.25  # over all sentences; the spoken forms themselves, sent as input, ~0.1

# (as written, as said)
SENTENCES = (
    (
        "Dr. Smith paid $3.50 on 12/05/2024 at 3:45 PM.",
        "Doctor Smith paid three dollars and fifty cents on December fifth twenty twenty four "
        "at three forty five p m",
    ),
    (
        "The meeting moved to Jan. 15, 2025 at 10:30 AM in room 42.",
        "The meeting moved to January fifteenth twenty twenty five at ten thirty a m in room "
        "forty two",
    ),
    (
        "Mr. Jones spent $1,200 on 3 tickets, about 25% more than in 2019.",
        "Mister Jones spent one thousand two hundred dollars on three tickets about twenty five "
        "percent more than in twenty nineteen",
    ),
    (
        "Call 555-123-4567 before 5 PM on the 3rd of May.",
        "Call five five five one two three four five six seven before five p m on the third of May",
    ),
    (
        "The 2nd train leaves at 7:15 and costs €12.40, e.g. less than a taxi.",
        "The second train leaves at seven fifteen and costs twelve euros and forty cents for "
        "example less than a taxi",
    ),
    (
        "Prof. Lee ran 5 km in 21 minutes on July 4, 1999.",
        "Professor Lee ran five kilometers in twenty one minutes on July fourth nineteen "
        "ninety nine",
    ),
)

_random = random.Random(12)


def _random_path(chars: int) -> str:
    return "".join(_random.choice(string.ascii_letters + string.digits) for _ in range(chars))


LONG_TOKENS = {
    "url_200": f"Visit https://example.com/{_random_path(200)} today.",
    "url_1000": f"Visit https://example.com/{_random_path(1000)} today.",
    "e_acute_4096": "é" * 4096,
}
EMOJI_4096 = "🎉" * 4096
PCM_RATE_HZ = 24000  # server.default_sample_rate_hz: pcm is s16le mono at this rate
READ_AUDIO_S = 12.0  # audio read from each long stream before hanging up
# The fault these tests guard against stalled for 12.6 s; a loaded machine (other
# processes on both cores) has cost a few milliseconds of CPU starvation, not a stall.
JITTER_S = 0.1


def _settings(*overrides: str) -> Settings:
    return load_settings(
        None,
        [
            "server.log_level=warning",
            "piper.noise_scale=0",
            "piper.noise_w=0",
            "engine.calibration_calls=0",  # one request at a time: nothing to calibrate for
            *overrides,
        ],
        environ={},
    )


@pytest.fixture(scope="module")
def backend() -> PiperBackend:
    settings = _settings()
    return PiperBackend(settings.piper)


class FinishedStreams:
    """The engine's `stream_finished` events, recorded on the way to the app's metrics."""

    def __init__(self, server: LiveServer) -> None:
        self.stats: dict[str, StreamStats] = {}
        metrics = server.app.state.playhead.metrics
        original = metrics.stream_finished

        def record(stats: StreamStats, state: object) -> None:
            self.stats[stats.stream_id] = stats
            original(stats, state)

        metrics.stream_finished = record

    def wait(self, stream_id: str, timeout_s: float = 30.0) -> StreamStats:
        import time

        deadline = time.monotonic() + timeout_s
        while stream_id not in self.stats and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.stats[stream_id]


@pytest.fixture(scope="module")
def server(backend: PiperBackend) -> Iterator[LiveServer]:
    with live_server(_settings(), backend_factory=lambda: backend) as live:
        live.finished = FinishedStreams(live)  # type: ignore[attr-defined]
        yield live


@pytest.fixture(scope="module")
def raw_server(backend: PiperBackend, server: LiveServer) -> Iterator[LiveServer]:
    """Normalisation off: the long tokens reach the phonemiser as written."""
    with live_server(_settings("normalize.enabled=false"), backend_factory=lambda: backend) as live:
        live.finished = FinishedStreams(live)  # type: ignore[attr-defined]
        yield live


def body(text: str, **fields: object) -> dict[str, object]:
    return {"model": "tts-1", "input": text, "voice": "alloy", **fields}


def heard(server: LiveServer, text: str) -> str:
    response = httpx.post(
        server.base_url + SPEECH,
        json=body(text, response_format="wav", sample_rate=16000),
        timeout=120,
    )
    assert response.status_code == 200, response.text[:300]
    samples, rate_hz = decode(response.content, "wav")
    return transcribe(samples, rate_hz)


def corpus_wer(pairs: list[tuple[str, str]]) -> float:
    """Word errors over all sentences / reference words over all sentences."""
    errors = sum(word_error_rate(ref, hyp) * len(normalize(ref).split()) for ref, hyp in pairs)
    return errors / sum(len(normalize(ref).split()) for ref, _ in pairs)


def test_numbers_money_dates_and_abbreviations_are_heard_as_said(server: LiveServer) -> None:
    written = [(said, heard(server, text)) for text, said in SENTENCES]
    wer_written = corpus_wer(written)
    print(f"\nWER written input {wer_written:.3f}")
    for said, hypothesis in written:
        print(f"  said:  {said}\n  heard: {hypothesis}")
    assert wer_written <= MAX_WER, written


def test_without_normalisation_the_written_forms_are_not_heard_as_said(
    raw_server: LiveServer,
) -> None:
    """The check above can fail: the same sentences without the normaliser miss."""
    written = [(said, heard(raw_server, text)) for text, said in SENTENCES[:3]]
    assert corpus_wer(written) > MAX_WER, written


def first_audio_then_hang_up(server: LiveServer, text: str) -> tuple[str, float]:
    """(stream id, seconds of audio read) after reading READ_AUDIO_S of 16-bit PCM."""
    read = 0
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST", server.base_url + SPEECH, json=body(text, response_format="pcm")
        ) as response,
    ):
        if response.status_code != 200:
            engine = server.app.state.playhead.engine
            raise AssertionError(
                f"{response.status_code} {response.read()[:300]!r}; capacity "
                f"{engine.capacity():.2f}, loads {engine.book.loads(0.3)}"
            )
        stream_id = response.headers["x-request-id"]
        for piece in response.iter_raw():
            read += len(piece)
            if read >= READ_AUDIO_S * 2 * PCM_RATE_HZ:
                break
    return stream_id, read / 2 / PCM_RATE_HZ


@pytest.mark.parametrize("name", list(LONG_TOKENS))
@pytest.mark.parametrize("normalised", [True, False], ids=["normalised", "raw"])
def test_a_long_token_gives_first_audio_and_no_stall(
    server: LiveServer, raw_server: LiveServer, name: str, normalised: bool
) -> None:
    live = server if normalised else raw_server
    stream_id, audio_s = first_audio_then_hang_up(live, LONG_TOKENS[name])
    if normalised:  # a link's host and short path, a run of one letter a few times (tokens.py)
        assert 0 < audio_s < 5
    else:
        assert audio_s >= READ_AUDIO_S
    stats = live.finished.wait(stream_id)  # type: ignore[attr-defined]
    assert stats.ttfa_s is not None
    assert stats.stall_s <= JITTER_S, stats
    if normalised:
        # read whole, its short audio still counts as playing (admission's 1x clock) for
        # up to its length: let it end, so that the next request is not refused (429)
        time.sleep(audio_s)


def test_four_thousand_emoji_say_nothing_or_no_stall(
    server: LiveServer, raw_server: LiveServer
) -> None:
    """Normalised: nothing to say (400). Raw: espeak reads each by its name, bounded."""
    response = httpx.post(server.base_url + SPEECH, json=body(EMOJI_4096), timeout=30)
    assert response.status_code == 400
    stream_id, _ = first_audio_then_hang_up(raw_server, EMOJI_4096)
    stats = raw_server.finished.wait(stream_id)  # type: ignore[attr-defined]
    assert stats.stall_s <= JITTER_S, stats


@pytest.mark.parametrize("text", ["...", "🎉🎉", " — ! ? "])
def test_nothing_speakable_is_a_400_in_the_openai_envelope(server: LiveServer, text: str) -> None:
    response = httpx.post(server.base_url + SPEECH, json=body(text), timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "input"
    assert error["code"] == "nothing_to_speak"
    assert "nothing speakable" in error["message"]
    assert response.headers["x-request-id"].startswith("req_")


def test_x_request_id_is_the_stream_id_and_fresh_elsewhere(server: LiveServer) -> None:
    response = httpx.post(server.base_url + SPEECH, json=body("Hello."), timeout=60)
    assert response.status_code == 200
    assert response.headers["x-request-id"] == response.headers["x-playhead-stream-id"]
    ids = {httpx.get(server.base_url + path).headers["x-request-id"] for path in ("/health",) * 3}
    assert len(ids) == 3
    missing = httpx.get(server.base_url + "/v1/models/nope")
    assert missing.status_code == 404 and missing.headers["x-request-id"].startswith("req_")


@pytest.mark.parametrize(
    "model",
    ["tts-1", "tts-1-hd", "tts-1-1106", "tts-1-hd-1106", "gpt-4o-mini-tts-2025-12-15", "playhead"],
)
def test_model_ids_by_family(server: LiveServer, model: str) -> None:
    response = httpx.post(
        server.base_url + SPEECH, json={**body("Hi."), "model": model}, timeout=60
    )
    assert response.status_code == 200, response.text
    assert httpx.get(f"{server.base_url}/v1/models/{model}").status_code == 200


@pytest.mark.parametrize("model", ["tts-2", "tts-10", "gpt-4o-mini", "playhead-2"])
def test_other_model_ids_are_404(server: LiveServer, model: str) -> None:
    response = httpx.post(
        server.base_url + SPEECH, json={**body("Hi."), "model": model}, timeout=60
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("voice", ["Nova", "ALLOY", "sHiMmEr"])
def test_openai_voice_names_in_any_case(server: LiveServer, voice: str) -> None:
    response = httpx.post(
        server.base_url + SPEECH, json={**body("Hi."), "voice": voice}, timeout=60
    )
    assert response.status_code == 200, response.text


SPEED_TEXT = (
    "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore, "
    "and the shells she sells are surely sea shells."
)


def spoken_seconds(server: LiveServer, text: str, speed: float) -> float:
    response = httpx.post(
        server.base_url + SPEECH,
        json=body(text, response_format="pcm", speed=speed),
        timeout=120,
    )
    assert response.status_code == 200, response.text[:300]
    return len(response.content) / 2 / PCM_RATE_HZ


@pytest.fixture(scope="module")
def fast_reader_server(backend: PiperBackend, server: LiveServer) -> Iterator[LiveServer]:
    """Admission off: one client reads minutes of audio in seconds, one request after
    another, which the admission would count as that many players still listening."""
    with live_server(_settings("admission.enabled=false"), backend_factory=lambda: backend) as live:
        yield live


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.8, 1.5, 2.0, 4.0])
def test_speed_scales_the_duration_as_asked(fast_reader_server: LiveServer, speed: float) -> None:
    normal_s = spoken_seconds(fast_reader_server, SPEED_TEXT, 1.0)
    asked_s = normal_s / speed
    got_s = spoken_seconds(fast_reader_server, SPEED_TEXT, speed)
    assert abs(got_s / asked_s - 1.0) <= 0.05, f"{got_s:.2f} s for {asked_s:.2f} s asked"


@pytest.mark.parametrize("speed", [0.5, 1.5])  # pocketsphinx loses most words at 2x and up
def test_speech_at_other_speeds_is_heard(fast_reader_server: LiveServer, speed: float) -> None:
    said = "the quick brown fox jumps over the lazy dog"
    response = httpx.post(
        fast_reader_server.base_url + SPEECH,
        json=body(said + ".", response_format="wav", sample_rate=16000, speed=speed),
        timeout=120,
    )
    samples, rate_hz = decode(response.content, "wav")
    assert word_error_rate(said, transcribe(samples, rate_hz)) <= 0.34

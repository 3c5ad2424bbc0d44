"""The tiny codec-LM model served end to end over HTTP (configs/codec-lm-tiny.yaml): every
format streams and decodes to the duration the model's frames predict; greedy decoding makes
the audio repeatable; the voices are listed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from api_support import LiveServer, decode
from codec_lm_support import expected_frames, tiny_settings

from pipeline.backends.codec_lm.loading import random_model_path

TEXT = "Hello there. The tiny codec model speaks noise, on time."
# decoded minus predicted duration, s (as in test_api_streaming: mp3 and aac add priming)
EXTRA_S_RANGE = {
    "mp3": (0.0, 0.1),
    "aac": (0.0, 0.1),
    "opus": (-0.002, 0.002),
    "flac": (-0.002, 0.002),
    "wav": (-0.002, 0.002),
    "pcm": (-0.002, 0.002),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # admission off: requests run one after another here, each counted until its player
    # would run dry; the admission rule is tested with the sim backend
    settings = tiny_settings(
        tmp_path_factory.getbasetemp() / "codec-lm-cache", "admission.enabled=false"
    )
    random_model_path(settings.codec_lm)  # build once here: the server only loads it
    live = LiveServer(settings)
    live.start(timeout_s=120)
    try:
        yield live
    finally:
        live.stop()


def _speech(server: LiveServer, fmt: str, voice: str = "speaker-0") -> tuple[httpx.Response, bytes]:
    body = {"model": "tts-1", "input": TEXT, "voice": voice, "response_format": fmt}
    with (
        httpx.Client(base_url=server.base_url, timeout=120) as client,
        client.stream("POST", "/v1/audio/speech", json=body) as response,
    ):
        data = b"".join(response.iter_raw())
    return response, data


@pytest.mark.parametrize("fmt", list(EXTRA_S_RANGE))
def test_every_format_carries_the_frames_audio(server: LiveServer, fmt: str) -> None:
    response, data = _speech(server, fmt)
    assert response.status_code == 200, data[:200]
    samples, rate_hz = decode(data, fmt)
    engine = server.app.state.playhead.require_engine()
    frames = expected_frames(engine.backend, TEXT, server.settings.text)
    extra_s = samples.size / rate_hz - frames * 0.08
    low, high = EXTRA_S_RANGE[fmt]
    assert low <= extra_s <= high, (fmt, extra_s)
    assert np.std(samples) > 0.01  # noise, not silence


def test_greedy_audio_repeats_and_voices_differ(server: LiveServer) -> None:
    """Same frames each time (greedy); the PCM equal to float noise (chunks are decoded in
    batches of different sizes), so within one int16 step."""
    first = decode(_speech(server, "pcm")[1], "pcm")[0]
    again = decode(_speech(server, "pcm")[1], "pcm")[0]
    np.testing.assert_allclose(again, first, rtol=0, atol=1.01 / 32768)
    other = decode(_speech(server, "pcm", voice="speaker-1")[1], "pcm")[0]
    assert other.shape == first.shape and np.abs(other - first).max() > 0.1


def test_the_voices_are_listed(server: LiveServer) -> None:
    voices = httpx.get(f"{server.base_url}/v1/audio/voices", timeout=10).json()["voices"]
    assert [v["id"] for v in voices] == ["speaker-0", "speaker-1"]


def test_the_model_was_built_in_the_cache(server: LiveServer) -> None:
    cache = Path(server.settings.codec_lm.cache_dir or "")
    assert any(p.name.startswith("random-") for p in cache.iterdir())

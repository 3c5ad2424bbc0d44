"""No pause inside a sentence that the whole-sentence synthesis does not have.

Each sentence is its own request to a live server on the real voice (noise 0, so the
output is deterministic) at configs/default.yaml's settings: it is a stream's first
sentence, where a first-fragment cut would fall. The longest internal pause of what comes
back (benchmarks.lab.pauses: 10 ms windows 40 dB under the loudest) must be no longer than
that of the uncut Piper graph run on the whole sentence, give or take three windows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.settings import Settings, load_settings
from benchmarks.lab.pauses import SENTENCES, WINDOW_S, longest_internal_pause_s, served_pcm
from pipeline.backends.piper import PiperBackend, synthesize_whole
from pipeline.backends.piper.reference import whole_model_session
from tests.api_support import LiveServer, live_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
# window quantisation, and a clause cut's second piece (synthesised on its own, its own
# pauses move by a window or two; a cut between two joined words adds 90-110 ms)
TOLERANCE_S = 3 * WINDOW_S


@pytest.fixture(scope="module")
def settings() -> Settings:
    return load_settings(
        ROOT / "configs" / "default.yaml",
        [
            "backend.kind=piper",
            "server.log_level=warning",
            "piper.noise_scale=0",
            "piper.noise_w=0",
            "engine.calibration_calls=0",  # one request at a time: nothing to calibrate for
        ],
        environ={},
    )


@pytest.fixture(scope="module")
def backend(settings: Settings) -> PiperBackend:
    return PiperBackend(settings.piper)


@pytest.fixture(scope="module")
def server(settings: Settings, backend: PiperBackend) -> Iterator[LiveServer]:
    with live_server(settings, backend_factory=lambda: backend) as live:
        yield live


def test_the_pause_measure_finds_a_gap_and_ignores_the_ends() -> None:
    import numpy as np

    rate_hz = 1000
    tone = np.sin(np.arange(300) * 0.3).astype(np.float32)
    quiet = np.zeros(120, dtype=np.float32)
    pcm = np.concatenate([quiet, tone, quiet, tone, np.zeros(500, np.float32)])
    assert longest_internal_pause_s(pcm, rate_hz) == pytest.approx(0.12)


@pytest.mark.parametrize("text", SENTENCES, ids=lambda t: " ".join(t.split()[:4]))
def test_a_first_sentence_has_no_longer_pause_than_its_whole_synthesis(
    server: LiveServer, backend: PiperBackend, text: str
) -> None:
    voice = backend.default_voice()
    rate_hz = backend.sample_rate_hz
    noise_scale, length_scale, noise_w = backend.scales(voice)
    assert (noise_scale, noise_w) == (0.0, 0.0)
    whole = synthesize_whole(
        whole_model_session(backend.voice_spec(voice).model_path),
        backend.phoneme_ids(voice, text),
        noise_scale=noise_scale,
        length_scale=length_scale,
        noise_w=noise_w,
    )
    served = served_pcm(server.base_url, text, rate_hz)
    served_pause = longest_internal_pause_s(served, rate_hz)
    whole_pause = longest_internal_pause_s(whole, rate_hz)
    assert served_pause <= whole_pause + TOLERANCE_S, (served_pause, whole_pause)

"""The default Piper voice's timings agree with its audio: pocketsphinx, forced to the
spoken words, finds each word where the alignment says it starts.

Each text goes through the normaliser with its map (as the WebSocket does), so the words
timed are the client's ("$3.50"); the recogniser aligns the spoken words ("three dollars
and fifty cents"), and a client word's start is compared with the recogniser's start of
the first spoken word that stands for it. pocketsphinx places boundaries at 10 ms frames
and has its own biases at word edges: the bound is on the median and on the worst word.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soxr
from asr import ASR_RATE_HZ

from app.settings import Settings, load_settings
from pipeline.alignment import SpokenText
from pipeline.backends.piper import PiperBackend
from pipeline.engine import Engine
from pipeline.normalize import normalize_mapped

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TEXTS = (
    "It costs $3.50 today, said the woman at the counter.",
    "In 1995 we had 23 cats and a very old dog.",
    "I am going to the shop of the year, because it is open. Then we walk home.",
)
# the brief asks for 80 ms; measured 26 ms (speed 1) and 22 ms (1.5) on the bundled voice:
# 60 ms still fails when every phoneme is timed one phoneme late (67 ms at speed 1)
MEDIAN_MAX_S = 0.060
WORST_MAX_S = 0.250


@pytest.fixture(scope="module")
def settings() -> Settings:
    return load_settings(
        ROOT / "configs" / "default.yaml",
        [
            "backend.kind=piper",
            "piper.noise_scale=0",
            "piper.noise_w=0",
            "engine.calibration_calls=0",
        ],
        environ={},
    )


@pytest.fixture(scope="module")
def backend(settings: Settings) -> Iterator[PiperBackend]:
    backend = PiperBackend(settings.piper)
    yield backend
    backend.close()


async def speak(settings: Settings, backend: PiperBackend, text: SpokenText, speed: float):
    engine = Engine(
        backend,
        scheduling=settings.scheduling,
        chunking=settings.chunking,
        admission=settings.admission,
        engine=settings.engine,
        talker=settings.talker,
        vocoder=settings.vocoder,
    )
    await engine.start()
    try:
        stream = engine.submit(text, voice=backend.default_voice(), speed=speed)
        parts = [pcm async for pcm in stream.chunks()]
    finally:
        await engine.stop()
    return np.concatenate(parts), stream


def recognised_starts(pcm: np.ndarray, rate_hz: int, words: list[str]) -> list[float]:
    """Where pocketsphinx, forced to `words`, starts each of them (seconds)."""
    from pocketsphinx import Decoder

    audio = soxr.resample(pcm.astype(np.float32), rate_hz, ASR_RATE_HZ)
    pcm16 = (np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)
    decoder = Decoder(samprate=ASR_RATE_HZ, loglevel="FATAL")
    decoder.set_align_text(" ".join(words))
    decoder.start_utt()
    decoder.process_raw(pcm16.tobytes(), full_utt=True)
    decoder.end_utt()
    found = [
        (re.sub(r"\(\d+\)$", "", seg.word), seg.start_frame / 100.0)
        for seg in decoder.seg()
        if not seg.word.startswith(("<", "["))
    ]
    assert [word for word, _ in found] == words, "forced alignment lost words"
    return [start for _, start in found]


def start_errors(text: str, pcm: np.ndarray, stream) -> list[tuple[str, float]]:
    """(client word, alignment start - recognised start) for each word with letters."""
    spoken = normalize_mapped(text, "en_US")
    # the recogniser's words: the spoken words, lower case, split at hyphens, each with
    # the client span of its first character
    asr_words: list[str] = []
    asr_sources: list[int] = []
    for match in re.finditer(r"\S+", spoken):
        source_start = spoken.spans[match.start()][0]
        for part in re.findall(r"[a-z']+", match.group().lower()):
            asr_words.append(part.strip("'"))
            asr_sources.append(source_start)
    starts = recognised_starts(pcm, stream.sample_rate_hz, asr_words)
    heard: dict[int, float] = {}
    for source, start in zip(asr_sources, starts, strict=True):
        heard.setdefault(source, start)
    errors = []
    for word in stream.alignment.words:
        if any(c.isalnum() for c in word.word):
            errors.append((word.word, word.start_s - heard[word.start_index]))
    return errors


@pytest.mark.parametrize("speed", [1.0, 1.5])
def test_word_starts_agree_with_the_audio(
    settings: Settings, backend: PiperBackend, speed: float
) -> None:
    errors: list[tuple[str, float]] = []
    for text in TEXTS:
        pcm, stream = asyncio.run(speak(settings, backend, normalize_mapped(text, "en_US"), speed))
        words = [w.word for w in stream.alignment.words]
        assert words == text.split()
        errors.extend(start_errors(text, pcm, stream))
    sizes = np.abs([error for _, error in errors])
    worst = max(errors, key=lambda pair: abs(pair[1]))
    report = f"median {np.median(sizes) * 1000:.0f} ms; " + ", ".join(
        f"{w} {e * 1000:+.0f}" for w, e in errors
    )
    assert np.median(sizes) <= MEDIAN_MAX_S, report
    assert abs(worst[1]) <= WORST_MAX_S, report

"""The measured start admission's first-audio bound subtracts (scheduling/first_audio.py)."""

from __future__ import annotations

import math

import pytest
from conftest import EngineFactory, read_all

from pipeline.config import EngineConfig
from scheduling import FirstAudioWindow


def test_the_prediction_is_the_windows_quantile_by_nearest_rank() -> None:
    window = FirstAudioWindow(window_streams=10, quantile=0.9)
    assert window.predict_s() == 0.0
    for ms in (50, 80, 60, 300, 70, 90, 55, 65, 75, 85):
        window.record(ms / 1000)
    assert window.predict_s() == pytest.approx(0.090)  # the 9th of 10: one slow start ignored
    window.record(0.4)  # the oldest (50 ms) leaves; 300 and 400 ms are now the top two
    assert window.predict_s() == pytest.approx(0.300)


def test_a_slower_machine_moves_it_within_a_window() -> None:
    window = FirstAudioWindow(window_streams=4, quantile=0.5)
    for _ in range(4):
        window.record(0.1)
    for _ in range(4):
        window.record(0.5)
    assert window.predict_s() == pytest.approx(0.5)


def test_nonsense_times_are_ignored_and_bad_settings_refused() -> None:
    window = FirstAudioWindow()
    for value in (math.nan, math.inf, -0.1):
        window.record(value)
    assert window.predict_s() == 0.0
    with pytest.raises(ValueError, match="window_streams"):
        FirstAudioWindow(window_streams=0)
    with pytest.raises(ValueError, match="quantile"):
        FirstAudioWindow(quantile=0.0)


async def test_the_engine_reads_its_streams_first_audio_into_admissions_view(
    make_engine: EngineFactory,
) -> None:
    """What the bound subtracts is what the engine's streams took: each whole-text
    stream's submit -> first audio, recorded at its first chunk."""
    engine = await make_engine()
    assert engine.admission.view(0.0).first_audio_s == 0.0
    ttfas = []
    for text in ("One sentence here.", "Another one, a little longer than that."):
        stream = engine.submit(text, voice=engine.backend.default_voice())
        await read_all(stream)
        ttfas.append(stream.stats.ttfa_s)
    assert all(t is not None and t > 0 for t in ttfas)
    assert engine.admission.view(0.0).first_audio_s == pytest.approx(max(ttfas))


async def test_the_calibrations_streams_leave_no_first_audio_behind(
    make_engine: EngineFactory,
) -> None:
    """The start-up calibration starts its streams all at once: their first audio says
    nothing of a request's start, so the bound would take it off every wait."""
    engine = await make_engine(engine=EngineConfig(calibration_calls=8, recalibrate_idle_s=0))
    assert engine.calibrations == 1
    assert engine.admission.view(0.0).first_audio_s == 0.0

"""The capacity model (pipeline/capacity.py): each stage's cost per audio second read
per call, combined for its workers and the cores, robust to a short slow patch, never
above what the stage sustained saturated."""

from __future__ import annotations

import pytest

from pipeline.capacity import BUCKETS, STALE_WINDOWS, CapacityEstimate, pipeline_capacity

WINDOW_S = 8.0  # bins of 1 s
BIN_S = WINDOW_S / BUCKETS


def calls(
    rate: CapacityEstimate,
    start_s: float,
    end_s: float,
    *,
    call_s: float,
    audio_s: float,
    duty: float = 1.0,
    workers: int = 1,
) -> None:
    """Calls of `call_s` producing `audio_s` each, on `workers` workers side by side,
    back to back on each with an idle gap making `duty` busy time."""
    period_s = call_s / duty
    t = start_s
    while t + call_s <= end_s + 1e-9:
        for _ in range(workers):
            rate.record(t, t + call_s, audio_s)
        t += period_s


def test_nothing_measured_reads_the_initial_value() -> None:
    rate = CapacityEstimate(WINDOW_S, initial_audio_s_per_s=3.0)
    assert rate.value(0.0) == 3.0 and not rate.measured
    assert rate.cost_s_per_audio_s(0.0) is None


def test_partial_load_reads_what_the_workers_would_sustain() -> None:
    """Two workers, one call at a time half of the time: each call's own cost (0.1 s per
    audio s) says 2 workers sustain 20 audio s per s; the union of busy intervals (the
    old estimate) read 10."""
    rate = CapacityEstimate(WINDOW_S, workers=2)
    calls(rate, 0.0, 8.0, call_s=0.1, audio_s=1.0, duty=0.5)
    assert rate.cost_s_per_audio_s(8.0) == pytest.approx(0.1)
    assert rate.value(8.0) == pytest.approx(20.0)


def test_it_reads_no_more_than_the_stage_sustained_saturated_for_a_window() -> None:
    """Saturated (both workers busy all along), the calls cost more (they share the
    cores): 0.16 s per audio s. Lightly loaded after, they cost 0.1: for a window the
    reading stays at the saturated 12.5, not 20; then (no calibration here) the per-call
    reading is all there is."""
    rate = CapacityEstimate(WINDOW_S, workers=2)
    calls(rate, 0.0, 8.0, call_s=0.16, audio_s=1.0, workers=2)
    assert rate.sustained(9.0) == pytest.approx(12.5)
    calls(rate, 9.0, 13.0, call_s=0.1, audio_s=1.0, duty=0.3)
    assert rate.value(13.0) == pytest.approx(12.5)
    calls(rate, 13.0, 17.0, call_s=0.1, audio_s=1.0, duty=0.3)
    assert rate.cost_s_per_audio_s(17.0) == pytest.approx(0.1)
    assert rate.value(17.0) == pytest.approx(20.0)
    # the calibration seeds it before any saturated bin
    seeded = CapacityEstimate(WINDOW_S, workers=2)
    seeded.set_baseline(11.0)
    assert seeded.value(0.0) == 11.0  # idle: what was sustained
    calls(seeded, 0.0, 4.0, call_s=0.1, audio_s=1.0, duty=0.3)
    assert seeded.value(4.0) == pytest.approx(11.0)


def test_a_short_slow_patch_moves_it_little_and_a_lasting_one_fully() -> None:
    rate = CapacityEstimate(WINDOW_S)
    calls(rate, 0.0, 6.0, call_s=0.1, audio_s=1.0, duty=0.5)
    # another process takes the CPU for 2 s of the 8 s window: calls cost 4x
    calls(rate, 6.0, 8.0, call_s=0.4, audio_s=1.0, duty=0.5)
    assert rate.value(9.0) == pytest.approx(10.0)  # the median bin is still a fast one
    # it lasts: within half a window the slow cost is the reading
    calls(rate, 8.0, 14.0, call_s=0.4, audio_s=1.0, duty=0.5)
    assert rate.value(14.0) == pytest.approx(2.5)


def test_a_low_saturated_reading_does_not_hold_itself() -> None:
    """A slow patch while saturated reads low; admission then keeps the stage under
    saturation, so no saturated bin replaces it. After a window without one it is
    forgotten: the calibration bounds the per-call reading again."""
    rate = CapacityEstimate(WINDOW_S, workers=2)
    rate.set_baseline(11.0)
    calls(rate, 0.0, 8.0, call_s=0.2, audio_s=1.0, workers=2)  # saturated, slow: 10
    assert rate.value(8.5) == pytest.approx(10.0)
    # the stage runs at 70%, its calls at the usual 0.16 s: never saturated
    calls(rate, 8.5, 20.0, call_s=0.16, audio_s=1.0, duty=0.7, workers=2)
    assert rate.value(20.0) == pytest.approx(11.0)  # min(12.5 per call, 11 calibrated)


def test_a_saturated_reading_goes_stale() -> None:
    rate = CapacityEstimate(WINDOW_S)
    calls(rate, 0.0, 4.0, call_s=0.2, audio_s=1.0)  # saturated: 5 audio s per s
    assert rate.sustained(5.0) == pytest.approx(5.0)
    late_s = 5.0 + WINDOW_S * (STALE_WINDOWS + 1)
    assert rate.sustained(late_s) == 0.0  # forgotten: no baseline either
    calls(rate, late_s, late_s + 4.0, call_s=0.1, audio_s=1.0, duty=0.5)
    assert rate.value(late_s + 4.0) == pytest.approx(10.0)


def test_one_call_that_hung_is_one_slow_bin() -> None:
    """A call stuck for 5 s (a hung model call, a long pause) counts in the bin it ended
    in: the median passes over it, and the saturated reading keeps its other bins."""
    rate = CapacityEstimate(WINDOW_S)
    calls(rate, 0.0, 3.0, call_s=0.2, audio_s=1.0)  # saturated: 5 audio s per s
    rate.record(3.0, 8.0, 0.1)  # hung: 50 s per audio s
    calls(rate, 8.0, 12.0, call_s=0.2, audio_s=1.0)
    assert rate.value(12.0) == pytest.approx(5.0)


def test_the_pipeline_is_its_slower_stage() -> None:
    talker, vocoder = CapacityEstimate(WINDOW_S), CapacityEstimate(WINDOW_S, workers=2)
    assert pipeline_capacity(talker, vocoder, 0.0) == 0.0  # nothing measured
    calls(vocoder, 0.0, 8.0, call_s=0.1, audio_s=1.0, duty=0.2)  # 2 workers: 20
    assert pipeline_capacity(talker, vocoder, 8.0) == pytest.approx(20.0)  # talker unknown
    calls(talker, 0.0, 8.0, call_s=0.08, audio_s=1.0, duty=0.2)  # 12.5 audio s per s
    assert pipeline_capacity(talker, vocoder, 8.0) == pytest.approx(12.5)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="window_s"):
        CapacityEstimate(0.0)
    with pytest.raises(ValueError, match="workers"):
        CapacityEstimate(1.0, workers=0)
    with pytest.raises(ValueError, match="baseline"):
        CapacityEstimate(1.0).set_baseline(float("nan"))

"""issue #55's targets as `benchmarks.admission_runs` judges each point."""

from __future__ import annotations

from benchmarks.admission_runs import met, point_met


def _point(factor: float, playing: float, ttfa_p99_ms: float, stall_free: float = 1.0) -> dict:
    return {
        "factor": factor,
        "playing_per_capacity": playing,
        "ttfa_p99_ms": ttfa_p99_ms,
        "stall_free_share": stall_free,
    }


def test_over_capacity_needs_the_playing_share_and_a_first_audio_within_1_s() -> None:
    assert point_met(_point(1.5, 0.97, 506.0))
    assert not point_met(_point(2.0, 0.945, 629.0))  # 2026-12-05 17:04: short of 0.95 C
    assert not point_met(_point(1.5, 0.99, 1001.0))
    assert not point_met(_point(2.0, 0.99, 500.0, stall_free=0.99))


def test_under_capacity_needs_a_first_audio_within_300_ms_whatever_plays() -> None:
    assert point_met(_point(0.9, 0.87, 141.0))  # 0.9 C offered cannot play 0.95 C
    assert not point_met(_point(0.9, 0.89, 305.0))
    assert not point_met(_point(0.9, 0.89, 150.0, stall_free=0.98))


def test_a_run_meets_the_targets_only_if_every_point_does() -> None:
    good = {"points": [_point(0.9, 0.9, 150.0), _point(1.5, 0.97, 506.0)]}
    bad = {"points": [_point(2.0, 0.945, 629.0)]}
    assert met([good])
    assert not met([good, bad])

"""issue #55's targets as `benchmarks.admission_runs` judges each point."""

from __future__ import annotations

from benchmarks.admission_runs import met, point_met, run_order


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


def test_a_point_under_capacity_is_sized_by_both_probes() -> None:
    """One probe alone read C up to 7% off the two's mean: 0.9 C was offered as 0.96 C."""
    assert run_order([0.9, 1.5, 2.0]) == [
        ("probe", 0), ("probe", 1), ("point", 0.9), ("point", 1.5), ("point", 2.0)
    ]  # fmt: skip


def test_points_over_capacity_keep_a_probe_beside_each() -> None:
    assert run_order([1.5, 2.0]) == [("probe", 0), ("point", 1.5), ("probe", 1), ("point", 2.0)]
    assert run_order([1.5]) == [("probe", 0), ("point", 1.5), ("probe", 1)]
    assert run_order([0.9]) == [("probe", 0), ("probe", 1), ("point", 0.9)]

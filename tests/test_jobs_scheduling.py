"""Jobs as streams with a completion deadline (SPEC-scheduling section 5), in plain numbers:
the rate a job needs, its virtual player's horizon, EDF between jobs and live listeners
(under overload), the finish_by check, and what admission counts for a job."""

from __future__ import annotations

import math

import pytest

from scheduling import Admission, AdmissionConfig, LoadView, PlaybackScheduler, SchedulingConfig
from scheduling.admission import StreamLoad
from scheduling.jobs import (
    OVERDUE_RATE,
    JobDemand,
    check_finish_by,
    job_key,
    job_rate,
    promised_rate,
    segment_pace,
)

RATE_HZ = 1000  # record_audio takes samples: 1000 samples = 1 s
AHEAD_MAX_S = 10.0


def test_the_rate_a_job_needs() -> None:
    assert job_rate(600.0, finish_by_s=1300.0, now_s=100.0) == pytest.approx(0.5)
    assert job_rate(600.0, finish_by_s=None, now_s=100.0) == 0.0  # best effort
    assert job_rate(0.0, finish_by_s=200.0, now_s=100.0) == 0.0  # nothing left
    assert job_rate(10.0, finish_by_s=100.0, now_s=100.0) == math.inf  # overdue
    with pytest.raises(ValueError):
        job_rate(-1.0, 200.0, 100.0)


def test_a_segments_pace_from_the_rate_its_job_needs() -> None:
    assert segment_pace(0.0, 105.0, 100.0) == (0.0, math.inf)  # best effort: never due
    assert segment_pace(math.inf, 105.0, 100.0) == (OVERDUE_RATE, 100.0)  # overdue: due now
    assert segment_pace(0.5, 105.0, 100.0) == (0.5, 105.0)  # the player goes on
    assert segment_pace(0.5, 95.0, 100.0) == (0.5, 100.0)  # fell behind: from now
    assert segment_pace(0.5, math.inf, 100.0) == (0.5, 100.0)  # was best effort: from now


def test_a_job_horizon_advances_d_over_r() -> None:
    scheduler = PlaybackScheduler(SchedulingConfig(active_stream_window=1))
    scheduler.admit("job", 100.0, horizon_s=100.0, rate=0.25)
    scheduler.record_audio("job", 2 * RATE_HZ, RATE_HZ, 100.0)  # 2 s of audio at 0.25x
    assert scheduler.horizon_s("job") == pytest.approx(108.0)
    scheduler.record_audio("job", 1 * RATE_HZ, RATE_HZ, 101.0)  # before it runs dry: extends
    assert scheduler.horizon_s("job") == pytest.approx(112.0)
    scheduler.record_audio("job", 1 * RATE_HZ, RATE_HZ, 120.0)  # ran dry: restarts then
    assert scheduler.horizon_s("job") == pytest.approx(124.0)
    scheduler.check_invariants()


def test_a_best_effort_job_never_comes_due() -> None:
    scheduler = PlaybackScheduler(SchedulingConfig(active_stream_window=1))
    scheduler.admit("job", 100.0, horizon_s=math.inf, rate=0.0)
    scheduler.record_audio("job", 5 * RATE_HZ, RATE_HZ, 100.0)
    assert scheduler.horizon_s("job") == math.inf
    # a live listener far ahead (its player has 60 s) still goes first
    scheduler.admit("live", 100.0)
    scheduler.record_audio("live", 60 * RATE_HZ, RATE_HZ, 100.0)
    assert scheduler.select(101.0, ["job", "live"]) == ["live"]
    # alone, the job takes every turn (an idle server is all its)
    scheduler.forget("live")
    assert scheduler.select(101.0, ["job"]) == ["job"]
    scheduler.check_invariants()


def test_a_listened_job_takes_its_listener_horizon() -> None:
    scheduler = PlaybackScheduler(SchedulingConfig(active_stream_window=1))
    scheduler.admit("job", 100.0, horizon_s=math.inf, rate=0.0)
    scheduler.admit("live", 100.0)
    scheduler.record_audio("live", 3 * RATE_HZ, RATE_HZ, 100.0)  # dry at 103
    assert scheduler.select(100.5, ["job", "live"]) == ["live"]
    scheduler.pace("job", 101.0, 1.0, 100.5)  # someone listens: dry at 101
    assert scheduler.select(100.5, ["job", "live"]) == ["job"]
    scheduler.record_audio("job", 1 * RATE_HZ, RATE_HZ, 100.6)  # 1x now
    assert scheduler.horizon_s("job") == pytest.approx(102.0)
    scheduler.check_invariants()


def _run_overload(
    live: int, job_audio_s: float, finish_by_s: float | None, turns_s: float, chunk_s: float
) -> tuple[float | None, int]:
    """A virtual vocoder: every turn (`turns_s` long) emits `chunk_s` of audio for the one
    stream EDF picks among `live` listeners at 1x and one job. A listener with
    `AHEAD_MAX_S` buffered is not ready (the engine parks a stream its client has not
    read, engine.max_pending_audio_s). Returns when the job finished (None: not in 200 s)
    and how many live stalls there were."""
    scheduler = PlaybackScheduler(SchedulingConfig(active_stream_window=1, safety_margin_ms=0))
    now_s, made_s, stalls = 0.0, 0.0, 0
    rate = job_rate(job_audio_s, finish_by_s, now_s)
    scheduler.admit("job", now_s, horizon_s=now_s if rate else math.inf, rate=rate)
    ids = [f"live{i}" for i in range(live)]
    for stream_id in ids:
        scheduler.admit(stream_id, now_s)
    while now_s < 200.0:
        ready = [i for i in ids if (scheduler.slack_s(i, now_s) or 0.0) < AHEAD_MAX_S]
        if made_s < job_audio_s:
            ready.append("job")
        (chosen,) = scheduler.select(now_s, ready)
        now_s += turns_s
        if chosen != "job":
            horizon_s = scheduler.horizon_s(chosen)
            if horizon_s is not None and now_s > horizon_s + 1e-9:
                stalls += 1
        scheduler.record_audio(chosen, int(chunk_s * RATE_HZ), RATE_HZ, now_s)
        if chosen == "job":
            made_s += chunk_s
            if made_s >= job_audio_s:
                return now_s, stalls
    return None, stalls


def test_under_load_a_feasible_deadline_is_met_and_live_listeners_do_not_stall() -> None:
    # capacity C = 1 s of audio per 0.2 s turn = 5x; 4 live listeners take 4, 1 is left:
    # a 60 s job due by 100 s needs 0.6x, which fits
    finished_s, stalls = _run_overload(
        live=4, job_audio_s=60.0, finish_by_s=100.0, turns_s=0.2, chunk_s=1.0
    )
    assert finished_s is not None and finished_s <= 100.0
    assert stalls == 0
    # the same job best effort also gets the leftover, and never costs a listener a stall
    finished_s, stalls = _run_overload(
        live=4, job_audio_s=60.0, finish_by_s=None, turns_s=0.2, chunk_s=1.0
    )
    assert finished_s is not None and stalls == 0


@pytest.mark.parametrize("live", [1, 3, 4, 7])
def test_finish_by_across_loads_met_when_the_check_takes_it(live: int) -> None:
    """C = 5x (1 s of audio per 0.2 s turn), `live` listeners at 1x (0.2, 0.6, 0.8 and
    1.4 C). A 60 s job asks to finish with a quarter more time than the capacity left
    needs: where the finish_by check takes it, it finishes by then and no listener stalls;
    where nothing is left (1.4 C), the check refuses it at once."""
    job_audio_s, capacity = 60.0, 5.0
    spare = capacity - live
    finish_by_s = 1.25 * job_audio_s / spare if spare > 0 else 100.0
    check = check_finish_by(
        audio_s=job_audio_s,
        finish_by_s=finish_by_s,
        now_s=0.0,
        capacity_audio_s_per_s=capacity,
        live_streams=live,
        promised_audio_s_per_s=0.0,
    )
    if spare <= 0:
        assert not check.feasible and check.predicted_finish_s == math.inf
        return
    assert check.feasible
    finished_s, stalls = _run_overload(live, job_audio_s, finish_by_s, turns_s=0.2, chunk_s=1.0)
    print(
        f"\n{live / capacity:.1f} C: predicted finish {check.predicted_finish_s:.1f} s (all the "
        f"capacity left), due {finish_by_s:.1f} s, finished {finished_s} s, live stalls {stalls}"
    )
    assert finished_s is not None and finished_s <= finish_by_s
    assert stalls == 0


def test_overloaded_by_listeners_a_best_effort_job_waits() -> None:
    # 6 listeners on a 5x machine: no turn is left for a best-effort job
    finished_s, _ = _run_overload(
        live=6, job_audio_s=5.0, finish_by_s=None, turns_s=0.2, chunk_s=1.0
    )
    assert finished_s is None


def test_a_deadline_job_is_not_starved_by_overloading_listeners() -> None:
    # 6 listeners on a 5x machine stall anyway; a job due by 100 s still gets its rate
    # (within one turn), where a best-effort one gets nothing
    finished_s, _ = _run_overload(
        live=6, job_audio_s=20.0, finish_by_s=100.0, turns_s=0.2, chunk_s=1.0
    )
    assert finished_s is not None and finished_s <= 100.0 + 0.2 + 1e-6


def test_finish_by_check_refuses_what_the_capacity_left_cannot_meet() -> None:
    # capacity 10x, 6 live streams, 2x promised: 2x left for a 600 s job
    check = check_finish_by(
        audio_s=600.0,
        finish_by_s=1000.0,
        now_s=0.0,
        capacity_audio_s_per_s=10.0,
        live_streams=6,
        promised_audio_s_per_s=2.0,
    )
    assert check.feasible and check.predicted_finish_s == pytest.approx(300.0)
    late = check_finish_by(
        audio_s=600.0,
        finish_by_s=200.0,
        now_s=0.0,
        capacity_audio_s_per_s=10.0,
        live_streams=6,
        promised_audio_s_per_s=2.0,
    )
    assert not late.feasible and late.predicted_finish_s == pytest.approx(300.0)
    full = check_finish_by(
        audio_s=600.0,
        finish_by_s=10_000.0,
        now_s=0.0,
        capacity_audio_s_per_s=10.0,
        live_streams=10,
        promised_audio_s_per_s=0.0,
    )
    assert not full.feasible and full.predicted_finish_s == math.inf
    best_effort = check_finish_by(
        audio_s=600.0,
        finish_by_s=None,
        now_s=0.0,
        capacity_audio_s_per_s=10.0,
        live_streams=10,
        promised_audio_s_per_s=0.0,
    )
    assert best_effort.feasible  # waits its turn, never refused


def test_promised_rate_counts_deadline_jobs_only() -> None:
    jobs = [JobDemand(100.0, 200.0), JobDemand(100.0, None), JobDemand(50.0, 100.0)]
    assert promised_rate(jobs, now_s=0.0) == pytest.approx(0.5 + 0.5)


def test_admission_counts_a_job_its_rate() -> None:
    admission = Admission(AdmissionConfig(start_cost=0.0, capacity_headroom=1.0))
    live = [StreamLoad(10.0)] * 3
    job = StreamLoad(100.0, units=0.5)
    assert admission.load_units(LoadView(5.0, [*live, job])) == pytest.approx(3.5)
    # 3 live + a 0.5x job on 5x: one more live stream fits, two do not
    assert admission.fits(LoadView(5.0, [*live, job]))
    assert not admission.fits(LoadView(5.0, [*live, StreamLoad(10.0), job]))


def test_job_order_listened_then_deadline_then_oldest() -> None:
    keys = {
        "old best effort": job_key(None, None, 1.0),
        "new best effort": job_key(None, None, 2.0),
        "due late": job_key(None, 500.0, 3.0),
        "due soon": job_key(None, 100.0, 4.0),
        "listened": job_key(50.0, None, 5.0),
    }
    assert sorted(keys, key=keys.__getitem__) == [
        "listened",
        "due soon",
        "due late",
        "old best effort",
        "new best effort",
    ]

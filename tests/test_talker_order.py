"""scheduling.plan_talker_step: which streams' segments take the next talker step.

Numbers only (seconds): the same style as the vocoder's selection scenarios.
"""

from __future__ import annotations

import math
from dataclasses import replace
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduling import (
    ConfigError,
    TalkerCandidate,
    TalkerOrderConfig,
    TalkerQueue,
    plan_talker_step,
    talker,
    talker_key,
)

CONFIG = TalkerOrderConfig(batch=1, high_water_s=8.0, first_chunk_s=0.1, safety_margin_s=0.05)


def _c(
    stream_id: str,
    order: int,
    *,
    seen: float = 100.0,
    horizon: float | None = None,
    queued: float = 0.0,
) -> TalkerCandidate:
    return TalkerCandidate(stream_id, order, seen, horizon, queued)


def _plan(now_s: float, *candidates: TalkerCandidate, **config: object) -> tuple[str, ...]:
    cfg = TalkerOrderConfig(**{**CONFIG.__dict__, **config})
    return plan_talker_step(candidates, now_s, cfg).step_ids


def test_a_stream_with_enough_frames_waiting_sits_out_while_the_vocoder_is_busy() -> None:
    starved = _c("starved", 1, horizon=99.0, queued=2.5)  # runs out at 102.5: most urgent
    playing = _c("playing", 2, horizon=103.0, queued=0.5)  # runs out at 103.5
    assert _plan(100.0, starved, playing) == ("starved",)
    busy = TalkerOrderConfig(**{**CONFIG.__dict__, "busy_max_queued_s": 2.0}).paced()
    assert busy.max_queued_s == 2.0 and not busy.run_ahead
    plan = plan_talker_step([starved, playing], 100.0, busy)
    assert plan.step_ids == ("playing",)  # 2.5 s of frames already wait for the vocoder
    plan = plan_talker_step([starved], 100.0, busy)
    assert plan.step_ids == () and plan.retry_in_s is None  # the next chunk sent wakes it
    # a newcomer's frames count too: one with 3 s waiting and no audio yet sits out
    assert plan_talker_step([_c("new", 3, queued=3.0)], 100.0, busy).step_ids == ()
    assert plan_talker_step([_c("new", 3, queued=1.0)], 100.0, busy).step_ids == ("new",)


def test_a_newcomer_goes_before_a_stream_with_seconds_of_audio() -> None:
    new = _c("new", 3)  # first-audio deadline 100.1
    far = _c("far", 1, horizon=102.0)  # runs out at 102
    assert _plan(100.0, new, far) == ("new",)


def test_a_player_about_to_run_dry_is_never_passed_over() -> None:
    new = _c("new", 3)
    dry = _c("dry", 2, horizon=100.04)  # 40 ms left <= 50 ms margin: protected
    assert _plan(100.0, new, _c("far", 1, horizon=102.0), dry) == ("dry",)


def test_queued_frames_count_toward_the_run_out_time() -> None:
    # 0.5 s queued puts "dry" at 100.54: no longer protected, after the newcomer's 100.1
    assert _plan(100.0, _c("new", 3), _c("dry", 2, horizon=100.04, queued=0.5)) == ("new",)


def test_a_starved_stream_counts_from_now() -> None:
    # horizon 99 is past: it runs out at now + queued = 100.3, before "later" at 100.5
    starved = _c("starved", 2, horizon=99.0, queued=0.3)
    later = _c("later", 1, horizon=100.5)
    assert _plan(100.0, starved, later, safety_margin_s=0.0) == ("starved",)


def test_beyond_the_high_water_mark_a_stream_sits_out_and_says_when_it_is_due() -> None:
    paced = TalkerOrderConfig(**{**CONFIG.__dict__, "run_ahead": False})
    plan = plan_talker_step([_c("far", 1, horizon=105.0, queued=6.0)], 100.0, paced)
    assert plan.step_ids == ()
    assert plan.retry_in_s == pytest.approx(3.0)  # 11 s ahead, mark 8 s
    # a stream with frames but no audio yet sits out too; its first audio will wake the
    # talker, so it sets no timer
    plan = plan_talker_step([_c("queued", 1, queued=9.0)], 100.0, paced)
    assert (plan.step_ids, plan.retry_in_s) == ((), None)


def test_an_idle_talker_runs_ahead_most_urgent_first() -> None:
    far = _c("far", 1, horizon=105.0, queued=6.0)  # 11 s ahead, 6 s waiting for the vocoder
    farther = _c("farther", 2, horizon=112.0)  # 12 s ahead
    plan = plan_talker_step([farther, far], 100.0, CONFIG)
    assert plan.step_ids == ("far",)
    assert plan.retry_in_s == pytest.approx(3.0)  # the mark's timer is still reported
    assert _plan(100.0, farther, far, batch=4) == ("far", "farther")
    # more than the mark's worth of frames waiting for the vocoder: it waits for the vocoder
    assert _plan(100.0, _c("blocked", 1, horizon=101.0, queued=9.0)) == ()
    assert _plan(100.0, _c("queued", 1, queued=9.0)) == ()  # no audio yet: likewise


def test_a_stream_under_the_mark_always_goes_before_running_ahead() -> None:
    # under load the mark paces as before: the step goes to the stream under the mark
    # (even one far from running dry), never to one above it, even with room in the batch
    under = _c("under", 9, horizon=107.0)
    above = [_c(f"above-{i}", i, horizon=100.0 + 9.0 + i) for i in range(3)]
    assert _plan(100.0, *above, under, batch=8) == ("under",)
    assert _plan(100.0, *above, _c("new", 9), batch=8) == ("new",)


def test_a_batch_takes_the_most_urgent_in_deadline_order() -> None:
    candidates = [
        _c("x", 1, horizon=105.0),
        _c("y", 2, horizon=101.0),
        _c("z", 3, horizon=102.0),
        _c("w", 4, horizon=101.0),  # ties with y on the deadline: arrival order decides
    ]
    assert _plan(100.0, *candidates, batch=3) == ("y", "w", "z")
    assert _plan(100.0, *candidates, batch=10) == ("y", "w", "z", "x")


def test_first_audio_deadlines_rank_by_when_the_stream_arrived() -> None:
    early, late = _c("early", 2, seen=99.0), _c("late", 1, seen=99.5)
    assert _plan(100.0, late, early, batch=2) == ("early", "late")


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ConfigError, match="batch"):
        TalkerOrderConfig(batch=0)
    with pytest.raises(ConfigError, match="high_water_s"):
        TalkerOrderConfig(high_water_s=float("nan"))
    with pytest.raises(ConfigError, match="safety_margin_s"):
        TalkerOrderConfig(safety_margin_s=-1.0)
    with pytest.raises(ConfigError, match="max_queued_s"):
        TalkerOrderConfig(max_queued_s=1.0)  # runs ahead: nothing to hold back
    with pytest.raises(ConfigError, match="busy_max_queued_s"):
        TalkerOrderConfig(busy_max_queued_s=0.0)


_candidates = st.lists(
    st.builds(
        TalkerCandidate,
        stream_id=st.text(min_size=1, max_size=4),
        order=st.integers(0, 50),
        first_seen_s=st.floats(90, 110),
        horizon_s=st.none() | st.floats(90, 120),
        queued_audio_s=st.floats(0, 12),
    ),
    max_size=30,
    unique_by=lambda c: c.stream_id,
)


@given(_candidates, st.integers(1, 8))
def test_the_plan_is_the_batch_smallest_keys_of_the_streams_under_the_mark(
    candidates: list[TalkerCandidate], batch: int
) -> None:
    config = TalkerOrderConfig(batch=batch)
    plan = plan_talker_step(candidates, 100.0, config)
    keyed = sorted(
        (key, c.stream_id) for c in candidates if (key := talker_key(c, 100.0, config)) is not None
    )
    if keyed:  # someone under the mark: only they step
        assert plan.step_ids == tuple(stream_id for _, stream_id in keyed[:batch])
        for c in candidates:
            if c.stream_id in plan.step_ids:
                run_out = max(c.horizon_s if c.horizon_s is not None else 100.0, 100.0)
                assert run_out + c.queued_audio_s - 100.0 <= config.high_water_s + 0.001
    else:  # the talker would idle: the most urgent streams above it that may run ahead
        ahead = sorted(
            (max(c.horizon_s, 100.0) + c.queued_audio_s, c.order, c.stream_id)
            for c in candidates
            if c.horizon_s is not None and c.queued_audio_s <= config.high_water_s
        )
        assert plan.step_ids == tuple(stream_id for _, _, stream_id in ahead[:batch])
    paced = plan_talker_step(candidates, 100.0, TalkerOrderConfig(batch=batch, run_ahead=False))
    assert paced.step_ids == tuple(stream_id for _, stream_id in keyed[:batch])


@given(
    _candidates,
    st.integers(1, 8),
    st.floats(90, 115),
    st.floats(0.05, 10),
    st.floats(0, 0.5),
    st.sets(st.text(min_size=1, max_size=4), max_size=5),
    st.booleans(),
    st.none() | st.floats(0.05, 10),
)
def test_the_indexed_queue_plans_like_the_plain_ranking(
    candidates: list[TalkerCandidate],
    batch: int,
    now_s: float,
    high_water_s: float,
    margin_s: float,
    parked: set[str],
    run_ahead: bool,
    max_queued_s: float | None,
) -> None:
    config = TalkerOrderConfig(
        batch=batch,
        high_water_s=high_water_s,
        safety_margin_s=margin_s,
        run_ahead=run_ahead and max_queued_s is None,
        max_queued_s=max_queued_s,
    )
    queue = TalkerQueue(config.first_chunk_s)
    for candidate in candidates:  # add without audio, move twice, settle on the final value
        queue.update(TalkerCandidate(candidate.stream_id, candidate.order, 0.0, None, 0.0))
        queue.update(TalkerCandidate(candidate.stream_id, candidate.order, 0.0, None, 0.5))
        queue.update(TalkerCandidate(candidate.stream_id, candidate.order, 0.0, None, 0.25))
        queue.update(TalkerCandidate(candidate.stream_id, candidate.order, 0.0, 50.0, 1.0))
        queue.update(candidate)
    gone = "gone-stream"  # longer than any generated id (at most 4 characters): never one
    queue.update(TalkerCandidate(gone, 99, 95.0, None, 0.0))
    queue.remove(gone)
    eligible = [c for c in candidates if c.stream_id not in parked]
    expected = plan_talker_step(eligible, now_s, config)
    got = queue.plan(now_s, config, skip=parked.__contains__)
    assert got.step_ids == expected.step_ids
    if len(got.step_ids) < batch:
        assert got.retry_in_s == expected.retry_in_s
    assert len(queue) == len(candidates)


def test_the_urgent_plan_takes_streams_without_audio_in_plan_order() -> None:
    queue = TalkerQueue(first_chunk_s=0.1)
    for candidate in [
        _c("playing", 1, horizon=100.01),  # protected, but not within an urgent slack of 0
        _c("fresh-late", 4, seen=99.9),  # deadline 100.0
        _c("queued", 3, queued=0.05),  # no audio yet, runs out at 100.05
        _c("fresh-early", 2, seen=99.5),  # deadline 99.6
    ]:
        queue.update(candidate)
    config = TalkerOrderConfig(batch=3)
    assert queue.plan_urgent(100.0, config, 0.0) == ("fresh-early", "fresh-late", "queued")
    assert queue.plan_urgent(100.0, config, 0.0, skip={"fresh-early"}.__contains__) == (
        "fresh-late",
        "queued",
    )
    assert queue.plan(100.0, TalkerOrderConfig(batch=1)).step_ids == ("playing",)


def test_the_urgent_plan_takes_players_within_the_urgent_slack_protected_first() -> None:
    queue = TalkerQueue(first_chunk_s=0.1)
    for candidate in [
        _c("ahead", 1, horizon=100.5, queued=0.6),  # runs out at 101.1: not urgent
        _c("soon", 2, horizon=100.3, queued=0.4),  # runs out at 100.7
        _c("dry", 3, horizon=99.0, queued=0.02),  # runs out at 100.02: protected
        _c("fresh", 4, seen=99.8),  # first-audio deadline 99.9
        _c("first-frames", 5, queued=0.5),  # no audio yet, runs out at 100.5
    ]:
        queue.update(candidate)
    config = TalkerOrderConfig(batch=5)
    assert queue.plan_urgent(100.0, config, 1.0) == ("dry", "fresh", "first-frames", "soon")
    assert queue.plan_urgent(100.0, config, 1.2)[-1] == "ahead"
    assert queue.plan_urgent(100.0, replace(config, batch=1), 1.0, skip={"dry"}.__contains__) == (
        "fresh",
    )
    # a slack without bound still stops at the high-water mark
    far = TalkerOrderConfig(batch=9, high_water_s=1.0)
    assert "ahead" not in queue.plan_urgent(100.0, far, math.inf)


_playing = st.lists(  # streams playing close together: their order is what matters
    st.builds(
        TalkerCandidate,
        stream_id=st.text(min_size=1, max_size=4),
        order=st.integers(0, 50),
        first_seen_s=st.floats(90, 100),
        horizon_s=st.floats(101, 102),
        queued_audio_s=st.just(0.0) | st.floats(0, 1),
    ),
    min_size=3,
    max_size=30,
    unique_by=lambda c: c.stream_id,
)


@given(
    _playing,
    st.lists(st.floats(-0.25, 0.25), min_size=30, max_size=30),
    st.integers(1, 8),
    st.floats(99, 100),
    st.booleans(),
)
def test_a_run_out_filed_within_the_tolerance_plans_like_the_exact_one(
    candidates: list[TalkerCandidate],
    drifts: list[float],
    batch: int,
    now_s: float,
    run_ahead: bool,
) -> None:
    """Sent chunks move a stream's horizon up and its queued audio down by the same
    amount, so `horizon + queued` is not re-filed unless it moved by more than the
    filing tolerance (widened here to 0.25 s so that the walk's allowance for it
    matters): the plan stays exactly the plain ranking's."""
    config = TalkerOrderConfig(batch=batch, high_water_s=4.0, run_ahead=run_ahead)
    with mock.patch.object(talker, "RUN_OUT_FILING_TOLERANCE_S", 0.25):
        queue = TalkerQueue(config.first_chunk_s)
        for candidate, drift in zip(candidates, drifts, strict=False):
            assert candidate.horizon_s is not None
            # filed first with the sum off by `drift` (as if chunks had been sent since)
            queue.update(candidate._replace(horizon_s=candidate.horizon_s + drift))
            queue.update(candidate)
        expected = plan_talker_step(candidates, now_s, config)
        assert queue.plan(now_s, config).step_ids == expected.step_ids
        for candidate in candidates:  # the filed keys come out again
            queue.remove(candidate.stream_id)
        assert len(queue) == 0 and queue.plan(now_s, config).step_ids == ()

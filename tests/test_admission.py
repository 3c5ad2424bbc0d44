"""Admission (docs/scheduling.md section 4): accept, or 429 with a Retry-After."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling import Admission, AdmissionConfig, Decision


def admission(**kwargs) -> Admission:
    return Admission(AdmissionConfig(**kwargs))


def test_accepts_below_every_limit():
    decision = admission(max_streams=4).decide(100.0, 2, 10.0)
    assert decision == Decision(accept=True, retry_after_s=None, reason="ok")


def test_max_streams_caps_active_streams():
    a = admission(max_streams=3)
    assert a.decide(100.0, 2, 0.0).accept
    decision = a.decide(100.0, 3, 0.0, finish_times_s=[104.5])
    assert decision == Decision(accept=False, retry_after_s=5, reason="max_streams")
    assert a.decide(100.0, 7, 0.0).reason == "max_streams"


def test_zero_max_streams_means_no_cap():
    assert admission(max_streams=0).decide(100.0, 10_000, 0.0).accept


def test_capacity_with_headroom_counts_the_new_stream():
    a = admission(capacity_headroom=0.9)
    assert a.decide(100.0, 8, 10.0).accept  # 9 would play: 9 <= 10 * 0.9
    rejected = a.decide(100.0, 9, 10.0)  # 10 would play > 9
    assert (rejected.accept, rejected.reason) == (False, "capacity")
    full = admission(capacity_headroom=1.0)
    assert full.decide(100.0, 9, 10.0).accept
    assert not full.decide(100.0, 10, 10.0).accept
    assert not admission(capacity_headroom=0.5).decide(100.0, 0, 1.5).accept  # 1 > 0.75


@pytest.mark.parametrize("capacity", [0.0, -1.0, math.nan])
def test_unmeasured_capacity_accepts(capacity):
    assert admission().decide(100.0, 500, capacity) == Decision(True, None, "ok")
    assert admission(max_streams=2).decide(100.0, 2, capacity).reason == "max_streams"


def test_max_streams_is_reported_before_capacity():
    assert admission(max_streams=1).decide(100.0, 5, 1.0).reason == "max_streams"


def test_disabled_accepts_everything():
    a = admission(enabled=False, max_streams=1)
    assert a.decide(100.0, 50, 1.0) == Decision(True, None, "disabled")


def test_retry_after_counts_to_the_nearest_finish():
    a = admission(max_streams=1)
    assert a.decide(100.0, 1, 0.0, [107.0, 103.2, 110.0]).retry_after_s == 4
    assert a.decide(100.0, 1, 0.0, [102.0]).retry_after_s == 2
    assert a.decide(100.0, 1, 0.0, [100.3]).retry_after_s == 1
    assert a.decide(100.0, 1, 0.0, [95.0]).retry_after_s == 1  # overdue estimate: soon
    assert a.decide(100.0, 1, 0.0, iter([101.5])).retry_after_s == 2  # any iterable


def test_retry_after_without_estimates_uses_the_fallback():
    assert admission(max_streams=1).decide(100.0, 1, 0.0).retry_after_s == 1
    a = admission(max_streams=1, fallback_retry_after_s=3)
    assert a.decide(100.0, 1, 0.0, []).retry_after_s == 3
    assert a.decide(100.0, 1, 0.0, [math.inf, math.nan]).retry_after_s == 3  # ignored


def test_bad_inputs_are_refused():
    a = admission()
    with pytest.raises(ValueError, match="active_streams"):
        a.decide(100.0, -1, 1.0)
    with pytest.raises(ValueError, match="now_s"):
        a.decide(math.nan, 1, 1.0)


@settings(max_examples=200, deadline=None)
@given(
    max_streams=st.integers(0, 20),
    headroom=st.floats(0.05, 1.0),
    enabled=st.booleans(),
    now_s=st.floats(0, 1e6),
    active=st.integers(0, 40),
    capacity=st.one_of(st.just(0.0), st.floats(-5, 50)),
    finish_offsets_s=st.lists(st.floats(-100, 1000), max_size=5),
)
def test_decision_rules(max_streams, headroom, enabled, now_s, active, capacity, finish_offsets_s):
    a = admission(max_streams=max_streams, capacity_headroom=headroom, enabled=enabled)
    finish_times_s = [now_s + offset for offset in finish_offsets_s]
    decision = a.decide(now_s, active, capacity, finish_times_s)
    capped = max_streams > 0 and active >= max_streams
    over = capacity > 0 and active + 1 > capacity * headroom
    assert decision.accept == (not enabled or not (capped or over))
    if decision.accept:
        assert decision.retry_after_s is None
        assert decision.reason == ("disabled" if not enabled else "ok")
    else:
        assert decision.reason == ("max_streams" if capped else "capacity")
        assert isinstance(decision.retry_after_s, int) and decision.retry_after_s >= 1
        if finish_times_s:
            nearest_s = min(finish_times_s)
            assert decision.retry_after_s == max(1, math.ceil(nearest_s - now_s))
            # the client retries no earlier than the nearest finish (to the second)
            assert now_s + decision.retry_after_s >= nearest_s


# --- the start phase: how many streams may be starting at once ---------------------------


def test_starting_streams_are_limited_with_a_short_retry_after():
    a = admission(max_starting_streams=2, start_retry_after_s=1)
    assert a.start_slot_free(1)
    # 2 streams in their start phase: a third waits, although capacity has room
    assert a.decide(100.0, 5, 10.0, [130.0]).accept
    assert not a.start_slot_free(2)
    assert a.starting() == Decision(accept=False, retry_after_s=1, reason="starting")
    # the Retry-After is the start's, not the nearest finish (30 s away)
    assert admission(max_starting_streams=2, start_retry_after_s=3).starting().retry_after_s == 3


def test_a_full_server_is_refused_for_its_capacity_not_its_starts():
    a = admission(max_streams=3, max_starting_streams=2)
    assert a.decide(100.0, 3, 10.0, [104.5]).reason == "max_streams"
    uncapped = admission(max_starting_streams=2)
    assert uncapped.decide(100.0, 10, 10.0).reason == "capacity"


def test_zero_max_starting_streams_means_no_start_limit():
    assert admission(max_starting_streams=0).start_slot_free(99)
    assert admission(max_starting_streams=2, enabled=False).start_slot_free(99)


def test_negative_starting_streams_are_refused():
    with pytest.raises(ValueError, match="starting_streams"):
        admission().start_slot_free(-1)


@pytest.mark.parametrize(
    "field, value",
    [("max_starting_streams", -1), ("start_phase_chunks", 0), ("start_retry_after_s", 0)],
)
def test_start_phase_knobs_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        AdmissionConfig(**{field: value})

"""Admission's pure policy (scheduling/admission.py, docs/admission.md): the load is the
work still owed, one fair queue, Retry-After from the same prediction."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling import Admission, AdmissionConfig, ConfigError, Decision, LoadView, StreamLoad


def admission(**kwargs: object) -> Admission:
    kwargs.setdefault("start_cost", 0.0)
    kwargs.setdefault("capacity_headroom", 1.0)  # whole-number arithmetic; the margin: below
    kwargs.setdefault("first_audio_bound_s", 0.0)  # the queue alone; the bound: at the end
    return Admission(AdmissionConfig(**kwargs))  # type: ignore[arg-type]


def steady(*owed_s: float) -> list[StreamLoad]:
    return [StreamLoad(owed) for owed in owed_s]


def test_accepts_while_the_owed_work_fits_the_capacity() -> None:
    a = admission()
    assert a.offer(0.0, "r", LoadView(10.0, steady(*[5.0] * 9))) == Decision(True, None, "ok")
    assert not a.offer(0.0, "s", LoadView(10.0, steady(*[5.0] * 10)), wait=False).accept


def test_a_stream_that_owes_nothing_is_not_counted() -> None:
    """The book drops a stream once its audio is all produced and sent: admission sees
    only the streams with work left, however long their players still play."""
    a = admission(max_streams=1)
    assert a.offer(0.0, "r", LoadView(5.0, [])).accept
    assert not a.offer(0.0, "s", LoadView(5.0, steady(3.0)), wait=False).accept


def test_a_starting_stream_and_a_granted_ticket_cost_the_start() -> None:
    a = admission(start_cost=0.5)
    view = LoadView(4.0, [StreamLoad(10.0, 1.0), StreamLoad(10.0)], granted=1)
    assert a.load_units(view) == pytest.approx(1.5 + 1.0 + 1.5)
    assert not a.fits(view)  # 4 + 1.5 > 4
    assert a.fits(LoadView(4.0, [StreamLoad(10.0), StreamLoad(10.0)]))  # 2 + 1.5 <= 4


def test_an_idle_engine_takes_one_request_whatever_the_capacity_reads() -> None:
    """A capacity read low (the cores shared with another process) below one starting
    stream's 1 + start_cost: the idle engine still serves one, queues the next behind it,
    and the router's free slots say the same (the CI fault: a lone request got 429)."""
    a = admission(start_cost=3.0, queue_max_wait_s=2.0)
    idle = LoadView(3.7, [])
    assert a.offer(0.0, "r", idle) == Decision(True, None, "ok")
    assert a.free_slots(idle) == 1
    one_starting = LoadView(3.7, [StreamLoad(6.0, 0.5)], new_stream_audio_s=6.0)
    assert a.free_slots(one_starting) == 0
    decision = a.offer(0.0, "s", one_starting, wait=False)
    assert (decision.accept, decision.reason) == (False, "capacity")
    assert decision.retry_after_s == 2  # its 6 s at 3.7 audio s per s: then idle
    assert a.predict_wait_s(one_starting) == pytest.approx(6.0 / 3.7)
    assert a.grant(one_starting) == [] and a.grant(LoadView(3.7, [])) == []  # none queued
    assert a.offer(0.0, "t", one_starting).queued
    assert a.grant(LoadView(3.7, [])) == ["t"]


def test_headroom_scales_the_capacity() -> None:
    assert admission(capacity_headroom=0.5).fits(LoadView(10.0, steady(*[1.0] * 4)))
    assert not admission(capacity_headroom=0.5).fits(LoadView(10.0, steady(*[1.0] * 5)))


@pytest.mark.parametrize("capacity", [0.0, -1.0, math.nan])
def test_an_unmeasured_capacity_admits_up_to_max_streams(capacity: float) -> None:
    assert admission().fits(LoadView(capacity, steady(*[1.0] * 500)))
    assert not admission(max_streams=2).fits(LoadView(capacity, steady(1.0, 1.0)))


def test_disabled_accepts_everything() -> None:
    a = admission(enabled=False, max_streams=1)
    assert a.offer(0.0, "r", LoadView(1.0, steady(*[9.0] * 50))) == Decision(True, None, "disabled")


def test_processor_sharing_predicts_the_first_end() -> None:
    """Capacity 2 shared by 2 streams: 1 audio s per s each; the one owing 3 s ends at 3."""
    a = admission()
    assert a.predict_wait_s(LoadView(2.0, steady(3.0, 8.0))) == pytest.approx(3.0)
    # behind one waiter: it starts at 3 s owing the mean (5.5 s) beside the other's 5 s
    # left, each at 1 per s: the other ends at 8 s
    assert a.predict_wait_s(LoadView(2.0, steady(3.0, 8.0)), ahead=1) == pytest.approx(8.0)
    # a live text stream (owed inf) never ends by itself
    assert a.predict_wait_s(LoadView(1.0, steady(math.inf))) == math.inf


def test_the_start_phase_ends_before_the_stream() -> None:
    """A starting stream frees its start cost once its start audio is produced."""
    a = admission(start_cost=1.0)
    view = LoadView(3.0, [StreamLoad(10.0, 0.5)])  # 2 units + 2 for a new one > 3
    assert a.predict_wait_s(view) == pytest.approx(0.5 / 3.0)


def test_beyond_capacity_a_request_queues_when_a_slot_is_near() -> None:
    a = admission(queue_max_wait_s=2.0)
    decision = a.offer(10.0, "r", LoadView(2.0, steady(1.0, 8.0)))
    assert decision.queued and decision.wait_s == pytest.approx(1.0)
    assert "r" in a and a.waiting == 1 and a.next_deadline_s() == pytest.approx(12.0)


def test_beyond_the_bound_it_is_refused_at_once_with_the_predicted_retry_after() -> None:
    a = admission(queue_max_wait_s=2.0)
    decision = a.offer(10.0, "r", LoadView(2.0, steady(4.2, 8.0)))
    assert decision == Decision(False, 5, "capacity")  # ceil(4.2)
    assert a.waiting == 0
    # with no end in sight: one queue bound
    assert a.offer(0.0, "s", LoadView(1.0, steady(math.inf))).retry_after_s == 2
    assert a.offer(0.0, "t", LoadView(0.0, steady(1.0)), wait=False).accept


def test_no_queue_with_a_zero_bound() -> None:
    a = admission(queue_max_wait_s=0.0)
    assert a.offer(0.0, "r", LoadView(1.0, steady(0.3))) == Decision(False, 1, "capacity")


def test_max_streams_refusal_names_it() -> None:
    a = admission(max_streams=1, queue_max_wait_s=0.0)
    assert a.offer(0.0, "r", LoadView(50.0, steady(9.0))).reason == "max_streams"


def test_waiters_are_granted_first_come_first_served() -> None:
    a = admission(queue_max_wait_s=10.0)
    full = LoadView(4.0, steady(1.0, 2.0, 3.0, 4.0))
    for ticket in "abc":
        assert a.offer(0.0, ticket, full).queued
    # a new arrival never passes the waiters, even where it would fit on its own
    assert a.offer(0.0, "d", LoadView(4.0, steady(1.0)), wait=False).reason == "capacity"
    assert a.grant(full) == []
    assert a.grant(LoadView(4.0, steady(2.0, 3.0, 4.0))) == ["a"]
    assert a.grant(LoadView(4.0, steady(4.0))) == ["b", "c"]
    assert a.waiting == 0


def test_a_waiter_past_its_bound_is_refused_and_one_that_leaves_is_gone() -> None:
    a = admission(queue_max_wait_s=1.0)
    full = LoadView(2.0, steady(0.5, 0.8))
    assert a.offer(0.0, "a", full).queued
    assert a.offer(0.4, "b", full).queued
    assert a.leave("b") and not a.leave("b")
    assert a.expire(0.9, full) == []
    [(ticket, decision)] = a.expire(1.0, full)
    assert ticket == "a" and decision == Decision(False, 1, "queue_timeout")
    assert a.waiting == 0 and a.next_deadline_s() is None


def test_free_slots_counts_whole_new_streams_less_the_waiters() -> None:
    a = admission(start_cost=0.5, max_streams=10)
    assert a.free_slots(LoadView(8.0, steady(1.0, 1.0))) == 4  # (8 - 2) / 1.5
    assert a.free_slots(LoadView(8.0, steady(*[1.0] * 9))) == 0
    assert a.free_slots(LoadView(100.0, steady(*[1.0] * 8))) == 2  # max_streams
    assert admission().free_slots(LoadView(0.0, [])) == math.inf
    assert admission(enabled=False).free_slots(LoadView(1.0, steady(1.0))) == math.inf


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.floats(0.5, 40.0),
    owed=st.lists(st.floats(0.1, 30.0), max_size=30),
    starting=st.integers(0, 30),
    granted=st.integers(0, 5),
    max_streams=st.integers(0, 40),
)
def test_free_slots_agree_with_offer(
    capacity: float, owed: list[float], starting: int, granted: int, max_streams: int
) -> None:
    """free_slots >= 1 exactly when a request would be accepted at once (the cluster
    router's figure and the replica's decision never disagree)."""
    a = admission(start_cost=0.5, max_streams=max_streams, queue_max_wait_s=0.0)
    loads = [StreamLoad(o, 1.0 if i < starting else 0.0) for i, o in enumerate(owed)]
    view = LoadView(capacity, loads, granted)
    assert (a.free_slots(view) >= 1) == a.offer(0.0, "r", view).accept


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.floats(0.5, 20.0),
    owed=st.lists(st.floats(0.1, 30.0), min_size=1, max_size=20),
)
def test_the_prediction_is_when_a_slot_first_fits(capacity: float, owed: list[float]) -> None:
    """At the predicted wait the request fits; just before it, no."""
    a = admission()
    ahead = 0
    view = LoadView(capacity, steady(*owed))
    wait_s = a.predict_wait_s(view, ahead)
    assert math.isfinite(wait_s)  # an idle engine takes one, so a slot always comes
    assert a.fits(_drained(view, wait_s * 1.001), ahead)
    if wait_s > 0:
        before = _drained(view, wait_s * 0.999)
        assert not a.fits(before, ahead)


def _drained(view: LoadView, t_s: float) -> LoadView:
    """The streams after `t_s` of processor sharing (the plain way, in small steps)."""
    owed = [s.owed_audio_s for s in view.streams]
    step_s = t_s / 2000
    for _ in range(2000):
        live = [o for o in owed if o > 0]
        if not live:
            break
        share = view.capacity_audio_s_per_s / len(live) * step_s
        owed = [o - share if o > 0 else o for o in owed]
    return LoadView(view.capacity_audio_s_per_s, steady(*[o for o in owed if o > 1e-6]))


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"max_streams": -1}, "max_streams"),
        ({"capacity_headroom": 0.0}, "capacity_headroom"),
        ({"capacity_headroom": 1.5}, "capacity_headroom"),
        ({"start_cost": -0.1}, "start_cost"),
        ({"start_phase_chunks": 0}, "start_phase_chunks"),
        ({"queue_max_wait_s": -1.0}, "queue_max_wait_s"),
        ({"enabled": "yes"}, "enabled"),
    ],
)
def test_bad_config_is_refused(fields: dict[str, object], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        AdmissionConfig(**fields)  # type: ignore[arg-type]


def test_a_nan_time_is_refused() -> None:
    with pytest.raises(ValueError, match="now_s"):
        admission().offer(math.nan, "r", LoadView(1.0, []))


def test_a_wait_that_would_push_first_audio_past_the_bound_is_refused_at_once() -> None:
    """With a first-audio bound of 1 s and starts measured at 0.4 s, a request may wait at
    most 0.6 s: one predicted to wait 0.8 s (a slot frees when the stream owing 0.8 s
    ends, each of five streams produced at 1 audio s per s) gets its 429
    now, with the Retry-After of that prediction; the same request without the bound
    would have been queued for 0.8 s and heard its first audio 1.2 s after it asked."""
    full = steady(0.8, 10.0, 10.0, 10.0, 10.0)
    view = LoadView(5.0, full, new_stream_audio_s=4.0, first_audio_s=0.4)
    unbounded = admission(queue_max_wait_s=1.0)
    assert unbounded.offer(0.0, "r", view).queued
    bounded = admission(queue_max_wait_s=1.0, first_audio_bound_s=1.0)
    assert bounded.max_wait_s(view) == pytest.approx(0.6)
    decision = bounded.offer(0.0, "r", view)
    assert (decision.accept, decision.reason, decision.retry_after_s) == (False, "capacity", 1)
    assert bounded.waiting == 0
    # a start measured at 0.1 s leaves 0.9 s: the same wait of 0.8 s is queued
    quick = LoadView(5.0, full, new_stream_audio_s=4.0, first_audio_s=0.1)
    assert bounded.offer(0.0, "r", quick).queued


def test_a_waiter_under_the_bound_is_refused_when_the_bound_less_its_start_has_passed() -> None:
    a = admission(queue_max_wait_s=1.0, first_audio_bound_s=1.0)
    view = LoadView(5.0, steady(0.4, 9.0, 9.0, 9.0, 9.0), new_stream_audio_s=2.0, first_audio_s=0.3)
    assert a.offer(10.0, "r", view).queued  # predicted 0.4 s <= 0.7 s
    assert a.next_deadline_s() == pytest.approx(10.7)
    assert a.expire(10.69, view) == []
    [(ticket, decision)] = a.expire(10.7, view)
    assert (ticket, decision.reason) == ("r", "queue_timeout")


def test_a_start_slower_than_the_bound_leaves_no_wait_but_still_serves_what_fits() -> None:
    a = admission(queue_max_wait_s=1.0, first_audio_bound_s=1.0)
    slow = LoadView(5.0, steady(*[0.1] * 5), new_stream_audio_s=1.0, first_audio_s=1.2)
    assert a.max_wait_s(slow) < 0
    assert a.offer(0.0, "r", slow).reason == "capacity"  # would wait 0.1 s: none allowed
    assert a.offer(0.0, "s", LoadView(5.0, steady(1.0), first_audio_s=1.2)).accept
    with pytest.raises(ConfigError, match="first_audio_bound_s"):
        AdmissionConfig(first_audio_bound_s=-1.0)

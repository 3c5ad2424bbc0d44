"""PlaybackScheduler: the horizon (docs/scheduling.md section 1) and selection (section 2)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.settings import DEFAULT_CHUNKING, DEFAULT_SCHEDULING
from scheduling import PlaybackScheduler, SchedulingConfig
from scheduling.policies import EdfPolicy


def edf(window: int, first_chunk_ms: float = 100.0, safety_margin_ms: float = 50.0):
    return PlaybackScheduler(
        SchedulingConfig(
            policy="edf",
            active_stream_window=window,
            first_chunk_ms=first_chunk_ms,
            safety_margin_ms=safety_margin_ms,
        )
    )


def fifo(window: int) -> PlaybackScheduler:
    return PlaybackScheduler(SchedulingConfig(policy="fifo", active_stream_window=window))


def emit(scheduler: PlaybackScheduler, stream_id: str, seconds: float, at_s: float) -> None:
    """Record `seconds` of audio emitted at `at_s` (rate 1000 Hz: frames / rate is exact)."""
    scheduler.record_audio(stream_id, round(seconds * 1000), 1000, at_s)


# --- the seven scenarios of section 2 ---------------------------------------------------


def test_scenario_1_less_buffered_stream_goes_first():
    s = edf(1)
    emit(s, "A", 5, 100)
    emit(s, "B", 2, 100)
    assert s.select(100, ["A", "B"]) == ["B"]


def test_scenario_2_first_chunk_deadline_then_overdue_player():
    s = edf(1, first_chunk_ms=100, safety_margin_ms=0)
    emit(s, "A", 5, 100)
    assert s.select(100, ["N", "A"]) == ["N"]  # N seen at 100: deadline 100.1 < 105
    assert s.first_seen_s("N") == 100
    emit(s, "S", 1, 98)  # horizon 99: overdue at 100
    assert s.horizon_s("S") == 99
    assert s.select(100, ["N2", "S"]) == ["S"]


def test_scenario_3_protected_player_beats_long_overdue_first_chunk():
    s = edf(1, first_chunk_ms=100, safety_margin_ms=250)
    assert s.select(90, ["U"]) == ["U"]  # U seen at 90, gets no audio: deadline 90.1
    emit(s, "P", 0.1, 100)  # slack 0.1 <= 0.25: protected
    assert s.select(100, ["U", "P"]) == ["P"]


def test_scenario_4_reranked_at_every_call():
    s = edf(1, safety_margin_ms=0)
    emit(s, "A", 1, 100)
    emit(s, "B", 2, 100)
    assert s.select(100, ["A", "B"]) == ["A"]
    emit(s, "A", 5, 100)
    assert s.horizon_s("A") == 106
    assert s.select(100, ["A", "B"]) == ["B"]


def test_scenario_5_window_of_two_takes_the_two_earliest():
    s = edf(2)
    emit(s, "X", 5, 100)
    emit(s, "Y", 1, 100)
    emit(s, "Z", 2, 100)
    assert s.select(100, ["X", "Y", "Z"]) == ["Y", "Z"]


def test_scenario_6_forget_then_record_starts_fresh():
    s = edf(1)
    emit(s, "A", 5, 100)
    s.forget("A")
    assert "A" not in s
    assert s.horizon_s("A") is None
    assert s.emitted_audio_s("A") == 0.0
    assert s.first_seen_s("A") is None
    emit(s, "A", 1, 200)
    assert s.first_seen_s("A") == 200
    assert s.horizon_s("A") == 201
    assert s.emitted_audio_s("A") == 1
    s.check_invariants()


def test_scenario_7_fifo_slot_is_sticky_until_forgotten():
    s = fifo(1)
    for now_s in (100, 101, 102):
        assert s.select(now_s, ["A", "B"]) == ["A"]
    emit(s, "B", 0.01, 102)  # B about to run dry changes nothing under fifo
    assert s.select(103, ["A", "B"]) == ["A"]
    s.forget("A")
    assert s.select(104, ["B"]) == ["B"]
    assert s.select(105, ["C", "B"]) == ["B"]  # now B holds the slot


# --- horizon -----------------------------------------------------------------------------


def test_record_audio_ignores_empty_chunks_and_bad_rates():
    s = edf(1)
    s.record_audio("A", 0, 22050, 100)
    s.record_audio("A", -5, 22050, 100)
    s.record_audio("A", 100, 0, 100)
    s.record_audio("A", 100, -1, 100)
    assert "A" not in s
    assert s.horizon_s("A") is None


def test_first_audio_admits_at_emission_time():
    s = edf(1)
    s.record_audio("A", 22050, 22050, 50.0)
    assert s.first_seen_s("A") == 50.0
    assert s.horizon_s("A") == 51.0
    assert s.emitted_audio_s("A") == 1.0


def test_early_chunk_extends_late_chunk_restarts():
    s = edf(1)
    emit(s, "A", 2, 100)  # horizon 102
    emit(s, "A", 1, 101)  # early: 102 + 1
    assert s.horizon_s("A") == 103
    emit(s, "A", 1, 110)  # late (player dry since 103): restarts at 110
    assert s.horizon_s("A") == 111
    assert s.emitted_audio_s("A") == 4


def test_ack_replaces_the_estimate():
    s = edf(1)
    emit(s, "A", 10, 100)  # estimate: 110
    s.ack_playback("A", played_s=3.0, at_s=105.0)  # the client stalled: 7 s left at 105
    assert s.horizon_s("A") == 112.0
    emit(s, "A", 1, 106)  # later chunks extend the corrected horizon
    assert s.horizon_s("A") == 113.0


def test_ack_for_unknown_stream_admits_it_at_ack_time():
    s = edf(1)
    s.ack_playback("A", played_s=0.5, at_s=100.0)
    assert s.first_seen_s("A") == 100.0
    assert s.emitted_audio_s("A") == 0.0
    assert s.horizon_s("A") == 99.5
    s.check_invariants()


def test_ack_rejects_negative_or_nan_played():
    s = edf(1)
    with pytest.raises(ValueError, match="played_s"):
        s.ack_playback("A", played_s=-1.0, at_s=100.0)
    with pytest.raises(ValueError, match="played_s"):
        s.ack_playback("A", played_s=math.nan, at_s=100.0)
    assert "A" not in s


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_times_must_be_finite(bad):
    s = edf(1)
    with pytest.raises(ValueError, match="now_s"):
        s.select(bad, ["A"])
    with pytest.raises(ValueError, match="emitted_at_s"):
        s.record_audio("A", 10, 10, bad)
    with pytest.raises(ValueError, match="at_s"):
        s.ack_playback("A", 0.0, bad)
    with pytest.raises(ValueError, match="at_s"):
        s.admit("A", bad)
    assert len(s) == 0


def test_forget_is_idempotent_and_accepts_unknown_ids():
    s = fifo(2)
    s.forget("nobody")
    assert s.select(100, ["A"]) == ["A"]
    s.forget("A")
    s.forget("A")
    assert len(s) == 0
    s.check_invariants()


def test_admit_keeps_the_first_time_and_sets_the_first_deadline():
    s = edf(1, first_chunk_ms=100, safety_margin_ms=0)
    s.admit("N", 99.0)
    s.admit("N", 100.0)  # already known: no change
    assert s.first_seen_s("N") == 99.0
    emit(s, "A", 1.05, 98.0)  # horizon 99.05 < 99.1, but not protected at 98.9 (margin 0)
    assert s.select(98.9, ["A", "N"]) == ["A"]
    s.admit("M", 98.0)  # deadline 98.1 beats A's 99.05
    assert s.select(98.9, ["A", "N", "M"]) == ["M"]


def test_unknown_helpers_answer_defaults():
    s = edf(1)
    assert s.horizon_s("x") is None
    assert s.emitted_audio_s("x") == 0.0
    assert s.slack_s("x", 1.0) is None
    assert s.state("x") is None
    emit(s, "A", 1, 100)
    assert s.slack_s("A", 100.25) == 0.75


def test_policy_name():
    assert edf(2).policy_name == "edf"
    assert fifo(0).policy_name == "fifo"


# --- selection ---------------------------------------------------------------------------


def test_select_admits_unseen_at_now_and_changes_nothing_else():
    s = edf(2)
    emit(s, "A", 1, 100)
    before = s.state("A")
    first = s.select(100.5, ["A", "B", "C"])
    assert s.first_seen_s("B") == 100.5 and s.first_seen_s("C") == 100.5
    assert s.state("A") == before
    for _ in range(3):
        assert s.select(100.5, ["A", "B", "C"]) == first
    assert s.state("A") == before
    s.check_invariants()


def test_select_rejects_repeated_ids():
    with pytest.raises(ValueError, match="repeat"):
        edf(2).select(100, ["A", "B", "A"])
    with pytest.raises(ValueError, match="repeat"):
        fifo(0).select(100, ["A", "A"])


def test_select_with_nothing_ready():
    s = edf(4)
    emit(s, "A", 1, 100)
    assert s.select(100, []) == []
    assert fifo(0).select(100, []) == []


def test_edf_returns_at_most_k_and_at_most_the_ready():
    s = edf(3)
    for i, sid in enumerate("ABCDE"):
        emit(s, sid, 1 + i, 100)
    assert s.select(100, list("EDCBA")) == ["A", "B", "C"]
    assert s.select(100, ["E", "D"]) == ["D", "E"]


def test_edf_ties_on_deadline_and_first_seen_follow_ready_order():
    s = edf(2)
    assert s.select(100, ["A", "B", "C"]) == ["A", "B"]  # all seen at 100: same key
    assert s.select(100, ["C", "B", "A"]) == ["C", "B"]


def test_edf_tie_on_deadline_prefers_the_older_stream():
    s = edf(1, safety_margin_ms=0)
    s.admit("old", 90.0)
    s.admit("new", 95.0)
    emit(s, "new", 10, 95.0)  # horizon 105
    emit(s, "old", 5, 100.0)  # horizon 105
    assert s.select(100.0, ["new", "old"]) == ["old"]


def test_edf_protection_uses_slack_including_margin_edge():
    s = edf(1, first_chunk_ms=100, safety_margin_ms=500)
    s.admit("N", 99.0)  # deadline 99.1, overdue
    emit(s, "P", 0.5, 100.0)  # slack exactly 0.5 at 100: protected
    assert s.select(100.0, ["N", "P"]) == ["P"]
    assert s.select(99.99, ["N", "P"]) == ["N"]  # slack 0.51: not protected any more


def test_fresh_and_audio_streams_with_one_key_form_one_tie():
    s = edf(3, first_chunk_ms=100, safety_margin_ms=0)
    s.admit("X", 100.0)  # no audio: deadline 100.1, first seen 100
    s.admit("Y", 100.0)
    emit(s, "Y", 0.1, 100.0)  # audio: horizon 100.1, first seen 100
    emit(s, "Z", 1, 100.0)
    assert s.select(99.0, ["Z", "X", "Y"]) == ["X", "Y", "Z"]
    assert s.select(99.0, ["Y", "Z", "X"]) == ["Y", "X", "Z"]


def test_protected_streams_rank_by_horizon_among_themselves():
    s = edf(3, safety_margin_ms=1000)
    emit(s, "A", 0.9, 100)
    emit(s, "B", 0.2, 100)
    emit(s, "C", 0.5, 100)
    s.admit("N", 50)  # long overdue first chunk, after all three
    assert s.select(100, ["N", "A", "B", "C"]) == ["B", "C", "A"]


def test_fifo_without_window_returns_every_ready_stream_in_order():
    s = fifo(0)
    emit(s, "A", 0.01, 100)  # urgency means nothing to fifo
    assert s.select(100, ["C", "B", "A"]) == ["C", "B", "A"]
    assert s.select(101, ["B"]) == ["B"]


def test_fifo_slot_holder_that_is_not_ready_keeps_its_slot():
    s = fifo(2)
    assert s.select(100, ["A", "B", "C"]) == ["A", "B"]
    assert s.select(101, ["B", "C"]) == ["B"]  # A holds its slot while it has no chunk
    s.forget("A")
    assert s.select(102, ["B", "C"]) == ["B", "C"]


# --- properties: selection against the formula of docs/scheduling.md --------------------

# Halves and quarters are exact in binary, so equal deadlines, horizons exactly at the
# margin and shared keys come up often.
TIMES = st.sampled_from([98.5, 99.0, 99.5, 99.75, 100.0, 100.5, 101.0])
IDS = [f"s{i}" for i in range(6)]


@st.composite
def operations(draw):
    """A random history: audio, acks, admissions, forgets and selections over 6 streams."""
    ops = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["audio", "audio", "ack", "admit", "forget", "select"]))
        sid = draw(st.sampled_from(IDS))
        if kind == "audio":
            frames = draw(st.integers(-1, 2))
            rate = draw(st.sampled_from([0, 1, 2, 4]))
            ops.append(("audio", sid, frames, rate, draw(TIMES)))
        elif kind == "ack":
            ops.append(("ack", sid, draw(st.sampled_from([0.0, 0.5, 1.0, 2.5])), draw(TIMES)))
        elif kind in ("admit", "forget"):
            ops.append((kind, sid, draw(TIMES)))
        else:
            ready = draw(st.permutations(IDS))[: draw(st.integers(0, len(IDS)))]
            ops.append(("select", ready, draw(TIMES)))
    return ops


def spec_edf(model, now_s, ready_ids, window, first_chunk_ms, margin_ms):
    """Section 2's ranking, written straight from docs/scheduling.md."""

    def key(item):
        position, sid = item
        first_seen_s, horizon_s, _ = model[sid]
        if horizon_s is None:
            return (1, first_seen_s + first_chunk_ms / 1000, first_seen_s, position)
        protected = horizon_s - now_s <= margin_ms / 1000
        return (0 if protected else 1, horizon_s, first_seen_s, position)

    return [sid for _, sid in sorted(enumerate(ready_ids), key=key)[:window]]


def run_against_model(scheduler, ops, pick, on_forget=lambda sid: None, as_keys=False):
    """Apply `ops` to the scheduler and to a model kept per section 1; compare selections."""
    model: dict[str, list] = {}  # sid -> [first_seen_s, horizon_s, emitted_audio_s]
    for op in ops:
        kind = op[0]
        if kind == "audio":
            _, sid, frames, rate, at_s = op
            scheduler.record_audio(sid, frames, rate, at_s)
            if frames > 0 and rate > 0:
                d = frames / rate
                entry = model.setdefault(sid, [at_s, None, 0.0])
                entry[1] = max(at_s if entry[1] is None else entry[1], at_s) + d
                entry[2] += d
        elif kind == "ack":
            _, sid, played_s, at_s = op
            scheduler.ack_playback(sid, played_s, at_s)
            entry = model.setdefault(sid, [at_s, None, 0.0])
            entry[1] = at_s + (entry[2] - played_s)
        elif kind == "admit":
            _, sid, at_s = op
            scheduler.admit(sid, at_s)
            model.setdefault(sid, [at_s, None, 0.0])
        elif kind == "forget":
            _, sid, _ = op
            scheduler.forget(sid)
            model.pop(sid, None)
            on_forget(sid)
        else:
            _, ready, now_s = op
            for sid in ready:
                model.setdefault(sid, [now_s, None, 0.0])
            expected = pick(model, now_s, ready)
            ready_ids = dict.fromkeys(ready).keys() if as_keys else ready
            assert scheduler.select(now_s, ready_ids) == expected
        for sid in IDS:
            entry = model.get(sid)
            assert scheduler.horizon_s(sid) == (None if entry is None else entry[1])
            assert scheduler.emitted_audio_s(sid) == (0.0 if entry is None else entry[2])
        scheduler.check_invariants()


@settings(max_examples=300, deadline=None)
@given(
    ops=operations(),
    window=st.integers(1, 4),
    first_chunk_ms=st.sampled_from([100.0, 250.0, 500.0, 1000.0]),
    margin_ms=st.sampled_from([0.0, 250.0, 500.0]),
    walk=st.booleans(),
    as_keys=st.booleans(),
)
def test_edf_matches_the_spec_ranking(ops, window, first_chunk_ms, margin_ms, walk, as_keys):
    config = SchedulingConfig("edf", window, first_chunk_ms, margin_ms)
    # walk=False always ranks the ready streams directly; True never leaves the walk.
    budget = {"min_walk_visits": 10**9} if walk else {"min_walk_visits": 0, "visits_per_ready": 0}
    policy = EdfPolicy(window, margin_ms / 1000, **budget)
    scheduler = PlaybackScheduler(config, policy=policy)
    run_against_model(
        scheduler,
        ops,
        lambda model, now_s, ready: spec_edf(
            model, now_s, ready, window, first_chunk_ms, margin_ms
        ),
        as_keys=as_keys,
    )


@settings(max_examples=100, deadline=None)
@given(ops=operations(), window=st.integers(0, 3), as_keys=st.booleans())
def test_fifo_matches_sticky_slots(ops, window, as_keys):
    slots: list[str] = []

    def pick(model, now_s, ready):
        if window == 0:
            return list(ready)
        for sid in ready:
            if len(slots) < window and sid not in slots:
                slots.append(sid)
        return [sid for sid in slots if sid in ready]

    def on_forget(sid):
        if sid in slots:
            slots.remove(sid)

    run_against_model(fifo(window), ops, pick, on_forget, as_keys)


def test_edf_direct_ranking_kicks_in_behind_many_idle_urgent_streams():
    """200 dry streams without a chunk ready sit ahead of the 3 ready ones."""
    config = SchedulingConfig("edf", 2, 100.0, 50.0)
    walked = PlaybackScheduler(config, policy=EdfPolicy(2, 0.05, min_walk_visits=10**9))
    default = PlaybackScheduler(config)
    for s in (walked, default):
        for i in range(200):
            emit(s, f"idle{i}", 0.5, 90 + i * 0.01)
        emit(s, "R1", 1, 99)
        emit(s, "R2", 0.5, 99)
        s.admit("R3", 80)
    assert walked.select(100, ["R1", "R2", "R3"]) == ["R2", "R1"]
    assert default.select(100, ["R1", "R2", "R3"]) == ["R2", "R1"]


# --- properties: the horizon -------------------------------------------------------------

RATES_HZ = st.sampled_from([8000, 16000, 22050, 24000])
CHUNKS = st.lists(st.tuples(st.integers(1, 50_000), RATES_HZ), min_size=1, max_size=20)


@settings(max_examples=150, deadline=None)
@given(
    chunks=st.lists(
        st.tuples(st.integers(1, 50_000), RATES_HZ, st.floats(0, 1e6)), min_size=1, max_size=20
    )
)
def test_horizon_never_moves_backwards_and_late_chunks_restart(chunks):
    s = edf(1)
    previous_s = None
    for frames, rate, at_s in chunks:
        s.record_audio("A", frames, rate, at_s)
        horizon_s = s.horizon_s("A")
        d = frames / rate
        if previous_s is None or at_s > previous_s:  # first chunk, or the player ran dry
            assert horizon_s == at_s + d
        else:  # an early chunk extends the buffer
            assert horizon_s == previous_s + d
            assert horizon_s >= previous_s
        previous_s = horizon_s
    assert math.isclose(s.emitted_audio_s("A"), sum(f / r for f, r, _ in chunks))


@settings(max_examples=150, deadline=None)
@given(
    chunks=CHUNKS,
    emitted_at_s=st.floats(0, 1e5),
    played_s=st.floats(0, 1e3),
    at_s=st.floats(0, 1e5),
)
def test_ack_sets_horizon_to_at_plus_unplayed(chunks, emitted_at_s, played_s, at_s):
    s = edf(1)
    for frames, rate in chunks:
        s.record_audio("A", frames, rate, emitted_at_s)
    emitted_s = s.emitted_audio_s("A")
    s.ack_playback("A", played_s, at_s)
    assert s.horizon_s("A") == at_s + (emitted_s - played_s)
    assert s.emitted_audio_s("A") == emitted_s


def test_the_shipped_margin_protects_a_player_from_its_first_chunk_on():
    # The Piper deployment (configs/default.yaml): a player whose first chunk (the ramp's
    # 8 frames, 93 ms) has just left is served before a backlog of newcomers whose
    # first-chunk deadlines are long overdue, at every turn of its first chunk's playout.
    # With a margin under 93 ms its second chunk waited behind them and stalled.
    samples_per_frame, rate_hz = 256, 22050  # the bundled Piper voice's frames
    s = PlaybackScheduler(DEFAULT_SCHEDULING)
    newcomers = [f"N{i}" for i in range(30)]
    for i, stream_id in enumerate(newcomers):
        s.admit(stream_id, 99.5 + i * 0.001)
    s.record_audio("P", DEFAULT_CHUNKING.ramp[0] * samples_per_frame, rate_hz, 100.0)
    assert s.horizon_s("P") == pytest.approx(100.093, abs=1e-3)  # 93 ms of audio
    for now_s in (100.0, 100.01, 100.03, 100.05, 100.08):
        assert s.select(now_s, [*newcomers, "P"]) == ["P"], now_s

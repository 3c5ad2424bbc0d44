"""The simulated 1x player and its metrics (docs/benchmarking.md), with hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from benchmarks.player import (
    Outcome,
    Playback,
    Player,
    StreamRecord,
    listening_in_window,
    percentile,
    stall_ratio_bound,
    summarize,
)


def play(chunks: list[tuple[float, float]]) -> Playback:
    player = Player()
    for arrived_at_s, duration_s in chunks:
        player.feed(arrived_at_s, duration_s)
    return player.result()


def test_reset_on_stall_rule_by_hand() -> None:
    # h: 10.0 -> 10.5 -> 11.0 (early chunk extends the buffer)
    # 11.1 > 11.0: stall 0.1, h = 11.1 + 0.4 = 11.5
    # 11.505 > 11.5: stall 0.005, h = 11.705
    # 12.3 > 11.705: stall 0.595, h = 13.3
    result = play([(10.0, 0.5), (10.2, 0.5), (11.1, 0.4), (11.505, 0.2), (12.3, 1.0)])
    assert result.started_at_s == 10.0
    assert result.stalls_s == pytest.approx((0.1, 0.005, 0.595))
    assert result.ended_at_s == pytest.approx(13.3)
    assert result.audio_s == pytest.approx(2.6)
    assert result.stall_s == pytest.approx(0.7)
    assert result.chunks == 5


def test_reset_differs_from_a_cumulative_clock() -> None:
    # Without the reset, the 0.5 s stall would be "paid back" by the later burst: the second
    # late chunk would look on time against 10.0 + 1.0 + 1.0. With the reset it stalls again.
    result = play([(10.0, 1.0), (11.5, 1.0), (13.0, 1.0)])
    assert result.stalls_s == pytest.approx((0.5, 0.5))
    assert result.ended_at_s == pytest.approx(14.0)


def test_chunk_arriving_exactly_when_dry_is_no_stall() -> None:
    result = play([(0.0, 0.25), (0.25, 0.25), (0.5, 0.5)])
    assert result.stalls_s == ()
    assert result.stall_free()


def test_empty_chunks_are_ignored_and_do_not_start_playback() -> None:
    player = Player()
    assert player.feed(1.0, 0.0) == 0.0  # e.g. a WAV header: no audio yet
    assert player.result().started_at_s is None
    player.feed(2.0, 0.5)
    player.feed(3.0, 0.0)  # an empty trailing read is no stall
    result = player.result()
    assert result.started_at_s == 2.0
    assert result.stalls_s == ()


def test_the_margin_is_the_least_audio_left_as_a_chunk_arrived() -> None:
    # h after each chunk: 0.5, 1.0 (0.3 left as it came), 1.2 (0.1 left: the least), 2.2
    result = play([(0.0, 0.5), (0.2, 0.5), (0.9, 0.2), (1.0, 1.0)])
    assert result.margin_s == pytest.approx(0.1)
    assert result.margin_at_s == pytest.approx(1.0)  # after the first two chunks' audio
    stalled = play([(0.0, 0.5), (0.3, 0.5), (1.2, 0.5)])  # 0.2 s dry before the third
    assert stalled.margin_s == pytest.approx(-0.2)
    assert stalled.margin_at_s == pytest.approx(1.0)
    assert play([(0.0, 0.5)]).margin_s is None  # one chunk: nothing arrived while playing


def test_feed_returns_the_stall() -> None:
    player = Player()
    assert player.feed(0.0, 0.1) == 0.0
    assert player.feed(0.3, 0.1) == pytest.approx(0.2)


def test_tolerance_and_interruptions() -> None:
    result = Playback(
        started_at_s=0.0,
        ended_at_s=10.0,
        audio_s=9.0,
        chunks=6,
        stalls_s=(0.005, 0.0099, 0.010, 0.149, 0.150, 0.4),
    )
    assert result.stall_count() == 4  # 10 ms and up count
    assert result.stall_count(tolerance_s=0.0) == 6
    assert result.interruptions() == 2  # 150 ms and up
    assert not result.stall_free()
    tiny = Playback(0.0, 1.0, 1.0, 3, (0.004, 0.009))
    assert tiny.stall_free()  # stalls under 10 ms are ignored
    assert not tiny.stall_free(tolerance_s=0.001)


def record(
    sent: float,
    chunks: list[tuple[float, float]],
    outcome: Outcome = Outcome.OK,
    **kw: object,
) -> StreamRecord:
    pb = play(chunks)
    end = max((a for a, _ in chunks), default=sent)
    return StreamRecord(
        outcome=outcome,
        sent_at_s=sent,
        answered_at_s=kw.pop("answered_at_s", sent),  # type: ignore[arg-type]
        finished_at_s=end,
        playback=pb,
        **kw,  # type: ignore[arg-type]
    )


def test_summary_by_hand() -> None:
    smooth = record(0.0, [(0.2, 1.0), (1.0, 1.0)])  # TTFA 0.2, no stall, audio 2
    # TTFA 1.5 (misses a 1 s SLO), one 0.3 s stall (an interruption): audio 2
    choppy = record(1.0, [(2.5, 1.0), (3.8, 1.0)])
    slight = record(2.0, [(2.4, 1.0), (3.45, 2.0)])  # TTFA 0.4, one 50 ms stall: audio 3
    rejected = StreamRecord(
        outcome=Outcome.REJECTED,
        sent_at_s=4.0,
        answered_at_s=4.02,
        finished_at_s=4.02,
        playback=Player().result(),
        retry_after_s=2.0,
        http_status=429,
    )
    s = summarize([smooth, choppy, slight, rejected], wall_s=10.0)
    assert s.streams_ok == 3
    assert s.rejected == 1
    assert s.retry_after_s == (2.0,)
    assert s.reject_latency_max_ms == pytest.approx(20.0)
    assert s.audio_s == pytest.approx(7.0)
    assert s.stall_ratio == pytest.approx((0.3 + 0.05) / 7.0)
    assert s.stalls_per_stream == pytest.approx(2 / 3)
    assert s.interruptions == 1
    assert s.stall_free_share == pytest.approx(1 / 3)
    assert s.goodput_streams_per_s == pytest.approx(2 / 10.0)  # smooth and slight
    assert s.xrt == pytest.approx(0.7)
    # TTFA values 0.2, 0.4, 1.5 s: p50 is the middle one
    assert s.ttfa_p50_ms == pytest.approx(400.0)
    assert s.ttfa_max_ms == pytest.approx(1500.0)
    # RTF (end-to-end / audio): smooth 1.0/2, choppy 2.8/2, slight 1.45/3
    assert s.rtf_p50 == pytest.approx(0.5)
    # margins: smooth 0.2, choppy -0.3, slight -0.05 (the rejected stream has none)
    assert s.margin_p1_ms == pytest.approx(-300.0 + 0.02 * 250.0)
    assert s.margin_p5_ms == pytest.approx(-300.0 + 0.1 * 250.0)


def test_summary_counts_xrt_from_the_window_when_given() -> None:
    s = summarize([record(0.0, [(0.1, 4.0)])], wall_s=2.0, audio_received_s=3.0)
    assert s.xrt == pytest.approx(1.5)


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)


def test_bound() -> None:
    assert stall_ratio_bound(4, 8.0) == 0.0
    assert stall_ratio_bound(16, 8.0) == pytest.approx(1.0)
    assert stall_ratio_bound(12, 8.0) == pytest.approx(0.5)
    assert math.isinf(stall_ratio_bound(1, 0.0))


def test_listening_counts_player_time_inside_the_window() -> None:
    # [0, 4] and [3, 9] clipped to [2, 8]: 2 + 5 seconds
    assert listening_in_window([(0.0, 4.0), (3.0, 9.0)], 2.0, 8.0) == pytest.approx(7.0)
    assert listening_in_window([(9.0, 10.0)], 2.0, 8.0) == 0.0


def test_summary_listening_in_flight_and_waits() -> None:
    first = record(0.0, [(0.5, 2.0)])  # plays [0.5, 2.5], request open [0, 0.5]
    retried = StreamRecord(
        outcome=Outcome.OK,
        sent_at_s=1.0,
        answered_at_s=1.0,
        finished_at_s=2.0,
        playback=play([(1.5, 1.0), (3.0, 1.0)]),  # plays [1.5, 4.0] with a 0.5 s stall
        waited_s=3.0,
    )
    s = summarize([first, retried], wall_s=5.0)
    assert s.listening_mean == pytest.approx((2.0 + 2.5) / 5.0)
    assert s.in_flight_mean == pytest.approx((0.5 + 1.0) / 5.0)
    assert s.wait_p99_ms == pytest.approx(2970.0)  # waits 0 and 3 s, interpolated
    assert s.wait_p50_ms == pytest.approx(1500.0)
    assert summarize([first], wall_s=5.0, listening_s=4.0).listening_mean == pytest.approx(0.8)

"""scheduling.PlayingLedger: players still playing after their audio was all sent."""

from __future__ import annotations

from scheduling import PlayingLedger


def test_a_player_counts_until_its_horizon_then_drops_out() -> None:
    ledger = PlayingLedger()
    ledger.enter("a", until_s=25.0, now_s=10.0)
    ledger.enter("b", until_s=12.0, now_s=10.0)
    assert ledger.count(10.0) == 2
    assert sorted(ledger.until_times_s(11.0)) == [12.0, 25.0]
    assert ledger.count(12.0) == 1  # b ran dry at 12
    assert ledger.count(25.0) == 0


def test_a_cancelled_stream_leaves_at_once() -> None:
    ledger = PlayingLedger()
    ledger.enter("gone", until_s=30.0, now_s=10.0)
    ledger.enter("stays", until_s=30.0, now_s=10.0)
    ledger.leave("gone")
    ledger.leave("unknown")  # fine
    assert ledger.count(11.0) == 1 and "gone" not in ledger and "stays" in ledger


def test_a_horizon_already_past_enters_nothing() -> None:
    ledger = PlayingLedger()
    ledger.enter("late", until_s=9.0, now_s=10.0)
    assert ledger.count(10.0) == 0 and len(ledger) == 0


def test_entering_again_after_leaving_counts_once() -> None:
    ledger = PlayingLedger()
    ledger.enter("a", until_s=20.0, now_s=10.0)
    ledger.leave("a")
    ledger.enter("a", until_s=20.0, now_s=11.0)
    assert ledger.count(12.0) == 1
    assert ledger.count(20.0) == 0

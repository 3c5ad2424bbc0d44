"""The slowest first audios taken apart, as `benchmarks.bench` records them per point."""

from __future__ import annotations

from benchmarks.bench import ttfa_parts_ms
from benchmarks.player import Outcome, Playback, StreamRecord


def _record(
    ttfa_s: float | None,
    outcome: Outcome = Outcome.OK,
    waited_s: float = 0.0,
    start_wait_s: float | None = None,
    first_audio_s: float | None = None,
) -> StreamRecord:
    started = None if ttfa_s is None else 10.0 + ttfa_s
    playback = Playback(started_at_s=started, ended_at_s=None, audio_s=1.0, chunks=1, stalls_s=())
    return StreamRecord(
        outcome=outcome,
        sent_at_s=10.0,
        answered_at_s=10.0,
        finished_at_s=12.0,
        playback=playback,
        waited_s=waited_s,
        server_start_wait_s=start_wait_s,
        server_first_audio_s=first_audio_s,
    )


def test_the_slowest_accepted_streams_come_first_with_their_parts() -> None:
    records = [
        _record(0.2, start_wait_s=0.0, first_audio_s=0.15),
        _record(0.9, waited_s=2.0, start_wait_s=0.7, first_audio_s=0.12),
        _record(0.5),  # a server that says nothing of its timings
        _record(5.0, outcome=Outcome.REJECTED),  # refused: no first audio of its own
        _record(None),  # no audio at all
    ]
    assert ttfa_parts_ms(records, 2) == [[900.0, 2000.0, 700.0, 120.0], [500.0, 0.0, None, None]]
    assert len(ttfa_parts_ms(records, 10)) == 3

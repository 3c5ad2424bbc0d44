"""`make bench-voice`'s capacity against the machine's limit: C and the limit measured in
rounds (C under both schedules, then the limit), each figure the mean of its rounds, and
the report line that prints them. The load runs and the limit's processes are stood in
for by recorded figures: what is tested is how the rounds combine."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from benchmarks import voice
from benchmarks.bench import Policy
from benchmarks.voice_limit import LimitRun
from benchmarks.voice_report import limit_line

FIFO, EDF = Policy("fifo", 0, False), Policy("edf", 1, False)


class _RecordedBench:
    """Bench.capacity's answers, one per round, from recorded figures."""

    def __init__(self, rounds: list[dict[str, float]]) -> None:
        self._rounds = rounds
        self.plan = argparse.Namespace(texts=("a text",))
        self.asked: list[int] = []

    def capacity(self, round_index: int = 0) -> dict[str, tuple[float, Any, Policy]]:
        self.asked.append(round_index)
        figures = self._rounds[round_index]
        return {
            policy.label: (figures[policy.label], f"result {round_index}", policy)
            for policy in (FIFO, EDF)
        }


def _limit_runs(two_by_one: float, one_by_two: float) -> list[LimitRun]:
    # audio seconds in 10 s of wall time
    return [LimitRun(2, 1, two_by_one * 10, 10.0, 100), LimitRun(1, 2, one_by_two * 10, 10.0, 90)]


def _measure(
    monkeypatch: pytest.MonkeyPatch,
    capacity_rounds: list[dict[str, float]],
    limit_rounds: list[tuple[float, float]],
    *,
    no_limit: bool = False,
) -> tuple[float, Any, dict[str, float], dict[str, Any] | None]:
    limits = iter(limit_rounds)
    monkeypatch.setattr(voice, "machine_limit", lambda args, texts: _limit_runs(*next(limits)))
    monkeypatch.setattr(
        voice, "run_row", lambda policy, result, capacity: (policy.label, result, capacity)
    )
    args = argparse.Namespace(capacity_rounds=len(capacity_rounds), no_limit=no_limit)
    bench = _RecordedBench(capacity_rounds)
    measured = voice.capacity_and_limit(bench, args)  # type: ignore[arg-type]
    assert bench.asked == list(range(len(capacity_rounds)))
    return measured


def test_c_and_the_limit_are_each_the_mean_of_their_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    capacity, run, by_policy, limit = _measure(
        monkeypatch,
        [{"fifo K=0": 14.0, "edf K=1": 15.0}, {"fifo K=0": 14.0, "edf K=1": 13.0}],
        [(17.0, 15.0), (16.0, 12.0)],
    )
    # edf's mean (14.0) ties fifo's (14.0): the first larger one counts, fifo
    assert by_policy == {"fifo K=0": 14.0, "edf K=1": 14.0}
    assert capacity == 14.0
    assert run == ("fifo K=0", "result 1", 14.0)  # the chosen schedule's last run
    assert limit is not None
    assert (limit["audio_s_per_s"], limit["layout"]) == (16.5, "2x1")
    assert limit["by_layout"] == {"2x1": 16.5, "1x2": 13.5}
    assert limit["capacity_ratio"] == pytest.approx(14.0 / 16.5)
    # each round's own ratio: its larger C over its best layout
    assert [r["capacity_ratio"] for r in limit["rounds"]] == pytest.approx([15 / 17, 14 / 16])
    assert len(limit["runs"]) == 4  # every layout of every round


def test_the_larger_schedule_is_chosen_by_its_mean_not_by_one_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One lucky edf run (17) does not make C 17: fifo's mean is the larger."""
    capacity, run, by_policy, _ = _measure(
        monkeypatch,
        [{"fifo K=0": 14.5, "edf K=1": 17.0}, {"fifo K=0": 14.5, "edf K=1": 11.0}],
        [(17.0, 12.0), (17.0, 12.0)],
    )
    assert by_policy == {"fifo K=0": 14.5, "edf K=1": 14.0}
    assert capacity == 14.5 and run[0] == "fifo K=0"


def test_without_the_limit_only_c_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    capacity, _, _, limit = _measure(
        monkeypatch, [{"fifo K=0": 12.0, "edf K=1": 13.0}], [], no_limit=True
    )
    assert (capacity, limit) == (13.0, None)


def test_the_report_line_gives_the_means_and_each_rounds_ratio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, _, by_policy, limit = _measure(
        monkeypatch,
        [{"fifo K=0": 14.0, "edf K=1": 15.0}, {"fifo K=0": 14.0, "edf K=1": 13.0}],
        [(17.0, 15.0), (16.0, 12.0)],
    )
    line = limit_line({"machine_limit": limit, "capacity_by_policy": by_policy})
    assert "C = 14.00 audio s per s (the larger of fifo K=0 14.00, edf K=1 14.00" in line
    assert "each the mean of 2 runs" in line
    assert "limit = 16.50" in line and "2x1: 16.50, 1x2: 13.50" in line
    assert "C / limit = 0.85 (round by round, C then the limit right after: 0.88, 0.88)" in line


def test_a_single_round_report_reads_as_before() -> None:
    """results.json of a run before the rounds (no `by_layout`, no `rounds`)."""
    results = {
        "machine_limit": {
            "audio_s_per_s": 16.63,
            "layout": "2x1",
            "runs": [r.as_dict() for r in _limit_runs(16.63, 12.59)],
            "capacity_audio_s_per_s": 12.26,
            "capacity_ratio": 12.26 / 16.63,
        },
        "capacity_by_policy": {"fifo K=0": 11.52, "edf K=1": 12.26},
    }
    assert limit_line(results) == (
        "Capacity against the machine's limit: C = 12.26 audio s per s (the larger of fifo "
        "K=0 11.52, edf K=1 12.26, saturated, no admission); limit = 16.63 (piper's whole "
        "model, best layout 2x1 processes x threads; 2x1: 16.63, 1x2: 12.59); C / limit = "
        "0.74.\n"
    )

"""`make bench-voice`'s capacity against the machine's limit: C and the limit measured in
rounds (C under both schedules, then the limit), each figure the mean of its rounds, and
the report line that prints them; and the report's lines for the targets on the whole
machine (C / limit, seams, a single request's RTF against piper's server). The load runs
and the limit's processes are stood in for by recorded figures: what is tested is how
they combine and are judged."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from typing import Any

import pytest

from benchmarks import voice, voice_report, voice_targets
from benchmarks.bench import LoadPlan, Policy
from benchmarks.lab.rtf_ab import TEXTS, rotation
from benchmarks.loadgen import RequestResult
from benchmarks.player import Outcome, Player, StreamRecord
from benchmarks.voice_limit import LimitRun
from benchmarks.voice_report import limit_line
from benchmarks.voice_targets import PLAYHEAD

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


def _single(ours: tuple[float, float], peer: tuple[float, float]) -> dict[str, Any]:
    return {
        server: {"short": {"rtf_p50": rtfs[0]}, "long": {"rtf_p50": rtfs[1]}}
        for server, rtfs in ((PLAYHEAD, ours), (voice_targets.PIPER, peer))
    }


def test_a_single_requests_rtf_is_judged_against_piper_in_the_same_run() -> None:
    """At most piper's RTF p50 is met, per kind of text; short texts first."""
    judged = voice_targets.rtf_vs_peer(_single((0.080, 0.075), (0.080, 0.070)))
    assert list(judged) == ["short", "long"]
    assert judged["short"] == {"playhead": 0.080, "peer": 0.080, "ratio": 1.0, "met": True}
    assert judged["long"]["ratio"] == pytest.approx(0.075 / 0.070)
    assert not judged["long"]["met"]
    # no peer (--no-peer): nothing to judge
    assert voice_targets.rtf_vs_peer({PLAYHEAD: _single((0.08, 0.07), (0.1, 0.1))[PLAYHEAD]}) == {}


def test_the_report_states_every_machine_target() -> None:
    """C / limit, the seams and the RTF against piper's each get a met / MISSED line."""
    results: dict[str, Any] = {
        "single_stream": _single((0.094, 0.085), (0.075, 0.075)),
        "concurrency": {PLAYHEAD: []},
        "runs": [],
        "machine_limit": {"capacity_ratio": 0.82},
        "seams": {"worst_db": 42.74, "median_db": 65.13},
    }
    results["single_stream"][PLAYHEAD]["short"]["ttfa_p50_ms"] = 55.0
    t = voice_targets.targets(results)
    assert t["capacity_ratio_met"] and t["seams_met"]
    assert not any(r["met"] for r in t["rtf_vs_peer"].values())
    lines = voice_report._machine_targets(t)
    assert lines == [
        "C / limit 0.82 vs >= 0.8: met.",
        "Seams against whole-segment synthesis: worst 42.7 dB (median 65.1) vs >= 40 dB: met.",
        "Single-request RTF p50 against piper's server: short first sentence 0.094 vs 0.075 "
        "(1.25x); 30+ word first sentence 0.085 vs 0.075 (1.13x), vs <= 1x: MISSED.",
    ]
    results["machine_limit"]["capacity_ratio"] = 0.79
    results["seams"]["worst_db"] = 39.9
    t = voice_targets.targets(results)
    assert voice_report._machine_targets(t)[:2] == [
        "C / limit 0.79 vs >= 0.8: MISSED.",
        "Seams against whole-segment synthesis: worst 39.9 dB (median 65.1) vs >= 40 dB: MISSED.",
    ]
    del results["machine_limit"], results["seams"]  # --no-limit, and no sweep
    assert voice_report._machine_targets(voice_targets.targets(results))[0].startswith(
        "Single-request"
    )


def test_the_0_9c_target_line_gives_the_servers_split_where_the_run_has_it() -> None:
    """The TTFA p99 at 0.9 C, and (runs from 2026-12-02) the server's Server-Timing split
    of a first audio: the wait for a start slot, then submit -> first audio."""
    run = {
        "label": f"edf K={voice.WINDOW} + admission",
        "streams": 13,
        "stall_free_share": 1.0,
        "ttfa_p99_ms": 424.0,
        "rejected": 2,
        "streams_ok": 80,
        "stall_free_streams": 80,
        "server_start_wait_p99_ms": 251.0,
        "server_first_audio_p99_ms": 183.0,
    }
    results: dict[str, Any] = {
        "single_stream": _single((0.094, 0.085), (0.075, 0.075)),
        "concurrency": {PLAYHEAD: []},
        "runs": [run],
        "capacity_audio_s_per_s": 14.0,
    }
    results["single_stream"][PLAYHEAD]["short"]["ttfa_p50_ms"] = 55.0
    line = (
        f"At N = 0.9 C (13 streams), edf K={voice.WINDOW} + admission: 100% stall-free, "
        "TTFA p99 424 ms vs < 300 ms (2 x 429): MISSED."
    )
    split = (
        " The server's split (Server-Timing), p99: waiting for a start slot 251 ms, "
        "submit to first audio 183 ms."
    )
    assert voice_report._at_0_9c_targets(voice_targets.targets(results)) == [line + split]
    del run["server_start_wait_p99_ms"], run["server_first_audio_p99_ms"]  # an older run
    assert voice_report._at_0_9c_targets(voice_targets.targets(results)) == [line]


def test_single_streams_alternate_between_the_servers_text_by_text() -> None:
    """`alternating`: every drawn text goes to both servers, one request at a time, the
    order swapping text by text, with `settle_s` of quiet after each request; each
    server's result holds its own requests, its wall time their sum, so its RTF is its
    own. The servers stand in as recorded clients (`LoadPlan.request`): a fixed time per
    audio second each, answered at once."""
    calls: list[tuple[str, str]] = []
    sent_at: list[float] = []

    def recorded(name: str, seconds_per_audio_s: float) -> Any:
        async def request(client, url, text, options, clock, waited_s=0.0, tracker=None):  # type: ignore[no-untyped-def]
            calls.append((name, text))
            sent_at.append(time.monotonic())
            audio_s = len(text) / 10.0
            player = Player()
            player.feed(0.01, audio_s)
            playback = player.result()
            record = StreamRecord(
                Outcome.OK, 0.0, 0.005, seconds_per_audio_s * audio_s, playback, len(text)
            )
            return RequestResult(record, ())

        return request

    targets = [
        ("fast", "http://fast", LoadPlan(texts=(), request=recorded("fast", 0.04))),
        ("slow", "http://slow", LoadPlan(texts=(), request=recorded("slow", 0.05))),
    ]
    texts = ("one sentence here.", "another, longer sentence here.", "a third one.")
    results = asyncio.run(voice.alternating(targets, texts, 6, seed=3, settle_s=0.02))
    assert [name for name, _ in calls] == ["fast", "slow", "slow", "fast"] * 3
    # the next request waits out the pause (the event loop's timer may fire a clock tick early)
    assert min(b - a for a, b in itertools.pairwise(sent_at)) >= 0.02 - 1e-3
    sent = [text for _, text in calls]
    assert sent[0::2] == sent[1::2]  # each text to both, one after the other
    for name, rtf in (("fast", 0.04), ("slow", 0.05)):
        result = results[name]
        assert len(result.records) == 6
        assert result.summary.rtf_p50 == pytest.approx(rtf)
        audio_s = sum(len(text) / 10.0 for text in sent[0::2])
        assert result.window_s == (0.0, pytest.approx(rtf * audio_s))


def test_rtf_ab_gives_every_text_every_place_in_the_order() -> None:
    """`benchmarks.lab.rtf_ab` sends each text to its servers in a rotating order. With 9 texts
    and 3 servers a rotation by text alone gave each text the same order in every round
    (server A right after piper's for two texts of three, B for one), so the order turns
    by round too: over 3 rounds each text meets each server in each place."""
    names = ["a", "b", "piper-http"]
    for text_index in range(len(TEXTS)):
        orders = [rotation(names, round_index, text_index) for round_index in range(3)]
        assert all(sorted(order) == sorted(names) for order in orders)
        for place in range(3):
            assert {order[place] for order in orders} == set(names)

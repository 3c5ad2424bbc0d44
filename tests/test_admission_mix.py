"""A mixed load's per-voice figures (benchmarks/admission_runs.py `--mix-voice`): each
request is tagged with the voice it went out in, and a run's figures per voice count that
run's requests only (each run has its own clock)."""

from __future__ import annotations

import asyncio

from benchmarks.admission_runs import mixed_plan, per_voice
from benchmarks.bench import LoadPlan
from benchmarks.listening import Arrival, RequestResult
from benchmarks.loadgen import LoadResult, RequestOptions
from benchmarks.player import Outcome, Playback, StreamRecord, summarize


def _result(sent_s: float, first_s: float | None, end_s: float, stalls=()) -> RequestResult:  # type: ignore[no-untyped-def]
    outcome = Outcome.OK if first_s is not None else Outcome.REJECTED
    audio_s = end_s - first_s - sum(stalls) if first_s is not None else 0.0
    playback = Playback(first_s, end_s if first_s is not None else None, audio_s, 2, tuple(stalls))
    record = StreamRecord(outcome, sent_s, sent_s, end_s, playback)
    arrivals = (Arrival(first_s, audio_s),) if first_s is not None else ()
    return RequestResult(record, arrivals)


def test_a_mixed_run_reports_each_voice_from_its_own_requests() -> None:
    answers = {  # text -> the result its request gets
        "old": _result(0.0, 0.1, 9.0),  # an earlier run's request (another clock)
        "hello there.": _result(1.0, 1.2, 5.2),
        "こんにちは。": _result(1.0, 2.0, 6.0, stalls=(0.5,)),
        "また明日。": _result(2.0, None, 2.0),  # a 429
    }
    sent: list[str] = []

    async def base(client, url, text, options, clock, waited_s=0.0, tracker=None):  # type: ignore[no-untyped-def]
        sent.append(options.voice)
        return answers[text]

    plan = LoadPlan(texts=("hello there.", "old"), options=RequestOptions(voice="en"), request=base)
    mixed, tags = mixed_plan(plan, "ja", ["こんにちは。", "また明日。", "x" * 300], max_chars=150)
    assert mixed.texts == ("hello there.", "old", "こんにちは。", "また明日。")

    def ask(text: str) -> RequestResult:
        return asyncio.run(mixed.request(None, "", text, mixed.options, None))  # type: ignore[arg-type]

    ask("old")
    since = len(tags.results)
    results = [ask(t) for t in ("hello there.", "こんにちは。", "また明日。")]
    run = slice(since, len(tags.results))
    ask("old")  # a later run's request (a probe after the point): not this run's either
    assert sent == ["en", "en", "ja", "ja", "en"]
    records = tuple(r.record for r in results)
    load = LoadResult("closed", 2, records, summarize(records, wall_s=10.0), (0.0, 10.0), 0)
    rows = per_voice(load, tags, capacity=2.0, run=run)
    assert set(rows) == {"en", "ja"}
    assert rows["en"]["streams_ok"] == 1 and rows["en"]["stall_free_share"] == 1.0
    assert rows["ja"]["streams_ok"] == 1 and rows["ja"]["stall_free_share"] == 0.0
    assert rows["ja"]["rejected"] == 1 and rows["en"]["rejected"] == 0
    # playing: 4 s of the 10 s window each (the earlier run's 8.9 s not counted), over C 2
    assert rows["en"]["playing_per_capacity"] == 0.4 / 2.0
    assert rows["ja"]["playing_per_capacity"] == 0.4 / 2.0
    assert rows["ja"]["audio_s_per_s"] == 3.5 / 10.0

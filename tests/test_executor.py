"""The executor boundary: one dedicated thread per stage, calls in order."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from pipeline.executor import StageClosed, StageExecutor


async def test_calls_run_in_the_stage_thread_and_return_or_raise() -> None:
    stage = StageExecutor("talker")
    try:
        name = await stage.run(lambda: threading.current_thread().name)
        assert name.startswith("playhead-talker_")
        assert name != threading.current_thread().name
        assert await stage.run(stage.in_stage_thread) is True
        assert stage.in_stage_thread() is False
        assert await stage.run(pow, 2, 10) == 1024
        with pytest.raises(ZeroDivisionError):
            await stage.run(lambda: 1 / 0)
    finally:
        await stage.aclose()


async def test_calls_run_one_at_a_time_in_submission_order() -> None:
    stage = StageExecutor("vocoder")
    log: list[tuple[str, int]] = []
    threads: set[int] = set()

    def call(i: int) -> int:
        threads.add(threading.get_ident())
        log.append(("start", i))
        time.sleep(0.002)
        log.append(("end", i))
        return i

    try:
        results = await asyncio.gather(*(stage.run(call, i) for i in range(5)))
    finally:
        await stage.aclose()
    assert results == list(range(5))
    assert log == [(kind, i) for i in range(5) for kind in ("start", "end")]
    assert len(threads) == 1


async def test_run_timed_reads_the_clock_in_the_thread() -> None:
    ticks = iter([10.0, 12.5])
    stage = StageExecutor("vocoder", clock=lambda: next(ticks))
    try:
        timed = await stage.run_timed(str.upper, "abc")
    finally:
        await stage.aclose()
    assert (timed.result, timed.started_s, timed.finished_s, timed.seconds) == (
        "ABC",
        10.0,
        12.5,
        2.5,
    )


async def test_aclose_waits_for_the_call_in_flight_even_when_its_caller_is_cancelled() -> None:
    stage = StageExecutor("talker")
    entered = threading.Event()
    release = threading.Event()
    finished: list[bool] = []

    def slow() -> None:
        entered.set()
        release.wait(5)
        finished.append(True)

    task = asyncio.ensure_future(stage.run(slow))
    await asyncio.to_thread(entered.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == []  # a model call cannot be interrupted: it still runs
    release.set()
    await stage.aclose()
    assert finished == [True]
    with pytest.raises(StageClosed):
        await stage.run(print)

"""The executor boundary: one dedicated thread per stage, calls in order."""

from __future__ import annotations

import asyncio
import gc
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


@pytest.mark.parametrize("call_timeout_s", [0.0, 30.0])
async def test_a_call_that_fails_after_its_caller_was_cancelled_leaves_no_unretrieved_error(
    call_timeout_s: float,
) -> None:
    """A stop cancels the stage loop while a call runs on; the call then fails (an aborted
    Piper decode raises): its error is nobody's and must not be reported as a "Future
    exception was never retrieved" when the future is collected."""
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context["message"]))
    stage = StageExecutor("vocoder", call_timeout_s=call_timeout_s)
    entered, release = threading.Event(), threading.Event()

    def aborted() -> None:
        entered.set()
        release.wait(5)
        raise RuntimeError("aborted")

    try:
        task = asyncio.ensure_future(stage.run(aborted))
        await asyncio.to_thread(entered.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        await stage.aclose()
        await asyncio.sleep(0)
        del task
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert not [m for m in reported if "never retrieved" in m], reported


@pytest.mark.parametrize("call_timeout_s", [0.0, 30.0])
async def test_a_cancel_as_the_call_returns_is_never_swallowed(call_timeout_s: float) -> None:
    """A task cancelled while it still runs must end cancelled, never with the result:
    a stage loop that swallowed its cancel (asyncio.wait_for on Python 3.11 did, when the
    call ended in the same loop pass) waited for ever and Engine.stop hung. The cancel
    is sent at every loop pass from the call's start to its return, many times over."""
    stage = StageExecutor("vocoder", call_timeout_s=call_timeout_s)
    swallowed = 0
    try:
        for delay_passes in range(12):
            for _ in range(40):
                task = asyncio.create_task(stage.run(int, 7))
                for _ in range(delay_passes):
                    await asyncio.sleep(0)
                if task.done():
                    assert task.result() == 7
                    continue
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    continue
                swallowed += 1
    finally:
        await stage.aclose()
    assert swallowed == 0

"""The executor boundary: every model call runs here, never on the event loop.

A `StageExecutor` is one pipeline stage's dedicated worker thread (the talker's, the
vocoder's). One thread per stage: calls of a stage run one at a time, in order, and a
model's thread-local state (ONNX Runtime sessions, a generator's frame) stays on it.

    result = await stage.run(fn, *args)
    timed = await stage.run_timed(fn, *args)   # plus when the call ran, read in the thread

Cancelling the awaiting task does not interrupt a call already running in the thread (a
model call cannot be interrupted); `aclose` waits for the calls in flight to end.

A call that has not returned after `call_timeout_s` raises StageTimeout in its caller
(whose streams then fail) and the stage moves on to a fresh worker thread: the hung call
is abandoned in its old thread (its result, if it ever comes, is dropped), so one stuck
model call cannot stop every other stream. The backend must then accept a call from the
new thread while the old one may still run (ONNX Runtime sessions do); `abandoned` counts
such threads.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

THREAD_PREFIX = "playhead-"


class StageClosed(RuntimeError):
    """A call was made on a stage executor after it was closed."""


class StageTimeout(RuntimeError):
    """A stage call did not return within the stage's `call_timeout_s`."""


@dataclass(frozen=True)
class Timed(Generic[T]):
    """A stage call's result and when it ran (clock seconds, read in the stage thread)."""

    result: T
    started_s: float
    finished_s: float

    @property
    def seconds(self) -> float:
        return self.finished_s - self.started_s


class StageExecutor:
    """One dedicated worker thread for one pipeline stage."""

    def __init__(
        self,
        name: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        call_timeout_s: float = 0.0,
        on_timeout: Callable[[str, float], None] | None = None,
    ) -> None:
        """`call_timeout_s` > 0: a call running longer raises StageTimeout (module doc)."""
        self.name = name
        self.thread_name = f"{THREAD_PREFIX}{name}"
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.thread_name)
        self._closed = False
        self.call_timeout_s = call_timeout_s
        self.abandoned = 0  # worker threads left behind with a hung call
        self._on_timeout = on_timeout  # (stage name, timeout) on each hung call

    @property
    def closed(self) -> bool:
        return self._closed

    def in_stage_thread(self) -> bool:
        """Whether the caller runs in this stage's worker thread."""
        return threading.current_thread().name.startswith(self.thread_name + "_")

    async def run(self, fn: Callable[..., T], /, *args: object) -> T:
        """Run `fn(*args)` in the stage thread and return its result (or raise its error)."""
        if self._closed:
            raise StageClosed(f"the {self.name} stage is closed")
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._pool, functools.partial(fn, *args))
        if self.call_timeout_s <= 0:
            return await future
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the result when a
        # cancel arrives just as the call ends, swallowing the cancel (the stage loop then
        # waited for ever and Engine.stop hung); timeout() only turns its own expiry into
        # TimeoutError and lets every outside cancel through.
        try:
            async with asyncio.timeout(self.call_timeout_s):
                return await asyncio.shield(future)
        except asyncio.CancelledError:
            # the caller is cancelled (a stop) while the call runs on: its outcome, an
            # aborted call's error included, is nobody's ("exception never retrieved")
            future.add_done_callback(_drop_result)
            raise
        except TimeoutError:
            if future.done():  # it returned at the very end: not a hang
                return future.result()
            self._abandon(future)
            raise StageTimeout(
                f"the {self.name} model call did not return within {self.call_timeout_s:g} s"
            ) from None

    def _abandon(self, future: asyncio.Future[object]) -> None:
        """Leave the hung call's thread behind; later calls get a fresh one."""
        future.add_done_callback(_drop_result)
        stuck, self._pool = (
            self._pool,
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.thread_name),
        )
        stuck.shutdown(wait=False, cancel_futures=True)
        self.abandoned += 1
        if self._on_timeout is not None:
            self._on_timeout(self.name, self.call_timeout_s)

    async def run_timed(self, fn: Callable[..., T], /, *args: object) -> Timed[T]:
        """Like `run`, and say when the call started and finished (the stage's busy time)."""
        return await self.run(self._timed, fn, args)

    def _timed(self, fn: Callable[..., T], args: tuple[object, ...]) -> Timed[T]:
        started_s = self._clock()
        result = fn(*args)
        return Timed(result, started_s, self._clock())

    async def aclose(self) -> None:
        """Refuse new calls, wait (without blocking the loop) for the calls in flight."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        # The one worker runs calls in order: once this no-op ran, every earlier call ended.
        try:
            await asyncio.shield(loop.run_in_executor(self._pool, _noop))
        finally:
            # cancelled while waiting: the worker still ends after the calls in flight
            self._pool.shutdown(wait=not _cancelling())


def _noop() -> None:
    return None


def _drop_result(future: asyncio.Future[object]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: no "exception was never retrieved" warning


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0

"""The engine on a virtual clock: an event loop whose time jumps to its next timer when
every task waits, and stage executors that run a model call inline and then stay busy
for the call's cost in virtual time.

With the sim backend's injectable `sleep` as the cost (`SpentTime`), the Engine makes
the same decisions in the same order on every run, whatever the machine does meanwhile:
tests/test_engine_vs_simulator.py compares them with the simulator's, and
`python -m benchmarks.engine_overhead --virtual` times the engine's own work over the
same states each run.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from collections.abc import Callable, Iterator

import pipeline.engine
from pipeline.executor import StageClosed, Timed


class _VirtualSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Polls the loop's own descriptors; instead of blocking, moves the clock on."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("virtual time: every task waits and no timer is set")
        self._loop.advance()
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose time() is virtual and jumps to the next timer when idle."""

    def __init__(self) -> None:
        self.virtual_s = 0.0
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self.virtual_s

    def advance(self) -> None:
        # Exactly to the next timer's time (the loop dropped cancelled ones from the head),
        # so that virtual times add up as the simulator's do.
        timers = self._scheduled  # type: ignore[attr-defined]
        if timers:
            self.virtual_s = max(self.virtual_s, timers[0].when())


class SpentTime:
    """The sim backend's `sleep`: what the call in progress costs."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self, seconds: float) -> None:
        self.seconds += seconds

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


class VirtualStage:
    """A StageExecutor stand-in: the call runs inline, then the stage stays busy for the
    call's cost in virtual time (the other stage runs meanwhile)."""

    def __init__(self, name: str, *, clock: Callable[[], float], spent: SpentTime) -> None:
        self.name = name
        self._clock = clock
        self._spent = spent
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def in_stage_thread(self) -> bool:
        return True

    async def run(self, fn: Callable[..., object], /, *args: object) -> object:
        return (await self.run_timed(fn, *args)).result

    async def run_timed(self, fn: Callable[..., object], /, *args: object) -> Timed[object]:
        if self._closed:
            raise StageClosed(f"the {self.name} stage is closed")
        started_s = self._clock()
        self._spent.take()
        result = fn(*args)
        cost_s = self._spent.take()
        if cost_s > 0:
            await asyncio.sleep(cost_s)
        return Timed(result, started_s, self._clock())

    async def aclose(self) -> None:
        self._closed = True


@contextlib.contextmanager
def virtual_stages(spent: SpentTime) -> Iterator[None]:
    """Engines built inside run their stages as VirtualStages (on the engine's clock)."""
    real = pipeline.engine.StageExecutor
    pipeline.engine.StageExecutor = (  # type: ignore[misc,assignment]
        lambda name, clock, **_: VirtualStage(name, clock=clock, spent=spent)
    )
    try:
        yield
    finally:
        pipeline.engine.StageExecutor = real  # type: ignore[misc]

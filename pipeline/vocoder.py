"""The vocoder's driver: runs the vocoder core's plans (pipeline/vocoder_core.py).

Each worker's loop asks the core for a plan (the chunks PlaybackScheduler selects, at
most K), runs `backend.vocode` on its own stage executor (a thread), and hands the PCM
back to the core, which sends it in order on each stream's audio channel. With nothing to
do the worker waits on the wake event the book sets whenever a stream's chunk plan may
have changed.

Workers (`vocoder.workers`): W such loops take turns side by side where the backend's
vocode calls may overlap (`capabilities.concurrent_vocode_calls`: Piper's ONNX Runtime
session, not the codec LM's). The rate (the capacity model, pipeline/capacity.py) is fed
each call's own time and audio, with the workers' count.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from pipeline.backend import Backend, VocodeItem
from pipeline.capacity import CapacityEstimate
from pipeline.events import EngineEvents, TurnTiming
from pipeline.executor import StageExecutor
from pipeline.vocoder_core import VocoderCore


class Vocoder:
    """The vocoder workers over the vocoder core; see the module doc."""

    def __init__(
        self,
        core: VocoderCore,
        backend: Backend,
        stage: StageExecutor,
        *,
        clock: Callable[[], float],
        events: EngineEvents,
        capacity_window_s: float,
        capacity: Callable[[float], float] | None = None,
        extra_stages: Sequence[StageExecutor] = (),
        cost: Callable[[str], float] | None = None,
    ) -> None:
        """`capacity(now_s)`: the pipeline's capacity, reported after each turn.
        `extra_stages`: more workers' threads, for a backend whose vocode calls may run
        side by side. `cost(voice_id)`: a voice's cost against the reference voice's
        (scheduling/voice_cost.py): a turn's audio is recorded in reference seconds."""
        self._core = core
        self._cost = cost
        self._backend = backend
        self._capacity = capacity
        self._stages = (stage, *extra_stages)
        self._clock = clock
        self._events = events
        self.wake = asyncio.Event()
        self.rate = CapacityEstimate(capacity_window_s, workers=len(self._stages))
        self.idle_waits = 0  # times a worker found nothing to do and waited

    @property
    def turns(self) -> int:
        return self._core.turns

    @property
    def yields(self) -> int:
        return self._core.yields

    def _weight(self, items: Sequence[VocodeItem]) -> float:
        """The turn's cost per audio second against the reference voice's: its items'
        mean (a turn is one stream at K = 1)."""
        cost = self._cost
        if cost is None or not items:
            return 1.0
        return sum(cost(item.voice) for item in items) / len(items)

    async def run(self) -> None:
        if len(self._stages) == 1:
            await self._worker(self._stages[0])
            return
        async with asyncio.TaskGroup() as workers:
            for index, stage in enumerate(self._stages):
                workers.create_task(self._worker(stage), name=f"playhead-vocoder-{index}")

    async def _worker(self, stage: StageExecutor) -> None:
        """One worker's loop. The wake event is shared: each loop clears it and then
        asks the core without yielding, so no wake is lost between them."""
        core, clock, vocode = self._core, self._clock, self._backend.vocode
        while True:
            self.wake.clear()
            started_perf_s = time.perf_counter()
            started_cpu_s = time.thread_time()
            plan = core.schedule(clock())
            if plan is None:
                self.idle_waits += 1
                await self.wake.wait()
                continue
            sent_perf_s = time.perf_counter()
            sent_cpu_s = time.thread_time()
            try:
                timed = await stage.run_timed(vocode, plan.items, plan.abort)
            except Exception as error:  # CancelledError (a BaseException) passes through
                core.update(plan, error, clock())
                continue
            returned_perf_s = time.perf_counter()
            returned_cpu_s = time.thread_time()
            emitted_at_s = clock()
            audio_s = core.update(plan, timed.result, emitted_at_s)
            # the call's own cost (pipeline/capacity.py), whatever the other workers did
            self.rate.record(timed.started_s, timed.finished_s, audio_s * self._weight(plan.items))
            ended_perf_s = time.perf_counter()
            ended_cpu_s = time.thread_time()
            self._events.vocoder_turn(len(plan.batch), clock() - plan.started_s)
            if self._capacity is not None:
                self._events.capacity(self._capacity(emitted_at_s))
            self._events.turn_timing(
                TurnTiming(
                    batch_size=len(plan.batch),
                    wall_s=ended_perf_s - started_perf_s,
                    model_s=timed.seconds,
                    engine_s=(sent_perf_s - started_perf_s) + (ended_perf_s - returned_perf_s),
                    engine_cpu_s=(sent_cpu_s - started_cpu_s) + (ended_cpu_s - returned_cpu_s),
                ),
            )

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

The urgent lane (`vocoder.urgent_lane`, pipeline/vocoder_core.py): one more loop, on its
own stage at normal OS priority, that asks the core for urgent chunks only; the workers'
stages then run at `vocoder.bulk_nice`. It is not a worker of the capacity model (its
calls are recorded, its thread is not counted: it takes the cores from the workers, it
adds none). With nothing urgent it sleeps until a wake or until a ready stream's slack
falls to the lane's limit.
"""

from __future__ import annotations

import asyncio
import contextlib
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
        lane_stage: StageExecutor | None = None,
    ) -> None:
        """`capacity(now_s)`: the pipeline's capacity, reported after each turn.
        `extra_stages`: more workers' threads, for a backend whose vocode calls may run
        side by side. `cost(voice_id)`: a voice's cost against the reference voice's
        (scheduling/voice_cost.py): a turn's audio is recorded in reference seconds.
        `lane_stage`: the urgent lane's thread (module doc)."""
        self._core = core
        self._cost = cost
        self._backend = backend
        self._capacity = capacity
        self._stages = (stage, *extra_stages)
        self._lane_stage = lane_stage
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
        if len(self._stages) == 1 and self._lane_stage is None:
            await self._worker(self._stages[0])
            return
        async with asyncio.TaskGroup() as workers:
            for index, stage in enumerate(self._stages):
                workers.create_task(self._worker(stage), name=f"playhead-vocoder-{index}")
            if self._lane_stage is not None:
                workers.create_task(
                    self._worker(self._lane_stage, lane=True), name="playhead-vocoder-urgent"
                )

    async def _worker(self, stage: StageExecutor, *, lane: bool = False) -> None:
        """One worker's loop. The wake event is shared: each loop clears it and then
        asks the core without yielding, so no wake is lost between them."""
        core, clock, vocode = self._core, self._clock, self._backend.vocode
        while True:
            self.wake.clear()
            started_perf_s = time.perf_counter()
            started_cpu_s = time.thread_time()
            plan = core.schedule(clock(), lane=True) if lane else core.schedule(clock())
            if plan is None:
                self.idle_waits += 1
                wait_s = core.lane_wait_s(clock()) if lane else None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
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

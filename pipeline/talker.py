"""The talker's driver: runs the talker core's plans (pipeline/talker_core.py) in a thread.

Each turn of the loop asks the core for a plan, runs `run_talk` on the talker's stage
executor (its thread), and hands the outcome back to the core; with nothing to do it
waits on its wake event (set by the book on new text, a first audio, an ack, an unpark,
a cancel), or until the first stream held back by the high-water mark falls under it.

A backend whose steps may run side by side (`capabilities.concurrent_talker_steps`, with
`talker.urgent_lane`) gets a second lane with its own thread: while the first lane is
busy, the second takes the urgent streams (`urgent_only` plans: no audio yet, or less than
`talker.urgent_slack_s` of it ahead), so neither a newcomer nor a player close to running
dry waits behind another stream's long step.

A call that hangs past `engine.call_timeout_s` fails the streams of its batch
(pipeline/executor.py); its segments stay with the abandoned call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Future

from pipeline.backend import Backend, TalkRequest
from pipeline.capacity import CapacityEstimate
from pipeline.events import EngineEvents
from pipeline.executor import StageExecutor
from pipeline.talker_core import TalkerCore, TalkOutcome, TalkPlan, run_talk

log = logging.getLogger("playhead.engine")


class Talker:
    """The talker loop over the talker core; see the module doc."""

    def __init__(
        self,
        core: TalkerCore,
        backend: Backend,
        stage: StageExecutor,
        *,
        clock: Callable[[], float],
        events: EngineEvents,
        capacity_window_s: float,
        urgent_stage: StageExecutor | None = None,
        cost: Callable[[str], float] | None = None,
    ) -> None:
        """`cost(voice_id)`: a voice's cost against the reference voice's
        (scheduling/voice_cost.py): a step's audio is recorded in reference seconds."""
        self._core = core
        self._cost = cost
        self._backend = backend
        self._stage = stage
        self._urgent_stage = urgent_stage
        self._clock = clock
        self._events = events
        self.wake = asyncio.Event()
        self.rate = CapacityEstimate(capacity_window_s)
        self.urgent_steps = 0  # talker calls run by the second lane
        self.idle_waits = 0  # times the loop found nothing to do and waited
        self.lanes_busy = 0  # talker calls running now
        self.prepare_drops = 0  # times prepared segments were dropped (more streams came)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def steps(self) -> int:
        return self._core.steps

    async def run(self) -> None:
        core = self._core
        self._loop = asyncio.get_running_loop()
        async with asyncio.TaskGroup() as lanes:
            main: asyncio.Task[None] | None = None
            urgent: asyncio.Task[None] | None = None
            while True:
                self.wake.clear()
                if core.drop_prepared_due():
                    self._drop_prepared()
                now_s = self._clock()
                retry_in_s: float | None = None
                if main is None or main.done():
                    plan = core.schedule(now_s)
                    if plan is not None:
                        self.lanes_busy += 1
                        main = lanes.create_task(self._lane(self._stage, plan))
                        continue
                    retry_in_s = core.retry_in_s
                elif self._urgent_stage is not None and (urgent is None or urgent.done()):
                    plan = core.schedule(now_s, urgent_only=True)
                    if plan is not None:
                        self.urgent_steps += 1
                        self.lanes_busy += 1
                        urgent = lanes.create_task(self._lane(self._urgent_stage, plan))
                        continue
                if main is None or main.done():
                    self.idle_waits += 1  # nothing to do at all (not just a lane busy)
                if retry_in_s is None:
                    await self.wake.wait()
                else:  # a stream above the high-water mark falls back under it by then
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(retry_in_s, 0.0)):
                            await self.wake.wait()

    def _weight(self, plan: TalkPlan) -> float:
        """The step's cost per audio second against the reference voice's: its
        segments' mean (one segment at talker.batch = 1)."""
        cost = self._cost
        if cost is None or not plan.batch:
            return 1.0
        return sum(cost(open_.request.voice) for open_ in plan.batch) / len(plan.batch)

    async def _lane(self, stage: StageExecutor, plan: TalkPlan) -> None:
        core = self._core
        try:
            timed = await stage.run_timed(run_talk, self._backend, plan, self._watch_prepare)
        except asyncio.CancelledError:  # the engine stops: its segments are closed then
            core.abandon(plan)
            raise
        except Exception as error:  # the call hung (StageTimeout): its streams fail
            core.update(plan, TalkOutcome(hung=error), self._clock())
        else:
            audio_s = core.update(plan, timed.result, self._clock())
            if timed.result.stepped:
                weight = self._weight(plan)
                self.rate.record(timed.started_s, timed.finished_s, audio_s * weight)
                self._events.talker_call(timed.seconds)
        finally:
            self.lanes_busy -= 1
            self.wake.set()  # the lane is free: plan again

    async def close_left(self) -> None:
        """After a stop: close the segments whose streams ended, in the talker's thread
        (after any call still running there)."""
        plan = self._core.leftovers()
        if plan is not None:
            with contextlib.suppress(Exception):
                await self._stage.run_timed(run_talk, self._backend, plan, self._watch_prepare)

    def _watch_prepare(
        self, stream_id: str, request: TalkRequest, done: Future[object] | None
    ) -> None:
        """Talker thread: book the preparation's end on the event loop once `done` is
        (at once without a future: nothing was started)."""
        loop = self._loop
        assert loop is not None, "the talker runs"
        core = self._core
        index = request.segment_index

        def ended(_: object = None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing to book
                loop.call_soon_threadsafe(core.prepare_ended, stream_id, index)

        if done is None:
            ended()
        else:
            done.add_done_callback(ended)

    def _drop_prepared(self) -> None:
        """The stream is no longer alone: the backend gives up what it prepares (its helper
        thread would take a core from the stage threads). Not a model call: it sets a flag
        and returns."""
        self.prepare_drops += 1
        try:
            self._backend.drop_prepared()
        except Exception:
            log.exception("drop_prepared failed")

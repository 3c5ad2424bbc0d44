"""Engine time per vocoder turn outside the model call, on the sim backend at zero cost.

Closed loop: N clients each submit a corpus text, read it to the end as fast as they can,
and submit the next. The vocoder costs nothing (base 0, per frame 0) and the talker is
very fast, so what is left of a turn is the engine's own cost. Per decoding turn
(the engine's `turn_timing` events):

- outside_model: the turn's wall time (scan, select, build, the hop to the vocoder
  thread and back, bookkeeping) minus the time inside backend.vocode; it also holds
  whatever else the event loop ran meanwhile (consumers, talker pieces);
- engine_sync: the engine's own synchronous work alone (re-plan the streams that changed +
  select + build before the call, bookkeeping after it);
- talker_plan: the talker's choice of the next step's streams (the book's TalkerQueue);
- engine ms/turn: engine_sync and talker_plan summed over the run, per decoding turn, in
  wall time and in the event loop thread's CPU time (`time.thread_time`). Wall time also
  counts whatever preempted the thread (the other stage threads, other processes on a
  shared machine, which moved it by up to 1.7x between identical runs here); CPU time is
  the engine's own work, plus any garbage collection that ran inside it;
- gc ms/s, full: the time the garbage collector ran per second of the window (in any
  thread, wherever it landed), and how many of its collections were full ones. At 10,000
  streams a full collection takes about 200 ms and lands inside engine work or not by
  chance: `--no-gc` turns the collector off for the run to see the work alone.
  `--freeze` freezes the heap alive once the engine has started (gc.freeze), as `playhead
  serve` does once its model is loaded (`server.freeze_heap_after_load`). It is off here:
  this process's startup heap is small (about 38,000 objects against the server's 81,000
  with the Piper voice), and with less of the heap counted as old a full collection comes
  sooner (the collector runs one once the objects promoted since the last exceed a quarter
  of the old ones): at 10,000 streams 5 of 8 three-second windows held one with it, 0 of
  6 without.

`--virtual` runs the same closed loop on a virtual clock (benchmarks/virtual_time.py): the
stages' calls run inline on the event loop's thread and cost virtual time (the talker
4 ms + 0.1 ms per stream per step, the vocoder 5 ms per turn, so that turns come about
as often as in the real run at 10,000 streams and the window sees the same mix of first
and later chunks), and the engine makes the same decisions on every run: the same turns,
talker plans and chunks, whatever the machine does meanwhile. Only its CPU time per turn
then varies, with the machine's own speed (here 6-10% between identical runs, also two
runs side by side on the two cores), so a change to the engine's hot path can be
profiled over exactly the same states before and after. Only the engine's CPU per turn
is printed: wall times on a virtual clock mean nothing.

`--warmup` (default 1 s) is how long the clients run before the measured window. Every
client starts at once, so at 10,000 streams the default window sees the arrival of them
all: in 4 s the engine sends about one chunk per stream, nearly every one a stream's
first (its first audio moves it between the deadline indexes and the talker queue's
lists, and wakes the talker). A stream's later chunks cost less; `--warmup 30` measures
the steady state, once most streams have played several chunks and some have ended and
been replaced.

    python -m benchmarks.engine_overhead [--streams 10 100] [--window 16] [--seconds 3]
        [--warmup 1] [--no-gc] [--freeze] [--virtual]

Target: engine work (engine_sync + talker_plan) at most 1 ms per turn at 10,000 streams.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import random
import statistics
import time
from collections.abc import Callable

from benchmarks.loadgen import load_corpus
from benchmarks.virtual_time import SpentTime, VirtualTimeLoop, virtual_stages
from pipeline.backends.sim import SimBackend
from pipeline.config import EngineConfig, SimConfig, TalkerConfig
from pipeline.engine import Engine
from pipeline.events import NullEvents, TurnTiming
from pipeline.load import Load
from scheduling import (
    AdmissionConfig,
    ChunkingConfig,
    SchedulingConfig,
    TalkerPlan,
)

ZERO_COST_SIM = SimConfig(
    talker_frames_per_step=64,  # a segment (tens of frames) arrives in one step
    talker_step_base_ms=0.0,
    talker_step_per_stream_ms=0.0,
    vocoder_base_ms=0.0,
    vocoder_per_frame_ms=0.0,
)
# --virtual: model calls cost virtual time (see the module doc)
VIRTUAL_SIM = SimConfig(
    talker_frames_per_step=64,
    talker_step_base_ms=4.0,
    talker_step_per_stream_ms=0.1,
    vocoder_base_ms=5.0,
    vocoder_per_frame_ms=0.0,
)
CHUNKING = ChunkingConfig(chunk_frames=8, ramp=(2, 4))


def _quantile_ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000.0 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class _TurnRecorder(NullEvents):
    def __init__(self) -> None:
        self.turns: list[TurnTiming] | None = None

    def turn_timing(self, timing: TurnTiming) -> None:
        if self.turns is not None:
            self.turns.append(timing)


class _CollectorClock:
    """Time spent in garbage collections while `on` (gc.callbacks)."""

    def __init__(self) -> None:
        self.on = False
        self.seconds = 0.0
        self.full = 0
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            if self.on:
                self.seconds += time.perf_counter() - self._started
                self.full += info["generation"] == 2
            self._started = None


def _engine(
    backend: SimBackend,
    window: int,
    recorder: _TurnRecorder,
    clock: Callable[[], float] = time.monotonic,
) -> Engine:
    return Engine(
        backend,
        scheduling=SchedulingConfig(policy="edf", active_stream_window=window),
        chunking=CHUNKING,
        admission=AdmissionConfig(enabled=False),
        engine=EngineConfig(max_pending_audio_s=1e6),
        # no real-time pacing: zero cost throughout; a batched talker
        talker=TalkerConfig(high_water_s=1e6, batch=16, busy_max_queued_s=0),
        events=recorder,
        clock=clock,
    )


def _time_talker_plans(engine: Engine, recorder: _TurnRecorder) -> tuple[list[float], list[float]]:
    """Time the book's talker plans made while `recorder` records: (wall, CPU) seconds."""
    plans: list[float] = []
    plans_cpu: list[float] = []
    core = engine.book.talker
    plan_talker = core.plan

    def timed_plan(now_s: float, load: Load) -> TalkerPlan:
        started, started_cpu = time.perf_counter(), time.thread_time()
        plan = plan_talker(now_s, load)
        if recorder.turns is not None:
            plans.append(time.perf_counter() - started)
            plans_cpu.append(time.thread_time() - started_cpu)
        return plan

    core.plan = timed_plan  # type: ignore[method-assign]
    return plans, plans_cpu


def _clients(engine: Engine, streams: int, finished: list[int]) -> list[asyncio.Task[None]]:
    """`streams` closed-loop clients: each submits a corpus text, reads it as fast as it
    can, counts it in `finished[0]` and submits the next."""
    corpus = load_corpus()

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        while True:
            stream = engine.submit(rng.choice(corpus), voice="sim")
            async for _ in stream.chunks():
                pass
            finished[0] += 1

    return [asyncio.create_task(client(i)) for i in range(streams)]


async def measure(
    streams: int, window: int, seconds: float, warmup_s: float = 1.0, freeze_heap: bool = False
) -> dict:
    recorder = _TurnRecorder()
    engine = _engine(SimBackend(ZERO_COST_SIM), window, recorder)
    plans, plans_cpu = _time_talker_plans(engine, recorder)
    await engine.start()
    # as `playhead serve` does once its model is loaded (server.freeze_heap_after_load)
    if freeze_heap:
        gc.collect()
        gc.freeze()
    finished = [0]
    clients = _clients(engine, streams, finished)
    collector = _CollectorClock()
    gc.callbacks.append(collector)
    try:
        await asyncio.sleep(warmup_s)
        recorder.turns = []
        finished[0] = 0
        collector.on = True
        await asyncio.sleep(seconds)
        collector.on = False
        turns, recorder.turns = recorder.turns, None
    finally:
        gc.callbacks.remove(collector)
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
        await engine.stop()
        if freeze_heap:
            gc.unfreeze()
    outside = [t.wall_s - t.model_s for t in turns]
    sync = [t.engine_s for t in turns]
    return {
        "streams": streams,
        "window": window,
        "turns": len(turns),
        "turns_per_s": len(turns) / seconds,
        "mean_batch": statistics.fmean(t.batch_size for t in turns),
        "streams_finished_per_s": finished[0] / seconds,
        "outside_model_ms_p50": _quantile_ms(outside, 0.5),
        "outside_model_ms_p95": _quantile_ms(outside, 0.95),
        "engine_sync_ms_p50": _quantile_ms(sync, 0.5),
        "engine_sync_ms_p95": _quantile_ms(sync, 0.95),
        "model_ms_p50": _quantile_ms([t.model_s for t in turns], 0.5),
        "talker_plans": len(plans),
        # all of the engine's synchronous work (turns and talker plans) over the turns
        "engine_ms_per_turn": 1000.0 * (sum(sync) + sum(plans)) / len(turns),
        "engine_cpu_ms_per_turn": 1000.0
        * (sum(t.engine_cpu_s for t in turns) + sum(plans_cpu))
        / len(turns),
        "talker_plan_ms_p50": _quantile_ms(plans, 0.5) if plans else None,
        "talker_plan_ms_p95": _quantile_ms(plans, 0.95) if plans else None,
        "gc_ms_per_s": 1000.0 * collector.seconds / seconds,
        "gc_full_collections": collector.full,
    }


def measure_virtual(streams: int, window: int, seconds: float, warmup_s: float = 1.0) -> dict:
    """The closed loop of `measure` on a virtual clock (see the module doc): the engine's
    CPU time per turn over the same turns every run."""
    loop = VirtualTimeLoop()
    spent = SpentTime()
    ticks = itertools.count()

    def clock() -> float:
        # distinct readings, as a real clock's: streams submitted at one virtual instant
        # would otherwise share a first-audio deadline (one tie group of thousands)
        return loop.time() + next(ticks) * 1e-12

    async def run() -> dict:
        recorder = _TurnRecorder()
        engine = _engine(SimBackend(VIRTUAL_SIM, sleep=spent), window, recorder, clock=clock)
        _, plans_cpu = _time_talker_plans(engine, recorder)
        await engine.start()
        clients = _clients(engine, streams, [0])
        try:
            await asyncio.sleep(warmup_s)
            recorder.turns = []
            await asyncio.sleep(seconds)
            turns, recorder.turns = recorder.turns, None
        finally:
            for task in clients:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
            await engine.stop()
        return {
            "streams": streams,
            "window": window,
            "turns": len(turns),
            "chunks": sum(t.batch_size for t in turns),
            "talker_plans": len(plans_cpu),
            "engine_cpu_ms_per_turn": 1000.0
            * (sum(t.engine_cpu_s for t in turns) + sum(plans_cpu))
            / len(turns),
            "talker_plan_cpu_ms_per_turn": 1000.0 * sum(plans_cpu) / len(turns),
        }

    with virtual_stages(spent):
        try:
            return loop.run_until_complete(run())
        finally:
            loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds before the measured window"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--no-gc", action="store_true", help="garbage collector off (the engine's work alone)"
    )
    parser.add_argument(
        "--freeze",
        action="store_true",
        help="freeze the heap once the engine has started, as `playhead serve` does",
    )
    parser.add_argument(
        "--virtual",
        action="store_true",
        help="on a virtual clock: the same engine states every run (engine CPU per turn only)",
    )
    args = parser.parse_args()
    if args.no_gc:
        gc.disable()
    if args.virtual:
        virtual = [measure_virtual(n, args.window, args.seconds, args.warmup) for n in args.streams]
        if args.json:
            print(json.dumps(virtual, indent=2))
            return
        print("virtual clock: streams  K  turns  chunks  talker plans  engine cpu ms/turn  (plan)")
        for r in virtual:
            print(
                f"{r['streams']:22d} {r['window']:2d} {r['turns']:6d} {r['chunks']:7d}"
                f" {r['talker_plans']:13d} {r['engine_cpu_ms_per_turn']:19.3f}"
                f"  ({r['talker_plan_cpu_ms_per_turn']:.3f})"
            )
        return
    results = [
        asyncio.run(measure(n, args.window, args.seconds, args.warmup, freeze_heap=args.freeze))
        for n in args.streams
    ]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        "streams  K  turns/s  batch  outside-model ms p50/p95  engine-sync ms p50/p95"
        "  talker-plan ms p50/p95  plans/turn  engine ms/turn wall / cpu  gc ms/s  full"
    )
    for r in results:
        print(
            f"{r['streams']:7d} {r['window']:2d} {r['turns_per_s']:8.0f} {r['mean_batch']:6.1f}"
            f"  {r['outside_model_ms_p50']:10.3f} / {r['outside_model_ms_p95']:.3f}"
            f"  {r['engine_sync_ms_p50']:12.3f} / {r['engine_sync_ms_p95']:.3f}"
            f"  {r['talker_plan_ms_p50'] or 0:12.3f} / {r['talker_plan_ms_p95'] or 0:.3f}"
            f"  {r['talker_plans'] / r['turns']:10.2f}  {r['engine_ms_per_turn']:14.3f}"
            f" / {r['engine_cpu_ms_per_turn']:.3f}"
            f"  {r['gc_ms_per_s']:7.1f}  {r['gc_full_collections']:4d}"
        )


if __name__ == "__main__":
    main()

"""A job beside live listeners on the Engine itself, in virtual time (the sim backend's
costs, configs/sim.yaml): does a feasible `finish_by` finish by its deadline, and do the
listeners stay stall-free, at a given live load?

The job comes first: due when it would be done at `job_share` of C (C: the engine's
calibrated capacity, audio s per s), checked by `check_finish_by` as the API checks it. It
is paced as app/jobs/runner.py paces it (`scheduling.jobs.job_rate` at each segment, from
the audio per character learned so far), each segment one engine stream
(`Engine.submit_job`), two in flight. Then a closed loop of round(f x C) listeners: each
submits a short corpus text, reads it at once (the server's virtual player plays it at
1x: its stalls are `StreamStats.stalls`) and sends its next one when its player would have
played the last (as benchmarks/player.py); admission is on (it counts the job's rate), and
a refused listener tries again 0.5 s later.

    python -m benchmarks.jobs_sim [--loads 0.3,0.9,1.5] [--job-chars 3000] [--job-share 0.3]

prints, per live load, the job's deadline, the finish predicted at its submission (at the
capacity then left) and the actual finish, and the listeners' stall-free share
(tests/test_jobs_engine_sim.py asserts them).
"""

from __future__ import annotations

import argparse
import asyncio
import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from app.jobs.text import cut_segments
from app.settings import Settings, load_settings
from benchmarks.jobs_render import corpus_text
from benchmarks.loadgen import load_corpus
from benchmarks.virtual_time import SpentTime, VirtualTimeLoop, virtual_stages
from pipeline.backends.sim import SimBackend
from pipeline.engine import Engine
from pipeline.errors import Rejected
from pipeline.stream import Stream
from scheduling.jobs import check_finish_by, job_rate, segment_pace

ROOT = Path(__file__).resolve().parent.parent
SIM_CONFIG = ROOT / "configs" / "sim.yaml"
SEGMENT_CHARS = 600
RETRY_S = 0.5
# the audio per character a runner assumes before its first segment (it then learns it)
FIRST_AUDIO_S_PER_CHAR = 0.065


@dataclass(frozen=True)
class JobRun:
    live_load: float  # listeners offered, as a share of C
    capacity: float  # C, audio s per s
    listeners: int
    live_streams: int  # listener streams that ended
    live_stalled: int  # of them, with at least one stall
    refused: int  # listener requests refused (429)
    job_audio_s: float
    submitted_s: float
    finish_by_s: float | None
    predicted_finish_s: float  # check_finish_by's at submission
    feasible: bool
    finished_s: float | None  # None: refused, or not done by the run's end

    @property
    def stall_free_share(self) -> float:
        return 1.0 - self.live_stalled / self.live_streams if self.live_streams else 1.0


def _segments(text: str) -> list[str]:
    """The job's segments as app/jobs/text.py cuts them."""
    return [text[segment.start : segment.end] for segment in cut_segments(text, SEGMENT_CHARS)]


async def _drain(stream: Stream) -> None:
    async for _ in stream.chunks():
        pass


async def _listener(
    engine: Engine, loop: VirtualTimeLoop, texts: list[str], index: int, end_s: float,
    streams: list[Stream], refused: list[int],
) -> None:  # fmt: skip
    await asyncio.sleep(0.05 * index)  # not all at one instant
    turn = index
    while loop.time() < end_s:
        try:
            stream = engine.submit(texts[turn % len(texts)], voice="sim")
        except Rejected:
            refused[0] += 1
            await asyncio.sleep(RETRY_S)
            continue
        turn += 7
        streams.append(stream)
        await _drain(stream)
        stats = stream.stats
        if stats.ttfa_s is not None:  # listen to the end of its audio, then ask again
            played_to_s = stats.submitted_at_s + stats.ttfa_s + stats.audio_s + stats.stall_s
            await asyncio.sleep(max(0.0, played_to_s - loop.time()))


async def _job(
    engine: Engine, loop: VirtualTimeLoop, segments: list[str], finish_by_s: float | None
) -> float:
    """Renders the segments as app/jobs/runner.py does; returns when the last one ended."""
    audio_s_per_char = FIRST_AUDIO_S_PER_CHAR
    chars_done, audio_done_s = 0, 0.0
    pending: deque[tuple[int, asyncio.Task[None], Stream]] = deque()
    horizon_s = loop.time()
    next_index = 0
    while next_index < len(segments) or pending:
        while len(pending) < 2 and next_index < len(segments):
            now_s = loop.time()
            chars_left = sum(len(s) for s in segments[next_index:])
            rate = job_rate(chars_left * audio_s_per_char, finish_by_s, now_s)
            rate, start_s = segment_pace(rate, horizon_s, now_s)
            if math.isfinite(start_s):
                horizon_s = start_s
            stream = engine.submit_job(
                segments[next_index], voice="sim", speed=1.0, horizon_s=start_s, rate=rate
            )
            pending.append((next_index, loop.create_task(_drain(stream)), stream))
            next_index += 1
        index, task, stream = pending.popleft()
        await task
        chars_done += len(segments[index])
        audio_done_s += stream.stats.audio_s
        audio_s_per_char = audio_done_s / chars_done
    return loop.time()


async def _run(
    settings: Settings, spent: SpentTime, loop: VirtualTimeLoop, live_load: float,
    job_chars: int, job_share: float | None, run_s: float,
) -> JobRun:  # fmt: skip
    engine = Engine(
        SimBackend(settings.sim, sleep=spent),
        scheduling=settings.scheduling,
        chunking=settings.chunking,
        admission=settings.admission,
        engine=settings.engine,
        talker=settings.talker,
        text=settings.text,
        vocoder=settings.vocoder,
        alone=settings.alone,
        clock=loop.time,
    )
    await engine.start()
    capacity = engine.capacity()
    n = max(1, round(live_load * capacity))
    texts = [t for t in load_corpus() if len(t) <= 150]
    segments = _segments(corpus_text(job_chars))
    job_audio_s = sum(len(s) for s in segments) * FIRST_AUDIO_S_PER_CHAR
    submitted_s = loop.time()
    # due when it would be at `job_share` of C (None: best effort); checked as the API
    # checks it, against the capacity left (the listeners come after it)
    finish_by_s = None if job_share is None else submitted_s + job_audio_s / (job_share * capacity)
    check = check_finish_by(
        audio_s=job_audio_s,
        finish_by_s=finish_by_s,
        now_s=submitted_s,
        capacity_audio_s_per_s=capacity,
        live_streams=0,
        promised_audio_s_per_s=0.0,
        headroom=settings.admission.capacity_headroom,
    )
    job = loop.create_task(_job(engine, loop, segments, finish_by_s)) if check.feasible else None
    end_s = submitted_s + run_s
    streams: list[Stream] = []
    refused = [0]
    listeners = [
        loop.create_task(_listener(engine, loop, texts, i, end_s, streams, refused))
        for i in range(n)
    ]
    finished_s = None if job is None else await job
    await asyncio.gather(*listeners)
    await engine.stop()
    ended = [s for s in streams if s.stats.finished_at_s is not None]
    return JobRun(
        live_load=live_load,
        capacity=capacity,
        listeners=n,
        live_streams=len(ended),
        live_stalled=sum(1 for s in ended if s.stats.stalls),
        refused=refused[0],
        job_audio_s=job_audio_s,
        submitted_s=submitted_s,
        finish_by_s=finish_by_s,
        predicted_finish_s=check.predicted_finish_s,
        feasible=check.feasible,
        finished_s=finished_s,
    )


def run_job_beside_listeners(
    live_load: float,
    *,
    job_chars: int = 3000,
    job_share: float | None = 0.3,
    run_s: float = 80.0,
    settings: Settings | None = None,
) -> JobRun:
    """One run in virtual time: one job, due when it would be at `job_share` x C (None:
    best effort), then listeners at `live_load` x C for `run_s`."""
    settings = settings or load_settings(SIM_CONFIG)
    loop = VirtualTimeLoop()
    spent = SpentTime()
    try:
        with virtual_stages(spent):
            return loop.run_until_complete(
                _run(settings, spent, loop, live_load, job_chars, job_share, run_s)
            )
    finally:
        loop.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.jobs_sim")
    parser.add_argument("--loads", default="0.3,0.9,1.5")
    parser.add_argument("--job-chars", type=int, default=3000)
    parser.add_argument("--job-share", type=float, default=0.3, help="its rate, share of C")
    parser.add_argument("--run-s", type=float, default=80.0)
    args = parser.parse_args(argv)
    print("| live load | C | listeners | job audio s | finish_by (s after submit) | predicted | "
          "actual | met | live stall-free | 429s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for load in (float(x) for x in args.loads.split(",")):
        r = run_job_beside_listeners(
            load, job_chars=args.job_chars, job_share=args.job_share, run_s=args.run_s
        )
        by = None if r.finish_by_s is None else r.finish_by_s - r.submitted_s
        predicted = r.predicted_finish_s - r.submitted_s
        actual = None if r.finished_s is None else r.finished_s - r.submitted_s
        met = r.finished_s is not None and (by is None or actual <= by)  # type: ignore[operator]
        print(
            f"| {load:g} C | {r.capacity:.2f} | {r.listeners} | {r.job_audio_s:.0f} "
            f"| {'-' if by is None else f'{by:.1f}'} | {predicted:.1f} "
            f"| {'refused' if not r.feasible else '-' if actual is None else f'{actual:.1f}'} "
            f"| {'yes' if met else 'no'} | {100 * r.stall_free_share:.1f}% of "
            f"{r.live_streams} | {r.refused} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

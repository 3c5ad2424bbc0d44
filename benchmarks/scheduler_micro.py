"""Micro benchmark of PlaybackScheduler.select() with many ready streams.

Run: python benchmarks/scheduler_micro.py [--streams 10000] [--calls 300]

A scheduler holds N streams in a mix the engine sees under load: 30% still waiting for
their first audio (first seen over the last 0.5 s), 60% with horizons spread 0.1-10 s
ahead, 10% about to run dry or already dry (protected under edf). Each call advances the
clock by 10 ms, times select(), then records a 0.2 s chunk for every chosen stream (the
vocoder turn), so horizons move as in a run. Prints the median and p90 of select() in ms.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduling import PlaybackScheduler, SchedulingConfig

SAMPLE_RATE_HZ = 22050
CHUNK_SAMPLES = 4410  # 0.2 s per emitted chunk
START_S = 1000.0
STEP_S = 0.01  # clock advance per call


def build(config: SchedulingConfig, streams: int, seed: int) -> tuple[PlaybackScheduler, list[str]]:
    rng = random.Random(seed)
    scheduler = PlaybackScheduler(config)
    ids = [f"s{i:06d}" for i in range(streams)]
    for stream_id in ids:
        kind = rng.random()
        if kind < 0.3:  # no audio yet
            scheduler.admit(stream_id, START_S - rng.uniform(0, 0.5))
        elif kind < 0.9:  # buffered 0.1-10 s ahead
            duration_s = rng.uniform(0.1, 10.0)
            scheduler.record_audio(
                stream_id, round(duration_s * SAMPLE_RATE_HZ), SAMPLE_RATE_HZ, START_S
            )
        else:  # protected: within the safety margin of running dry, or dry already
            emitted_at_s = START_S - rng.uniform(0, 1.0)
            duration_s = rng.uniform(0.01, START_S + 0.04 - emitted_at_s)
            scheduler.record_audio(
                stream_id, round(duration_s * SAMPLE_RATE_HZ), SAMPLE_RATE_HZ, emitted_at_s
            )
    return scheduler, ids


def measure(
    config: SchedulingConfig,
    streams: int,
    ready_share: float,
    calls: int,
    as_keys: bool = False,
    seed: int = 1,
) -> tuple[float, float]:
    scheduler, ids = build(config, streams, seed)
    rng = random.Random(seed + 1)
    ready_list = [s for s in ids if rng.random() < ready_share] if ready_share < 1 else ids
    ready_ids = dict.fromkeys(ready_list).keys() if as_keys else ready_list
    timings_s = []
    for call in range(calls):
        now_s = START_S + call * STEP_S
        started = time.perf_counter()
        chosen = scheduler.select(now_s, ready_ids)
        timings_s.append(time.perf_counter() - started)
        for stream_id in chosen:
            scheduler.record_audio(stream_id, CHUNK_SAMPLES, SAMPLE_RATE_HZ, now_s)
    timings_s.sort()
    return statistics.median(timings_s) * 1e3, timings_s[int(0.9 * len(timings_s))] * 1e3


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.platform()}; {model}; {os.cpu_count()} cores; "
        f"Python {platform.python_version()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()

    cases = [  # policy, K, share of the streams ready, ready_ids as dict keys
        ("edf", 16, 1.0, False),
        ("edf", 2, 1.0, False),
        ("edf", 16, 0.5, False),
        ("edf", 16, 1.0, True),
        ("fifo", 16, 1.0, False),
        ("fifo", 0, 1.0, False),
    ]
    print(f"# scheduler_micro  {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"# {machine()}")
    print(f"# {args.streams} known streams, {args.calls} select() calls per row\n")
    print("| policy | K | ready | ready_ids | median ms | p90 ms |")
    print("|---|---:|---:|---|---:|---:|")
    for policy, window, ready_share, as_keys in cases:
        config = SchedulingConfig(policy=policy, active_stream_window=window)
        # K = 0 hands every stream a 0.2 s chunk per call: fewer calls keep the run short.
        calls = args.calls if window else max(20, args.calls // 10)
        median_ms, p90_ms = measure(config, args.streams, ready_share, calls, as_keys)
        ready = round(args.streams * ready_share)
        kind = "dict keys" if as_keys else "list"
        print(f"| {policy} | {window} | {ready} | {kind} | {median_ms:.3f} | {p90_ms:.3f} |")


if __name__ == "__main__":
    main()

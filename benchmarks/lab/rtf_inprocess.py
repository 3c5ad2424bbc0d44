"""Single-request RTF and TTFA of two engine settings in one process, interleaved.

    python -m benchmarks.lab.rtf_inprocess [--texts mixed|short|long] [--rounds 3]
        [--set section.field=value ...] [--a ...] [--b ...]

One Piper backend (configs/default.yaml plus --set; no calibration, no admission), two
engines over it: A (default `alone.work_ahead=false`) and B (the config's own),
each with --set plus its own --a / --b settings (engine-side sections only: the backend
is shared). Each round sends every text to both
engines, one request at a time, read as fast as possible (the order alternates by round):
RTF = wall / audio, TTFA = first PCM chunk - submit, CPU = this process's CPU time per
audio second. Each request also records the cores other processes used meanwhile
(/proc/stat busy time less this process's CPU, over the wall time): on a shared host the
"quiet" figures keep only requests (pairs, for the ratio) during which other processes
used under 0.15 of a core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from app.settings import load_settings
from benchmarks.voice import CONFIG, LONG_FIRST, SHORT_FIRST
from pipeline import Engine
from pipeline.backend import Voice
from pipeline.backends import build_backend

QUIET_FOREIGN_CORES = 0.15
_HZ = os.sysconf("SC_CLK_TCK")


def _busy_s() -> float:
    """CPU seconds every process on the host has used (all cores, /proc/stat)."""
    with open("/proc/stat", encoding="ascii") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    return (sum(values) - values[3] - values[4]) / _HZ


async def _one(engine: Engine, text: str, voice: Voice) -> dict[str, float]:
    busy0, cpu0, t0 = _busy_s(), time.process_time(), time.perf_counter()
    stream = engine.submit(text, voice=voice.id)
    first_s, samples = 0.0, 0
    async for pcm in stream.chunks():
        if not samples:
            first_s = time.perf_counter() - t0
        samples += pcm.size
    wall_s = time.perf_counter() - t0
    cpu_s = time.process_time() - cpu0
    audio_s = samples / voice.sample_rate_hz
    return {
        "rtf": wall_s / audio_s,
        "cpu": cpu_s / audio_s,
        "ttfa_ms": 1000.0 * first_s,
        "foreign": max(0.0, _busy_s() - busy0 - cpu_s) / wall_s,
    }


def _median(rows: Sequence[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows) if rows else float("nan")


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    base = ["engine.calibration_calls=0", "admission.enabled=false", *args.set]
    s = load_settings(CONFIG, base)
    backend = build_backend(s.backend, s.backend_config(), talker=s.talker, vocoder=s.vocoder)
    voice = backend.voices()[0]
    engines: dict[bool, Engine] = {}
    for ahead, extra in ((False, args.a or ["alone.work_ahead=false"]), (True, args.b)):
        e = load_settings(CONFIG, [*base, *extra])
        engines[ahead] = Engine(
            backend,
            scheduling=e.scheduling,
            chunking=e.chunking,
            admission=e.admission,
            engine=e.engine,
            talker=e.talker,
            text=e.text,
            vocoder=e.vocoder,
            alone=e.alone,
        )
        await engines[ahead].start()
    texts = {
        "short": SHORT_FIRST,
        "long": (" ".join(LONG_FIRST),),
        "mixed": (*SHORT_FIRST, *LONG_FIRST),
    }[args.texts]
    try:
        for engine in engines.values():
            await _one(engine, texts[0], voice)  # warm
        rows: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        pairs: list[tuple[float, float]] = []  # (B / A RTF, the pair's most foreign)
        for index in range(args.rounds):
            for text in texts:
                got = {}
                for ahead in (False, True) if index % 2 == 0 else (True, False):
                    got[ahead] = await _one(engines[ahead], text, voice)
                    rows[ahead].append(got[ahead])
                pairs.append(
                    (
                        got[True]["rtf"] / got[False]["rtf"],
                        max(got[True]["foreign"], got[False]["foreign"]),
                    )
                )
    finally:
        for engine in engines.values():
            await engine.stop()
        backend.close()
    result: dict[str, Any] = {}
    for ahead, name in ((False, "a"), (True, "b")):
        quiet = [r for r in rows[ahead] if r["foreign"] < QUIET_FOREIGN_CORES]
        result[name] = {
            "requests": len(rows[ahead]),
            "rtf_p50": _median(rows[ahead], "rtf"),
            "ttfa_p50_ms": _median(rows[ahead], "ttfa_ms"),
            "cpu_per_audio_s": _median(rows[ahead], "cpu"),
            "foreign_cores_p50": _median(rows[ahead], "foreign"),
            "quiet_requests": len(quiet),
            "quiet_rtf_p50": _median(quiet, "rtf"),
            "quiet_ttfa_p50_ms": _median(quiet, "ttfa_ms"),
        }
    quiet_pairs = [ratio for ratio, foreign in pairs if foreign < QUIET_FOREIGN_CORES]
    result["paired_ratio_p50"] = statistics.median(ratio for ratio, _ in pairs)
    result["quiet_pairs"] = len(quiet_pairs)
    result["quiet_paired_ratio_p50"] = (
        statistics.median(quiet_pairs) if quiet_pairs else float("nan")
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.lab.rtf_inprocess", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--texts", choices=("mixed", "short", "long"), default="mixed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], help="section.field=value")
    parser.add_argument("--a", action="append", default=[], help="A's own settings")
    parser.add_argument("--b", action="append", default=[], help="B's own settings")
    args = parser.parse_args(argv)
    result = asyncio.run(_run(args))
    for key, value in result.items():
        if isinstance(value, dict):
            print(key, " ".join(f"{k}={v:.4g}" for k, v in value.items()))
        else:
            print(key, f"{value:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Admission over capacity, run after run: the served config at 1.5 C and 2 C offered.

Each run measures C on this machine now (closed-loop clients that send their next request
at the last byte, admission off; the larger of fifo without a window and edf with the
config's window, as `make bench-voice` does), then serves the config as it is (admission
on) to closed loops of round(f x C) listeners for each factor f. A listener plays its
stream at 1x (benchmarks/player.py), sends its next request when it has heard the last one,
and after a 429 waits its Retry-After and sends again. Per point: listeners playing on
average (time-averaged players between first audio and the end of playback) as a share
of C, the stall-free share of the accepted streams and their interruptions (>= 150 ms),
TTFA p99 from the first try (the time being refused and queued included) and the 429s.

The targets (issue #35): at least 0.9 C playing, 100% of accepted streams stall-free,
TTFA p99 at most 1 s, in every run.

    python -m benchmarks.admission_runs [--config configs/default.yaml] [--runs 5]
        [--factors 1.5,2] [--duration 20] [--set admission.start_cost=3]

Writes benchmarks/results/admission-<config>-<UTC>.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from app.settings import load_settings
from benchmarks.bench import (
    RESULTS_DIR,
    ROOT,
    LoadPlan,
    Policy,
    config_name,
    machine,
    measure_capacity,
    number_list,
    run_load,
    run_row,
    serve,
)
from benchmarks.loadgen import RequestOptions, load_corpus
from benchmarks.soak import metric
from benchmarks.voice import _voice_options

SETTINGS = ("server.log_level=warning",)
TARGET_PLAYING = 0.9
TARGET_TTFA_P99_MS = 1000.0


def _log(message: str) -> None:
    print(f"[admission {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextmanager
def capacity_readings(url: str, period_s: float = 0.5) -> Iterator[list[float]]:
    """The server's capacity model reading (its /metrics gauge), every `period_s` while
    the block runs: what admission compared the load with."""
    readings: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        with httpx.Client(base_url=url, timeout=5.0) as client:
            while not stop.wait(period_s):
                text = client.get("/metrics").text
                readings.append(metric(text, "playhead_capacity_audio_seconds_per_second"))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield readings
    finally:
        stop.set()
        thread.join()


def one_run(
    config: Path, settings: list[str], plan: LoadPlan, factors: list[float], clients: int,
    log_dir: Path, index: int,
) -> dict[str, Any]:  # fmt: skip
    window = load_settings(config).scheduling.active_stream_window
    by_policy: dict[str, float] = {}
    for policy in (Policy("fifo", 0, False), Policy("edf", window, False)):
        c, _ = measure_capacity(
            config, settings, clients, plan, log_dir / f"capacity-{policy.slug}-{index}.log", policy
        )
        by_policy[policy.label] = c
    capacity = max(by_policy.values())
    _log(f"run {index + 1}: C = {capacity:.2f} audio s per s ({by_policy})")
    points = []
    with serve(config, settings, log_dir / f"served-{index}.log") as url:
        for f in factors:
            n = max(1, round(f * capacity))
            with capacity_readings(url) as readings:
                result = run_load(url, n, plan)
            row = run_row(Policy("served", window, True), result, capacity)
            row["factor"] = f
            row["model_capacity"] = {
                "mean": statistics.fmean(readings) if readings else None,
                "min": min(readings, default=None),
                "max": max(readings, default=None),
            }
            row["playing_per_capacity"] = float(row["listening_mean"]) / capacity
            points.append(row)
            _log(
                f"run {index + 1}: {f:g} C (N={n}): playing {row['playing_per_capacity']:.2f} C, "
                f"stall-free {100 * float(row['stall_free_share']):.0f}% of {row['streams_ok']} "
                f"(interruptions {row['interruptions']}), TTFA p99 "
                f"{row['ttfa_p99_ms'] or 0:.0f} ms, 429s {row['rejected']}, the model read "
                f"{row['model_capacity']['mean'] or 0:.2f} on average"
            )
            time.sleep(1.0)
    return {"capacity": capacity, "capacity_by_policy": by_policy, "points": points}


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| run | C | offered | playing / C | stall-free | interruptions | TTFA p99 ms | 429s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, run in enumerate(runs, 1):
        for p in run["points"]:
            lines.append(
                f"| {i} | {run['capacity']:.2f} | {p['factor']:g} C ({p['streams']}) | "
                f"{p['playing_per_capacity']:.2f} | "
                f"{100 * p['stall_free_share']:.0f}% of {p['streams_ok']} | "
                f"{p['interruptions']} | {p['ttfa_p99_ms'] or 0:.0f} | {p['rejected']} |"
            )
    return "\n".join(lines)


def met(runs: list[dict[str, Any]]) -> bool:
    return all(
        p["playing_per_capacity"] >= TARGET_PLAYING
        and p["stall_free_share"] == 1.0
        and (p["ttfa_p99_ms"] or 0.0) <= TARGET_TTFA_P99_MS
        for run in runs
        for p in run["points"]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.admission_runs")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--factors", default="1.5,2")
    parser.add_argument("--duration", type=float, default=20.0, help="measured window, s")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--capacity-duration", type=float, default=10.0)
    parser.add_argument("--capacity-clients", type=int, default=0, help="0: 2.5 x a guess")
    parser.add_argument("--max-text-chars", type=int, default=150)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    settings = [*SETTINGS, *args.overrides]
    backend = load_settings(args.config).backend
    plan = LoadPlan(
        texts=tuple(t for t in load_corpus() if len(t) <= args.max_text_chars),
        options=RequestOptions(voice="sim") if backend == "sim" else RequestOptions(),
        duration_s=args.duration,
        warmup_s=args.warmup,
        capacity_duration_s=args.capacity_duration,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    if backend != "sim":
        log_probe = args.out / "admission-probe.log"
        with serve(args.config, settings, log_probe) as url:
            plan = replace(plan, options=asyncio.run(_voice_options(url)))
        log_probe.unlink(missing_ok=True)
    clients = args.capacity_clients or (22 if backend == "sim" else 20)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    log_dir = args.out / f"admission-{args.config.stem}-{stamp}"
    log_dir.mkdir(parents=True, exist_ok=True)
    factors = number_list(args.factors, float)
    runs = [
        one_run(args.config, settings, plan, factors, clients, log_dir, i) for i in range(args.runs)
    ]
    playing = [p["playing_per_capacity"] for r in runs for p in r["points"]]
    summary = {
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": config_name(args.config),
        "settings": settings,
        "factors": factors,
        "duration_s": args.duration,
        "runs": runs,
        "playing_per_capacity_min": min(playing),
        "playing_per_capacity_median": statistics.median(playing),
        "targets_met": met(runs),
    }
    (log_dir / "results.json").write_text(json.dumps(summary, indent=1))
    print(table(runs))
    verdict = "met" if summary["targets_met"] else "missed"
    print(
        f"\ntargets (>= {TARGET_PLAYING} C playing, 100% stall-free, TTFA p99 <= "
        f"{TARGET_TTFA_P99_MS:.0f} ms, every run): {verdict}"
    )
    _log(f"wrote {log_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Live listeners with and without a job running: the interleaved A/B of issue #53.

Each point is a fresh `playhead serve` (the served config, admission on) loaded by a
closed loop of round(f x C) listeners (benchmarks/bench.py `run_load`: each plays its
stream at 1x and sends its next request when it has heard the last). C is the capacity
the run's first server calibrated at start-up (the same N for both arms of a run). The
"job" arm submits a --chars character job (the corpus' lines, benchmarks/jobs_render.py)
before the listeners start and reads its progress before and after their window: the
audio the job made per wall second while they played. Arms alternate (which goes first
flips per factor and per run), so the host's drift falls on both.

Per point: the stall-free share of accepted streams, listeners playing on average as a
share of C, TTFA p50/p99 (from the first try), 429s, and the job's render rate.

    python -m benchmarks.jobs_live_ab [--runs 1] [--first-run 0] [--factors 0.9,1.5]
        [--duration 15] [--chars 20000] [--out benchmarks/results/jobs-live-ab.json]

Each call appends its points to --out (JSON), so runs can be split over short calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from app.settings import load_settings
from benchmarks.bench import ROOT, LoadPlan, Policy, machine, number_list, run_load, run_row, serve
from benchmarks.jobs_render import corpus_text
from benchmarks.loadgen import RequestOptions, load_corpus
from benchmarks.soak import metric
from benchmarks.voice import _voice_options

SETTINGS = ("server.log_level=warning",)
CAPACITY = "playhead_capacity_audio_seconds_per_second"


def _log(message: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {message}", flush=True)


def _job_audio_s(url: str, job_id: str) -> tuple[float, str]:
    job = httpx.get(f"{url}/v1/audio/jobs/{job_id}", timeout=10).json()
    return float(job["progress"]["audio_seconds"]), str(job["state"])


def one_point(
    config: Path, settings: list[str], plan: LoadPlan, n: int | None, factor: float,
    with_job: bool, chars: int, log_path: Path,
) -> dict[str, Any]:  # fmt: skip
    """One fresh server, one window of listeners (N = round(factor x C) when `n` is None)."""
    jobs_dir = log_path.with_suffix(".jobs")
    with serve(config, [*settings, f"jobs.dir={jobs_dir}"], log_path, timeout_s=180) as url:
        capacity = metric(httpx.get(url + "/metrics", timeout=5).text, CAPACITY)
        streams = n if n is not None else max(1, round(factor * capacity))
        job_id = None
        if with_job:
            body = {"input": corpus_text(chars), "voice": plan.options.voice}
            response = httpx.post(f"{url}/v1/audio/jobs", json=body, timeout=30)
            response.raise_for_status()
            job_id = response.json()["id"]
            time.sleep(1.0)  # rendering before the first listener comes
            job_before_s, _ = _job_audio_s(url, job_id)
        started = time.monotonic()
        result = run_load(url, streams, plan)
        wall_s = time.monotonic() - started
        row = run_row(Policy("served", 0, True), result, capacity)
        row.update(factor=factor, with_job=with_job, capacity=capacity, streams=streams)
        row["playing_per_capacity"] = float(row["listening_mean"]) / capacity
        if job_id is not None:
            job_after_s, state = _job_audio_s(url, job_id)
            row["job_audio_s"] = job_after_s - job_before_s
            row["job_rate_audio_s_per_s"] = (job_after_s - job_before_s) / wall_s
            row["job_share_of_capacity"] = row["job_rate_audio_s_per_s"] / capacity
            row["job_state"] = state
    return row


def table(points: list[dict[str, Any]]) -> str:
    lines = [
        "| run | f | job | N | C | stall-free | playing/C | TTFA p50 ms | TTFA p99 ms | 429s "
        "| job audio s/s (share of C) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        job = (
            f"{p['job_rate_audio_s_per_s']:.2f} ({p['job_share_of_capacity']:.2f})"
            if p["with_job"]
            else "-"
        )
        lines.append(
            f"| {p['run']} | {p['factor']:g} | {'yes' if p['with_job'] else 'no'} "
            f"| {p['streams']} | {p['capacity']:.2f} | {100 * p['stall_free_share']:.1f}% "
            f"| {p['playing_per_capacity']:.2f} | {p['ttfa_p50_ms'] or 0:.0f} "
            f"| {p['ttfa_p99_ms'] or 0:.0f} | {p['rejected']} | {job} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.jobs_live_ab")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--first-run", type=int, default=0, help="index of the first run")
    parser.add_argument("--factors", default="0.9,1.5")
    parser.add_argument("--duration", type=float, default=15.0, help="measured window, s")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--chars", type=int, default=20_000)
    parser.add_argument("--max-text-chars", type=int, default=150)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", type=Path, required=True, help="JSON file points append to")
    args = parser.parse_args(argv)
    settings = [*SETTINGS, *args.overrides]
    backend = load_settings(args.config).backend
    plan = LoadPlan(
        texts=tuple(t for t in load_corpus() if len(t) <= args.max_text_chars),
        options=RequestOptions(voice="sim") if backend == "sim" else RequestOptions(),
        duration_s=args.duration,
        warmup_s=args.warmup,
    )
    log_dir = args.out.with_suffix(".logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    if backend != "sim":
        with serve(args.config, settings, log_dir / "probe.log", timeout_s=180) as url:
            plan = replace(plan, options=asyncio.run(_voice_options(url)))
    saved = json.loads(args.out.read_text()) if args.out.exists() else {"points": []}
    factors = number_list(args.factors, float)
    for run in range(args.first_run, args.first_run + args.runs):
        n_by_factor: dict[float, int] = {}
        for i, factor in enumerate(factors):
            arms = [False, True] if (run + i) % 2 == 0 else [True, False]
            for with_job in arms:
                log_path = log_dir / f"run{run}-f{factor:g}-{'job' if with_job else 'live'}.log"
                point = one_point(
                    args.config, settings, plan, n_by_factor.get(factor), factor, with_job,
                    args.chars, log_path,
                )  # fmt: skip
                n_by_factor[factor] = point["streams"]
                point.update(run=run, at=datetime.now(UTC).isoformat(timespec="seconds"))
                saved["points"].append(point)
                args.out.write_text(json.dumps(saved, indent=1))
                job = f", job {point['job_rate_audio_s_per_s']:.2f} audio s/s" if with_job else ""
                _log(
                    f"run {run} {factor:g} C {'job' if with_job else 'live'} N={point['streams']}"
                    f" C={point['capacity']:.2f}: stall-free {100 * point['stall_free_share']:.1f}%"
                    f", playing {point['playing_per_capacity']:.2f} C, TTFA p50/p99 "
                    f"{point['ttfa_p50_ms'] or 0:.0f}/{point['ttfa_p99_ms'] or 0:.0f} ms, 429s "
                    f"{point['rejected']}{job}"
                )
    saved.update(machine=machine(), config=str(args.config.name), settings=settings)
    args.out.write_text(json.dumps(saved, indent=1))
    print(table(saved["points"]))
    for factor in factors:
        for with_job in (False, True):
            points = saved["points"]
            arm = [p for p in points if p["factor"] == factor and p["with_job"] == with_job]
            if arm:
                print(
                    f"{factor:g} C {'job ' if with_job else 'live'}: stall-free mean "
                    f"{100 * statistics.fmean(p['stall_free_share'] for p in arm):.1f}%, TTFA p99 "
                    f"max {max(p['ttfa_p99_ms'] or 0 for p in arm):.0f} ms over {len(arm)} runs"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

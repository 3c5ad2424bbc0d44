"""Live listeners with and without a long job rendering beside them (issue #53's claim).

    python -m benchmarks.lab.jobs_live_ab [--factors 0.9,1.5] [--pairs 2] [--chars 20000]
        [--duration 20] [--finish-by S] [--set backend.kind=piper]

C is measured first (benchmarks.bench.measure_capacity: saturating clients, fifo), then
for each factor f, `--pairs` pairs of points, the two arms in turn (which goes first
alternates pair by pair): a fresh server, round(f x C) closed-loop listeners at 1x that
honour Retry-After (benchmarks/admission_runs.py's load), and in the "job" arm a job of
`--chars` characters (the corpus, no finish_by: best effort) submitted before the
listeners start. Per point: the listeners' playing share of C, their stall-free share,
TTFA p50/p99 from the first try, 429s; in the job arm, the audio the job made per wall
second over the window (the capacity live listeners left it) and its share of C.
`--finish-by S`: the job is due S seconds after it is sent (a window longer than S keeps
the listeners beside it until then); the point says whether it was done by then, or the
refusal if the finish_by check turned it away.

Writes benchmarks/results/jobs-live-ab-<UTC>.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
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
from benchmarks.jobs_render import corpus_text
from benchmarks.loadgen import RequestOptions, load_corpus
from benchmarks.voice import _voice_options

SETTINGS = ("server.log_level=warning",)


def _log(message: str) -> None:
    print(f"[jobs-ab {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class JobProgress:
    at_s: float
    audio_s: float


def _job_audio_s(client: httpx.Client, job_id: str) -> JobProgress:
    job = client.get(f"/v1/audio/jobs/{job_id}").json()
    return JobProgress(time.monotonic(), float(job["progress"]["audio_seconds"]))


def one_point(
    config: Path,
    settings: list[str],
    plan: LoadPlan,
    n: int,
    job_text: str | None,
    log: Path,
    finish_by_s: float | None = None,
) -> dict[str, Any]:
    """A fresh server, `n` listeners, and with `job_text` a job rendering throughout (with
    `finish_by_s`: due that many seconds after it is sent; the listeners' window should
    outlast it, so that it renders beside them until its deadline)."""
    row: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        jobs_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="jobs-ab-"))
        url = stack.enter_context(serve(config, [*settings, f"jobs.dir={jobs_dir}"], log))
        client = stack.enter_context(httpx.Client(base_url=url, timeout=30))
        job_id = None
        if job_text is not None:
            body: dict[str, Any] = {
                "input": job_text,
                "voice": plan.options.voice,
                "response_format": "wav",
            }
            if finish_by_s is not None:
                row["finish_by_unix_s"] = body["finish_by"] = time.time() + finish_by_s
            response = client.post("/v1/audio/jobs", json=body)
            if response.status_code != 202:  # a finish_by the check refused, say
                row["job_refused"] = response.json()["error"]["message"]
                row["result"] = run_load(url, n, plan)
                return row
            job_id = response.json()["id"]
            if finish_by_s is not None:
                stack.enter_context(_watch_done(client, job_id, row))
            before = _job_audio_s(client, job_id)
        row["result"] = run_load(url, n, plan)
        if job_id is not None:
            after = _job_audio_s(client, job_id)
            state = client.get(f"/v1/audio/jobs/{job_id}").json()["state"]
            row["job_audio_s_per_s"] = (after.audio_s - before.audio_s) / (after.at_s - before.at_s)
            row["job_state_after"] = state  # "done": it ran out before the listeners did
            client.delete(f"/v1/audio/jobs/{job_id}")
    return row


@contextlib.contextmanager
def _watch_done(client: httpx.Client, job_id: str, row: dict[str, Any]) -> Iterator[None]:
    """Polls the job every 0.25 s from a thread while the block runs: `row["done_unix_s"]`
    is when it was first seen done."""
    stop = threading.Event()
    url = str(client.base_url)

    def watch() -> None:
        with httpx.Client(base_url=url, timeout=10) as own:
            while not stop.wait(0.25):
                if own.get(f"/v1/audio/jobs/{job_id}").json()["state"] == "done":
                    row["done_unix_s"] = time.time()
                    return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lab.jobs_live_ab")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument("--factors", default="0.9,1.5")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--chars", type=int, default=20_000)
    parser.add_argument("--duration", type=float, default=20.0, help="measured window, s")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--capacity-clients", type=int, default=20)
    parser.add_argument("--max-text-chars", type=int, default=150)
    parser.add_argument(
        "--finish-by", type=float, default=None, help="the job due this many s after it is sent"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs must be >= 1, got {args.pairs}")
    settings = [*SETTINGS, *args.overrides]
    backend = load_settings(args.config, args.overrides).backend
    plan = LoadPlan(
        texts=tuple(t for t in load_corpus() if len(t) <= args.max_text_chars),
        options=RequestOptions(voice="sim") if backend.kind == "sim" else RequestOptions(),
        duration_s=args.duration,
        warmup_s=args.warmup,
    )
    logs = Path(tempfile.mkdtemp(prefix="jobs-live-ab-"))
    if backend.kind != "sim":
        with serve(args.config, settings, logs / "probe.log") as url:
            plan = replace(plan, options=asyncio.run(_voice_options(url)))
    job_text = corpus_text(args.chars)
    capacity, _ = measure_capacity(
        args.config,
        settings,
        args.capacity_clients,
        plan,
        logs / "capacity.log",
        Policy("fifo", 0, False),
    )
    _log(f"C = {capacity:.2f} audio s per s")
    points = []
    for f in number_list(args.factors, float):
        n = max(1, round(f * capacity))
        for pair in range(args.pairs):
            arms = ["none", "job"] if pair % 2 == 0 else ["job", "none"]
            for arm in arms:
                log = logs / f"served-{f:g}-{pair}-{arm}.log"
                got = one_point(
                    args.config,
                    settings,
                    plan,
                    n,
                    job_text if arm == "job" else None,
                    log,
                    args.finish_by,
                )
                if "finish_by_unix_s" in got and "done_unix_s" in got:
                    got["finish_by_met"] = got["done_unix_s"] <= got["finish_by_unix_s"]
                    got["done_before_deadline_s"] = got["finish_by_unix_s"] - got["done_unix_s"]
                row = run_row(Policy("served", 0, True), got.pop("result"), capacity)
                row.update(got)
                row.update(factor=f, pair=pair, arm=arm, listeners=n)
                row["playing_per_capacity"] = float(row["listening_mean"]) / capacity
                if "job_audio_s_per_s" in row:
                    row["job_share_of_capacity"] = row["job_audio_s_per_s"] / capacity
                points.append(row)
                _log(
                    f"{f:g} C pair {pair + 1} {arm}: playing {row['playing_per_capacity']:.2f} C, "
                    f"stall-free {100 * float(row['stall_free_share']):.0f}% of "
                    f"{row['streams_ok']}, TTFA p50 {row['ttfa_p50_ms'] or 0:.0f} p99 "
                    f"{row['ttfa_p99_ms'] or 0:.0f} ms, 429s {row['rejected']}"
                    + (
                        f", job {row['job_audio_s_per_s']:.2f} audio s/s"
                        if "job_audio_s_per_s" in row
                        else ""
                    )
                    + (
                        f", finish_by met with {row['done_before_deadline_s']:.1f} s to spare"
                        if row.get("finish_by_met")
                        else ", finish_by MISSED (not done by its deadline)"
                        if "done_before_deadline_s" in row
                        else ", the job not done by the end of the point"
                        if "finish_by_unix_s" in row and arm == "job"
                        else ""
                    )
                    + (f", job refused: {row['job_refused']}" if "job_refused" in row else "")
                )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    summary = {
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": config_name(args.config),
        "settings": settings,
        "capacity": capacity,
        "chars": args.chars,
        "duration_s": args.duration,
        "points": points,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"jobs-live-ab-{stamp}.json"
    out.write_text(json.dumps(summary, indent=1, default=str))
    print(table(points))
    _log(f"wrote {out} (server logs in {logs})")
    return 0


def table(points: list[dict[str, Any]]) -> str:
    lines = [
        "| offered | pair | arm | playing / C | stall-free | TTFA p50 ms | TTFA p99 ms | 429s "
        "| job audio s/s (share of C) |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        job = (
            f"{p['job_audio_s_per_s']:.2f} ({p['job_share_of_capacity']:.2f})"
            if "job_audio_s_per_s" in p
            else "-"
        )
        lines.append(
            f"| {p['factor']:g} C ({p['listeners']}) | {p['pair'] + 1} | {p['arm']} | "
            f"{p['playing_per_capacity']:.2f} | {100 * float(p['stall_free_share']):.0f}% of "
            f"{p['streams_ok']} | {p['ttfa_p50_ms'] or 0:.0f} | {p['ttfa_p99_ms'] or 0:.0f} | "
            f"{p['rejected']} | {job} |"
        )
    for f in sorted({p["factor"] for p in points}):
        for arm in ("none", "job"):
            rows = [p for p in points if p["factor"] == f and p["arm"] == arm]
            if rows:
                lines.append(
                    f"| {f:g} C | median | {arm} | "
                    f"{statistics.median(r['playing_per_capacity'] for r in rows):.2f} | | "
                    f"{statistics.median(r['ttfa_p50_ms'] or 0 for r in rows):.0f} | "
                    f"{statistics.median(r['ttfa_p99_ms'] or 0 for r in rows):.0f} | | |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

"""`make bench`: the scheduling comparison on the sim backend, over HTTP, in one run.

    python -m benchmarks.bench [--quick] [--set section.field=value ...]

1. Capacity C: a server with fifo and no window (every ready stream in every batched
   call, so the vocoder never idles and its batches are as large as they get) is
   saturated by 2.5 x the expected C clients, each sending its next request at the last
   byte; C = the audio seconds per wall second they received, counted from the first to
   the last burst (turn end) of a 10 s window. Measured here, in this run.
2. One server per policy (`python -m app serve --config configs/sim.yaml --port P
   --set ...`): fifo K=0, fifo K, edf K, edf K + admission. Each is swept over
   N = 0.5, 0.75, 1, 1.5, 2 x C listeners, closed loop (a listener sends its next request
   when it has heard the last one), same texts, same seed.
3. benchmarks/results/<timestamp>/: results.json, table.md, ttfa_cdf.png,
   stall_ratio.png, stall_free.png (and the servers' logs); copied to
   benchmarks/results/latest.json and benchmarks/results/latest/.

The sim costs (configs/sim.yaml) make C about 8-9 streams; a sweep point lasts
~20-30 s; the first chunk (the ramp) is sized to cover a full
K=4 turn (~300 ms), see the report.

results.json: {"machine", "date", "backend", "capacity_audio_s_per_s", "runs": [{"policy",
"window", "admission", "streams", "stall_ratio", "stall_ratio_bound", "stall_free_share",
"interruptions", "ttfa_p50_ms", "ttfa_p95_ms", "ttfa_p99_ms", "rejected", "xrt", ...}]};
extra run fields: label, streams_per_capacity, streams_ok, streams_failed,
stalls_per_stream, interrupted_share, goodput_streams_per_s, rtf_p50/p95, listening_mean,
stall_ratio_bound_listening, in_flight_mean, reject_latency_p50/p99/max_ms,
retry_after_s (min/p50/max), wait_p50/p99_ms, audio_s, window_s, ttfa_ms (samples).
With admission, every figure is over accepted streams; a rejected client waits its
Retry-After and sends the same text again (each attempt is a request of its own).

Reusable for other backends (the real-voice bench): `serve` (`server_process` for any
server), `LoadPlan` (its `request` hook loads other APIs), `run_load`, `measure_capacity`,
`sweep`, `run_row`, `add_common_arguments`, and benchmarks.report's `write_report`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import httpx

from benchmarks.loadgen import (
    LoadResult,
    Requester,
    RequestOptions,
    closed_loop,
    load_corpus,
    request_once,
)
from benchmarks.player import (
    STALL_TOLERANCE_S,
    Outcome,
    StreamRecord,
    percentile,
    stall_ratio_bound,
)
from benchmarks.report import markdown_table, publish_latest, stall_free_capacity, write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
CONFIG = ROOT / "configs" / "sim.yaml"
T = TypeVar("T")

# The costs are configs/sim.yaml's: 80 ms frames, vocoder 4 ms + 9 ms per frame, batched,
# so C ~ 0.08 / 0.009 ~ 8.8 streams; K=4 turns of 8-frame chunks take ~300 ms, hence its
# 6-frame (480 ms) first chunk. The talker (80 s of audio per s) is never the bottleneck.
BENCH_SETTINGS = ("server.log_level=warning",)
EXPECTED_CAPACITY = 0.08 / 0.009  # frame seconds / per-frame cost: ~8.9 streams
FACTORS = (0.5, 0.75, 1.0, 1.5, 2.0)
NOTES = [
    "closed loop: N listeners, each sends its next request when it has heard its stream to "
    "the end; requests sent in the measured window are measured, unmeasured ones keep the "
    "load until the measured streams end",
    "stall-free ignores stalls under 10 ms; interruptions are stalls >= 150 ms",
    "admission runs: figures over accepted streams; rejected clients retry after "
    "Retry-After; wait_p99_ms is the time an accepted listener spent being rejected first",
    "RTF = (last byte - request sent) / audio duration: lower is faster",
    "stall_ratio_bound_listening = max(0, L/C - 1) with L the time-averaged number of "
    "players between first audio and end of playback (a listener waiting for first audio "
    "does not play, so L < N when streams wait)",
]


@dataclass(frozen=True)
class Policy:
    policy: str
    window: int
    admission: bool

    @property
    def label(self) -> str:
        return f"{self.policy} K={self.window}" + (" + admission" if self.admission else "")

    @property
    def slug(self) -> str:
        """The label as a file name part (server-<slug>.log)."""
        return self.label.replace(" ", "_").replace("+", "plus")

    def overrides(self) -> list[str]:
        return [
            f"scheduling.policy={self.policy}",
            f"scheduling.active_stream_window={self.window}",
            f"admission.enabled={'true' if self.admission else 'false'}",
        ]


def policies(window: int) -> list[Policy]:
    return [
        Policy("fifo", 0, False),
        Policy("fifo", window, False),
        Policy("edf", window, False),
        Policy("edf", window, True),
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def server_process(
    command: Sequence[str],
    port: int,
    log_path: Path,
    *,
    ready_path: str = "/ready",
    name: str = "server",
    timeout_s: float = 60.0,
    tree: Path | None = None,
) -> Iterator[str]:
    """`command` as a subprocess serving on loopback `port`, its output in `log_path`;
    yields its base URL once GET `ready_path` answers 200, then stops it (SIGINT, then kill).
    `tree`: run it from that source tree (another checkout: old against new) instead."""
    log = log_path.open("w", encoding="utf-8")
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen(
        command, cwd=tree or ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + ready_path, timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready after {timeout_s} s; see {log_path}")
            time.sleep(0.1)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def serve(
    config: Path,
    overrides: Sequence[str],
    log_path: Path,
    timeout_s: float = 60.0,
    tree: Path | None = None,
) -> contextlib.AbstractContextManager[str]:
    """A `playhead serve` subprocess; yields its base URL once /ready answers 200.
    `tree`: the server runs that checkout's code (its own configs/ under the same name)."""
    port = free_port()
    if tree is not None:
        config = tree / Path(config).resolve().relative_to(ROOT)
    command = [sys.executable, "-m", "app", "serve", "--config", str(config), "--port", str(port)]
    for item in overrides:
        command += ["--set", item]
    return server_process(command, port, log_path, timeout_s=timeout_s, tree=tree)


def run_row(policy: Policy, result: LoadResult, capacity: float) -> dict[str, object]:
    """One results.json run from a load result."""
    s = result.summary
    n = int(result.load)
    retry = sorted(s.retry_after_s)
    return {
        "label": policy.label,
        "policy": policy.policy,
        "window": policy.window,
        "admission": policy.admission,
        "streams": n,
        "streams_per_capacity": n / capacity,
        "stall_ratio": s.stall_ratio,
        "stall_ratio_bound": stall_ratio_bound(n, capacity),
        "stall_free_share": s.stall_free_share,
        "interruptions": s.interruptions,
        "ttfa_p50_ms": s.ttfa_p50_ms,
        "ttfa_p95_ms": s.ttfa_p95_ms,
        "ttfa_p99_ms": s.ttfa_p99_ms,
        "rejected": s.rejected,
        "xrt": s.xrt,
        "streams_ok": s.streams_ok,
        "streams_failed": s.streams_failed,
        "stalls_per_stream": s.stalls_per_stream,
        "stalls_max": s.stalls_max,
        "interrupted_share": s.interrupted_share,
        "goodput_streams_per_s": s.goodput_streams_per_s,
        "rtf_p50": s.rtf_p50,
        "rtf_p95": s.rtf_p95,
        "listening_mean": s.listening_mean,
        "stall_ratio_bound_listening": stall_ratio_bound(s.listening_mean, capacity),
        "in_flight_mean": s.in_flight_mean,
        "reject_latency_p50_ms": s.reject_latency_p50_ms,
        "reject_latency_p99_ms": s.reject_latency_p99_ms,
        "reject_latency_max_ms": s.reject_latency_max_ms,
        "retry_after_s": (
            {"min": retry[0], "p50": percentile(retry, 50), "max": retry[-1]} if retry else None
        ),
        "wait_p50_ms": s.wait_p50_ms,
        "wait_p99_ms": s.wait_p99_ms,
        "server_start_wait_p99_ms": s.server_start_wait_p99_ms,
        "server_first_audio_p99_ms": s.server_first_audio_p99_ms,
        "audio_s": s.audio_s,
        "window_s": s.wall_s,
        "errors": sorted({r.error for r in result.records if r.error})[:5],
        # the stalls (>= 10 ms) of the streams that had any, in ms, at most 30 streams
        "stalls_ms": [
            [round(x * 1000.0, 1) for x in r.playback.stalls_s if x >= STALL_TOLERANCE_S]
            for r in result.records
            if r.playback.stall_count() > 0
        ][:30],
        # where those stalls fell: the audio (s) each stream had played before each
        "stalls_at_s": [
            [
                round(at, 2)
                for s, at in zip(r.playback.stalls_s, r.playback.stalls_at_s, strict=False)
                if s >= STALL_TOLERANCE_S
            ]
            for r in result.records
            if r.playback.stall_count() > 0
        ][:30],
        "ttfa_ms": [round(t * 1000.0, 2) for t in result.ttfas_s()],
        # where the slowest first audios went (the 10 slowest accepted streams), in ms:
        # [TTFA, refused and waiting out Retry-After before, the server's wait for a start
        # slot, its submit -> first audio] (the server's None when it did not say)
        "ttfa_parts_ms": ttfa_parts_ms(result.records, 10),
        "margin_p1_ms": s.margin_p1_ms,
        "margin_p5_ms": s.margin_p5_ms,
        # every finished stream's margin, tightest first: (ms, where in its audio, s); the
        # ramp's second chunk sets most (at 0.09 s on the voice), so where matters
        "margins": sorted(
            (round(m * 1000.0, 1), round(r.playback.margin_at_s or 0.0, 2))
            for r in result.records
            if r.outcome is Outcome.OK and (m := r.playback.margin_s) is not None
        ),
    }


def ttfa_parts_ms(records: Sequence[StreamRecord], count: int) -> list[list[float | None]]:
    """The `count` slowest accepted streams' first audio, taken apart (ms): TTFA, the
    429s and Retry-After waits before it, the server's start wait, its first audio."""

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000.0, 1)

    timed = [(t, r) for r in records if r.outcome is Outcome.OK and (t := r.ttfa_s) is not None]
    timed.sort(key=lambda item: item[0], reverse=True)
    return [
        [ms(t), ms(r.waited_s), ms(r.server_start_wait_s), ms(r.server_first_audio_s)]
        for t, r in timed[:count]
    ]


def machine() -> str:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"{model}, {os.cpu_count()} CPUs, {platform.system()}, Python {platform.python_version()}"
    )


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class LoadPlan:
    """How each sweep point loads a server (shared by the sim and the real-voice benches)."""

    texts: tuple[str, ...]
    options: RequestOptions = field(default_factory=lambda: RequestOptions(voice="sim"))
    duration_s: float = 14.0  # measured window
    warmup_s: float = 2.0
    capacity_duration_s: float = 10.0
    seed: int = 0
    request: Requester = request_once  # the server's client (closed_loop's hook)
    drain_timeout_s: float = 120.0  # how long measured streams may run past the window


def run_load(url: str, n: int, plan: LoadPlan, *, capacity: bool = False) -> LoadResult:
    """One closed-loop point. capacity=True saturates instead: each client sends its next
    request at the last byte, and the run is cut at the window's end (throughput)."""
    return asyncio.run(
        closed_loop(
            url,
            plan.texts,
            streams=n,
            duration_s=plan.warmup_s + (plan.capacity_duration_s if capacity else plan.duration_s),
            warmup_s=plan.warmup_s,
            options=plan.options,
            seed=plan.seed,
            drain=not capacity,
            next_request="after_last_byte" if capacity else "after_playback",
            request=plan.request,
            drain_timeout_s=plan.drain_timeout_s,
        )
    )


def measure_capacity(
    config: Path,
    settings: Sequence[str],
    clients: int,
    plan: LoadPlan,
    log_path: Path,
    policy: Policy = Policy("fifo", 0, False),
) -> tuple[float, LoadResult]:
    """C: audio per second a server under `policy` (by default fifo without a window)
    delivers to `clients` saturating clients, from the first to the last burst of the
    window (see burst_throughput)."""
    with serve(config, [*settings, *policy.overrides()], log_path) as url:
        result = run_load(url, clients, plan, capacity=True)
    return result.burst_throughput(), result


def sweep(
    config: Path,
    settings: Sequence[str],
    policy: Policy,
    counts: Sequence[int],
    plan: LoadPlan,
    capacity: float,
    log_path: Path,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, object]]:
    """One server with `policy`, one closed-loop point per N in `counts`: results rows."""
    log = log or _log
    rows = []
    with serve(config, [*settings, *policy.overrides()], log_path) as url:
        for n in counts:
            row = run_row(policy, run_load(url, n, plan), capacity)
            rows.append(row)
            log(
                f"{policy.label:22s} N={n:3d} stall ratio {row['stall_ratio']:.3f} "
                f"(bound {row['stall_ratio_bound']:.3f}) stall-free "
                f"{100 * row['stall_free_share']:.0f}% "
                f"TTFA p99 {row['ttfa_p99_ms'] or 0:.0f} ms rejected {row['rejected']} "
                f"xRT {row['xrt']:.2f} ({row['streams_ok']} streams, {row['window_s']:.0f} s)"
            )
            time.sleep(1.0)  # let the cancelled background streams end on the server
    return rows


def add_common_arguments(
    parser: argparse.ArgumentParser,
    *,
    config: Path,
    window: int,
    factors: Sequence[float],
    duration_s: float,
    latest: str,
) -> None:
    """The arguments the sim bench and the real-voice bench (benchmarks/voice.py) share;
    --factors stays a string (see number_list)."""
    parser.add_argument("--config", type=Path, default=config)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="S.F=V",
        help="extra Playhead setting (every Playhead server of the run, after the bench's own)",
    )
    parser.add_argument("--window", type=int, default=window, help="K for the windowed policies")
    parser.add_argument(
        "--factors",
        default=",".join(map(str, factors)),
        help="policy comparison: N as multiples of C, comma-separated",
    )
    parser.add_argument(
        "--duration", type=float, default=duration_s, help="measured window of a load, s"
    )
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured start of a load, s")
    parser.add_argument("--capacity-duration", type=float, default=10.0)
    parser.add_argument(
        "--max-text-chars",
        type=int,
        default=150,
        help="load texts: the corpus texts up to this length (keeps runs short)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-latest", action="store_true", help=f"don't update results/{latest}*")


def number_list(text: str, kind: Callable[[str], T]) -> list[T]:
    """'1,4, 8' -> [1, 4, 8] (kind=int); '' -> []."""
    return [kind(c) for c in str(text).split(",") if c.strip()]


def new_run_dir(root: Path, prefix: str = "") -> Path:
    """root/<prefix><UTC timestamp>/, created."""
    out_dir = root / (prefix + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def config_name(config: Path) -> str:
    """The config's path relative to the repository when it lies inside it."""
    return str(config.relative_to(ROOT) if config.is_relative_to(ROOT) else config)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench", description=__doc__.split("\n")[0]
    )
    add_common_arguments(
        parser, config=CONFIG, window=4, factors=FACTORS, duration_s=14.0, latest="latest"
    )
    parser.add_argument("--format", default="pcm", help="response_format (default pcm)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 points, short")
    args = parser.parse_args(argv)
    if args.quick:
        args.factors = "0.5,2"
        args.duration = 5.0
        args.capacity_duration = 5.0

    factors = number_list(args.factors, float)
    plan = LoadPlan(
        texts=tuple(t for t in load_corpus() if len(t) <= args.max_text_chars),
        options=RequestOptions(voice="sim", response_format=args.format),
        duration_s=args.duration,
        warmup_s=args.warmup,
        capacity_duration_s=args.capacity_duration,
        seed=args.seed,
    )
    out_dir = new_run_dir(args.out)
    settings = [*BENCH_SETTINGS, *args.overrides]
    started = time.monotonic()

    n_sat = round(2.5 * EXPECTED_CAPACITY)
    _log(f"capacity: fifo K=0, {n_sat} clients, {args.capacity_duration:.0f} s")
    capacity, cap_result = measure_capacity(
        args.config, settings, n_sat, plan, out_dir / "server-capacity.log"
    )
    _log(f"C = {capacity:.2f} audio s per s")
    counts = sorted({max(1, round(f * capacity)) for f in factors})

    runs: list[dict[str, object]] = []
    for policy in policies(args.window):
        log_path = out_dir / f"server-{policy.slug}.log"
        runs += sweep(args.config, settings, policy, counts, plan, capacity, log_path)

    results = {
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "backend": "sim",
        "capacity_audio_s_per_s": capacity,
        "capacity_method": (
            f"audio per second received by a closed loop of {n_sat} clients (each sending "
            f"its next request at the last byte) against fifo without a window (every "
            f"stream in every batched call) in [{args.warmup:.0f} s, "
            f"{args.warmup + args.capacity_duration:.0f} s], counted from the first to the "
            f"last burst of audio (turn ends) inside it"
        ),
        "capacity_run": run_row(Policy("fifo", 0, False), cap_result, capacity),
        "max_xrt_seen": max([capacity, *(float(r["xrt"]) for r in runs)]),  # type: ignore[arg-type]
        "settings": settings,
        "config": config_name(args.config),
        "seed": args.seed,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "texts": len(plan.texts),
        "response_format": args.format,
        "stall_free_capacity": stall_free_capacity(runs),
        "notes": NOTES,
        "wall_s": time.monotonic() - started,
        "runs": runs,
    }
    write_report(results, out_dir)
    if not args.no_latest:
        publish_latest(out_dir, args.out)
    print(markdown_table(results))
    _log(f"wrote {out_dir} in {results['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A burst of long requests the moment a freshly started server says it is ready.

Starts `playhead serve` as its own process, polls /ready, then sends N long requests at
once from this process and reads every admitted stream to its end like a 1x player would
(the client-side player of benchmarks/player.py). Prints how many were admitted against
the calibrated capacity, how fast the 429s came back (with their Retry-After), and whether
the admitted streams played without a stall, by the client's players and by the server's
own stall metric (`playhead_stalls_total`: the server's 1x playback clock).

The client is lean on purpose, so that its own cost does not dominate what it measures on
a small machine: the N connections are opened after /ready and *before* the burst (their
TCP set-up is not in the figures), the requests are pre-built raw HTTP/1.1 bytes written
one after the other, and responses are parsed by hand (no httpx in the burst). A 429's
client-side time runs from its request's write to its status line and headers being read,
so it still includes this process's own scheduling of 40 sockets. The server-side time is
`playhead_rejection_seconds` (app/admission_gate.py: from its admission check to the 429
sent; uvicorn's parsing and the middleware before it are not in it), read from the
histogram's buckets, so its p50 and max are bucket bounds.

With `--hog`, a CPU-bound process (a busy loop) runs beside the server from before its
start to the end of the burst: the calibration and the burst then see a machine whose
cores are shared, as on a busy host. `--runs N` repeats the whole (a fresh server each
time) and prints each run's figures.

    python -m benchmarks.startup_burst [--config configs/default.yaml] [--requests 40]
        [--runs 5] [--hog] [--set admission.start_cost=0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import httpx

from benchmarks.player import Player

LONG_TEXT = (
    "Every word of this request is here to make a long answer for the start-up burst, "
    "so that each admitted stream plays for a good while. "
) * 4
RATE_HZ = 24000
BYTES_PER_SECOND = 2 * RATE_HZ  # 16-bit mono PCM


def _request_bytes(host: str) -> bytes:
    body = json.dumps(
        {"model": "tts-1", "input": LONG_TEXT, "voice": "alloy", "response_format": "pcm"}
    ).encode()
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def _one(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sent_s: float
) -> dict[str, object]:
    try:
        status, headers = await _read_head(reader)
        answered_s = time.monotonic() - sent_s
        if status != 200:
            await reader.read()
            return {
                "status": status,
                "answered_s": answered_s,
                "retry_after": headers.get("retry-after"),
            }
        player = Player()
        first_audio_s = None
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    break
                piece = await reader.readexactly(size + 2)
                now_s = time.monotonic()
                first_audio_s = first_audio_s or now_s - sent_s
                player.feed(now_s, (len(piece) - 2) / BYTES_PER_SECOND)
        else:
            while piece := await reader.read(65536):
                now_s = time.monotonic()
                first_audio_s = first_audio_s or now_s - sent_s
                player.feed(now_s, len(piece) / BYTES_PER_SECOND)
        playback = player.result()
        return {
            "status": 200,
            "answered_s": answered_s,
            "first_audio_s": first_audio_s,
            "stalls": playback.stall_count(),
            "stall_s": sum(playback.stalls_s),
        }
    finally:
        writer.close()


async def _burst(host: str, port: int, requests: int) -> list[dict[str, object]]:
    connections = [await asyncio.open_connection(host, port) for _ in range(requests)]
    request = _request_bytes(f"{host}:{port}")
    tasks = []
    for reader, writer in connections:
        sent_s = time.monotonic()
        writer.write(request)
        tasks.append(asyncio.ensure_future(_one(reader, writer, sent_s)))
    return await asyncio.gather(*tasks)


def _histogram(metrics: str, name: str) -> tuple[list[tuple[float, float]], float, float]:
    """(upper bound, cumulative count) buckets, sum and count of a Prometheus histogram."""
    buckets = []
    total = count = 0.0
    for line in metrics.splitlines():
        match = re.match(rf'^{name}_bucket\{{le="([^"]+)"\}} (\S+)$', line)
        if match:
            buckets.append((float(match.group(1)), float(match.group(2))))
        elif line.startswith(f"{name}_sum "):
            total = float(line.split()[-1])
        elif line.startswith(f"{name}_count "):
            count = float(line.split()[-1])
    return buckets, total, count


def _bucket_quantile(buckets: list[tuple[float, float]], count: float, q: float) -> float:
    for bound, cumulative in buckets:
        if cumulative >= q * count:
            return bound
    return float("inf")


def _bucket_at(metrics: str, name: str, le_s: float) -> float:
    """The cumulative count of histogram `name` at its bucket bound `le_s` (0 if none)."""
    buckets, _, _ = _histogram(metrics, name)
    return next((count for bound, count in buckets if abs(bound - le_s) < 1e-9), 0.0)


def _metric(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
        help="a server setting (playhead serve --set), e.g. admission.start_cost=0",
    )  # fmt: skip
    parser.add_argument("--runs", type=int, default=1, help="fresh servers, one after another")
    parser.add_argument("--hog", action="store_true", help="a CPU-bound process beside it")
    args = parser.parse_args()
    for run in range(args.runs):
        if args.runs > 1:
            print(f"--- run {run + 1} of {args.runs}{' (beside a CPU hog)' if args.hog else ''}")
        hog = (
            subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            if args.hog
            else None
        )
        try:
            _one_run(args)
        finally:
            if hog is not None:
                os.killpg(hog.pid, signal.SIGTERM)
                hog.wait(timeout=10)


def _one_run(args: argparse.Namespace) -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--config", args.config,
         "--host", "127.0.0.1", "--port", str(args.port),
         *(f"--set={override}" for override in args.overrides)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    base_url = f"http://127.0.0.1:{args.port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(base_url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        else:
            raise SystemExit("the server never became ready")
        results = asyncio.run(_burst("127.0.0.1", args.port, args.requests))
        metrics = httpx.get(base_url + "/metrics", timeout=5).text
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    capacity = _metric(metrics, "playhead_capacity_audio_seconds_per_second")
    admitted = [r for r in results if r["status"] == 200]
    refused = [r for r in results if r["status"] == 429]
    other = [r for r in results if r["status"] not in (200, 429)]
    print(
        f"{args.config}: {args.requests} requests at /ready, capacity now {capacity:.2f} audio s/s"
    )
    waited = _metric(metrics, "playhead_start_wait_seconds_count") - _bucket_at(
        metrics, "playhead_start_wait_seconds", 0.01
    )
    print(
        f"admitted {len(admitted)} ({waited:.0f} after waiting in the queue), answered 429 "
        f"{len(refused)}, other {len(other)}"
    )
    if refused:
        waits = sorted(float(r["answered_s"]) for r in refused)
        retry_afters = sorted({str(r["retry_after"]) for r in refused})
        print(
            f"429s, client side (write -> headers read): p50 {1000 * statistics.median(waits):.1f}"
            f" ms, max {1000 * waits[-1]:.1f} ms; Retry-After on "
            f"{sum(r['retry_after'] is not None for r in refused)}/{len(refused)} "
            f"(values {', '.join(retry_afters)})"
        )
        buckets, total, count = _histogram(metrics, "playhead_rejection_seconds")
        if count:
            print(
                f"429s, server side (admission gate -> 429 sent): mean "
                f"{1000 * total / count:.2f} ms, "
                f"p50 <= {1000 * _bucket_quantile(buckets, count, 0.5):g} ms, "
                f"max <= {1000 * _bucket_quantile(buckets, count, 1.0):g} ms "
                f"({count:.0f} refusals)"
            )
    stalled = [r for r in admitted if int(r["stalls"]) > 0]
    worst_ms = max((1000 * float(r["stall_s"]) for r in admitted), default=0.0)
    print(
        f"admitted streams with a stall >= 10 ms (client players): {len(stalled)}/{len(admitted)}"
        f"; most stall time in one stream {worst_ms:.0f} ms; uninterrupted (no stall >= 150 "
        f"ms) {sum(1000 * float(r['stall_s']) < 150 for r in admitted)}/{len(admitted)}"
    )
    first_audio = sorted(
        1000 * float(r["first_audio_s"]) for r in admitted if r["first_audio_s"] is not None
    )
    if first_audio:
        # the streams beyond what fit at once waited in admission's queue
        print(
            "admitted streams' first audio (client side, write -> first audio bytes), ms: "
            + ", ".join(f"{ms:.0f}" for ms in first_audio)
        )
    stalls = _metric(metrics, "playhead_stalls_total")
    stall_ms = 1000 * _metric(metrics, "playhead_stall_seconds_total")
    print(f"server-side stalls (playhead_stalls_total): {stalls:.0f}, {stall_ms:.0f} ms in all")


if __name__ == "__main__":
    main()

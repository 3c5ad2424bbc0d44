"""A burst of long requests the moment a freshly started server says it is ready.

Starts `playhead serve` as its own process, polls /ready, then sends N long requests at
once from this process and reads every admitted stream to its end like a 1x player would
(the client-side player of benchmarks/player.py). Prints how many were admitted against
the calibrated capacity, how fast the 429s came back (with their Retry-After), and whether
the admitted streams played without a stall.

    python -m benchmarks.startup_burst [--config configs/default.yaml] [--requests 40]
"""

from __future__ import annotations

import argparse
import asyncio
import os
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


async def _one(client: httpx.AsyncClient, url: str, sent_s: float) -> dict[str, object]:
    body = {"model": "tts-1", "input": LONG_TEXT, "voice": "alloy", "response_format": "pcm"}
    async with client.stream("POST", url, json=body) as response:
        answered_s = time.monotonic() - sent_s
        if response.status_code != 200:
            await response.aread()
            return {
                "status": response.status_code,
                "answered_s": answered_s,
                "retry_after": response.headers.get("retry-after"),
            }
        player = Player()
        async for piece in response.aiter_raw():
            player.feed(time.monotonic(), len(piece) / 2 / RATE_HZ)
        return {"status": 200, "answered_s": answered_s, "stalls": player.result().stall_count()}


async def _burst(base_url: str, requests: int) -> list[dict[str, object]]:
    limits = httpx.Limits(max_connections=requests + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        sent_s = time.monotonic()
        url = base_url + "/v1/audio/speech"
        return await asyncio.gather(*(_one(client, url, sent_s) for _ in range(requests)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--port", type=int, default=8470)
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--config", args.config,
         "--host", "127.0.0.1", "--port", str(args.port)],
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
        results = asyncio.run(_burst(base_url, args.requests))
        metrics = httpx.get(base_url + "/metrics", timeout=5).text
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    capacity = next(
        (line.split()[-1] for line in metrics.splitlines()
         if line.startswith("playhead_capacity_audio_seconds_per_second")),
        "?",
    )  # fmt: skip
    admitted = [r for r in results if r["status"] == 200]
    refused = [r for r in results if r["status"] == 429]
    other = [r for r in results if r["status"] not in (200, 429)]
    print(f"{args.config}: {args.requests} requests at /ready, capacity now {capacity} audio s/s")
    print(f"admitted {len(admitted)}, answered 429 {len(refused)}, other {len(other)}")
    if refused:
        waits = sorted(float(r["answered_s"]) for r in refused)
        print(
            f"429s answered in p50 {1000 * statistics.median(waits):.0f} ms, "
            f"max {1000 * waits[-1]:.0f} ms; Retry-After present on "
            f"{sum(r['retry_after'] is not None for r in refused)}/{len(refused)}"
        )
    stalled = [r for r in admitted if int(r["stalls"]) > 0]
    print(f"admitted streams with a stall: {len(stalled)}/{len(admitted)}")


if __name__ == "__main__":
    main()

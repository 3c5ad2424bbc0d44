"""One stream's text never costs the others: first audio of short requests while one
pathological input (4,096 characters that cannot be split into words, or that expand
five-fold when normalised) is being spoken, and the server's memory before and after.

    python -m benchmarks.hostile_text [--config configs/default.yaml] [--port 8160]

For each hostile text: a client starts it (pcm, reading as fast as it comes), and while it
runs, `--probes` short requests are sent one after another; each one's time to the first
audio byte is compared with the same probes on the idle server. The hostile client then
leaves (a cancel) and the RSS is read after `--settle-s`. Prints a table; the figures go
to the README's operations section.
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
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PROBE = {"model": "tts-1", "input": "Hello there, how are you today?", "voice": "alloy"}
WARM_TEXT = (
    "Once upon a time, in a small town by the sea, there lived a baker who rose before the "
    "sun every morning, long before the fishermen, and her bread was famous for miles "
    "around, so that people came from the neighbouring villages, on foot and by cart, just "
    "to buy a loaf of it while it was still warm. "
) * 4
HOSTILE = {
    "4096 emoji after a word": "Look " + "\U0001f600" * 4091,
    "4096 CJK characters": "\u6f22" * 4096,
    "a + 4095 combining accents": "a" + "\u0301" * 4095,
    "4096 letters, no space": "a" * 4096,
    "4096 digits (20k chars said)": "9" * 4096,
    "a URL of 4096 characters": "http://" + "a." * 2044,
}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def ttfa_s(client: httpx.AsyncClient, body: dict[str, object]) -> float:
    started = time.monotonic()
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        response.raise_for_status()
        first: float | None = None
        async for _ in response.aiter_bytes():
            if first is None:
                first = time.monotonic() - started
    assert first is not None
    return first


async def probes(client: httpx.AsyncClient, count: int) -> list[float]:
    return [await ttfa_s(client, {**PROBE, "response_format": "pcm"}) for _ in range(count)]


async def measure(base: str, pid: int, count: int, settle_s: float) -> list[tuple[str, ...]]:
    rows = []
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        await probes(client, 2)  # warm
        # and one ordinary long answer: the model's buffers reach their working size
        await ttfa_s(client, {**PROBE, "input": WARM_TEXT, "response_format": "pcm"})
        await asyncio.sleep(settle_s)
        baseline_mib = rss_mib(pid)
        idle = statistics.median(await probes(client, count))
        rows.append(("idle server", f"{idle * 1000:.0f}", "-", f"{baseline_mib:.0f}", "-", "-"))
        for name, text in HOSTILE.items():
            body = {"model": "tts-1", "input": text, "voice": "alloy", "response_format": "pcm"}
            hostile_status: list[int] = []

            async def hostile(
                body: dict[str, object] = body, hostile_status: list[int] = hostile_status
            ) -> None:
                async with client.stream("POST", "/v1/audio/speech", json=body) as response:
                    hostile_status.append(response.status_code)
                    async for _ in response.aiter_bytes():
                        pass

            task = asyncio.ensure_future(hostile())
            await asyncio.sleep(0.3)
            during = await probes(client, count)
            peak_mib = rss_mib(pid)
            task.cancel()  # the hostile client leaves
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.sleep(settle_s)
            after_mib = rss_mib(pid)
            rows.append(
                (
                    name,
                    f"{statistics.median(during) * 1000:.0f}",
                    f"{(statistics.median(during) - idle) * 1000:+.0f}",
                    f"{peak_mib:.0f}",
                    f"{after_mib:.0f} ({(after_mib / baseline_mib - 1) * 100:+.1f}%)",
                    str(hostile_status[0] if hostile_status else "-"),
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    parser.add_argument("--port", type=int, default=8160)
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--settle-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYHEAD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argv_ = [sys.executable, "-m", "app", "serve", "--config", args.config]
    argv_ += ["--port", str(args.port), "--set", "server.log_level=warning"]
    # probes follow each other faster than their audio plays: admission would count them
    argv_ += ["--set", "admission.enabled=false"]
    proc = subprocess.Popen(argv_, cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{args.port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not become ready")
            time.sleep(0.5)
        rows = asyncio.run(measure(base, proc.pid, args.probes, args.settle_s))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    header = ("hostile input", "probe TTFA ms", "vs idle", "RSS during MiB", "RSS after", "status")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

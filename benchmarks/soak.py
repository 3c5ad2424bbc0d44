"""Soak: M minutes of mixed, partly hostile load on a real `playhead serve` process.

    make soak MINUTES=10                      # the default voice (configs/default.yaml)
    python -m benchmarks.soak --minutes 2 --config configs/sim.yaml

It starts the server (its own process, so that its memory is its own), waits for /ready,
and runs `--clients` workers until the time is up. Each worker loops over a weighted mix:

- a whole answer in each format (mp3, opus, aac, flac, wav, pcm): 200, and a body that
  decodes (wav: a RIFF header; pcm: whole samples);
- SSE: deltas, then `speech.audio.done`;
- the WebSocket: session.config, text in pieces, input.done, audio, audio.done;
- a cancel: the client reads part of a streamed body and closes the connection;
- a disconnect: the client gives up before the answer starts;
- bad bodies (malformed or deep JSON, NaN, a lone surrogate, a NUL, huge numbers, wrong
  types): a 4xx with OpenAI's envelope.

A 429 (admission) is expected under load and counted, not an error. Anything else is an
unexpected error: a 5xx, a transport error where no cancel was meant, a body that does not
decode, an SSE or WebSocket answer without its end. Every `--sample-s` it reads the
server's RSS (/proc) and its /metrics. At the end it stops the load, lets the server
settle, reads the RSS again, then SIGTERMs the server and checks that it exits 0 without a
traceback (graceful shutdown, app/shutdown.py).

Report: requests by kind and outcome, unexpected errors (with the first few), memory (the
baseline after warm-up, the peak, the end, the growth), the server's stall metrics and
TTFA (client-side p50/p95 of the first audio byte). Written to
benchmarks/results/soak-latest.json as well. Exit status 1 when there was an unexpected
error or the memory grew by more than `--max-growth` (5% by default).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import httpx
import websockets

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "soak-latest.json"
SPEECH = "/v1/audio/speech"
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
DEMUXER = {"mp3": "mp3", "opus": "ogg", "aac": "aac", "flac": "flac", "wav": "wav"}
TEXTS = (
    "Hello there.",
    "The meeting moved to Thursday at 3:30 pm, in room 4B.",
    "It cost $1,249.99 on 12 March 2024; the refund took 14 days.",
    "Streaming speech has to start quickly and never run dry, even when many people "
    "listen at once. That is what the scheduler is for.",
    "Once upon a time, in a small town by the sea, there lived a baker who rose before "
    "the sun every morning. Her bread was famous for miles around, and people came from "
    "the neighbouring villages just to buy a loaf. One winter, the ovens went cold.",
)
BAD_BODIES: tuple[bytes, ...] = (
    b'{"model": "tts-1", "input": ',
    b"[" * 1000 + b"]" * 1000,
    b'{"model":"tts-1","input":"hi","voice":"alloy","speed":NaN}',
    b'{"model":"tts-1","input":"hi \\ud800","voice":"alloy"}',
    b'{"model":"tts-1","input":"a\\u0000b","voice":"alloy"}',
    b'{"model":"tts-1","input":"hi","voice":"alloy","speed":' + b"9" * 5000 + b"}",
    b'{"model":"tts-1","input":"hi","voice":"alloy","speed":1e999}',
    b'{"model":5,"input":"hi","voice":"alloy"}',
    b'{"model":"tts-1","input":"","voice":"alloy"}',
    b'{"model":"tts-1","input":"\xf0\x9f\x98\x80\xf0\x9f\x98\x80","voice":"alloy"}',
    b'{"model":"tts-1","input":"hi","voice":"nobody\\nFORGED LOG LINE"}',
    b"\xff\xfe\x00",
    b'"just a string"',
)
# kind -> weight
MIX = {
    "audio": 30,
    "sse": 15,
    "websocket": 15,
    "cancel": 12,
    "disconnect": 8,
    "bad_body": 20,
}


@dataclass
class Tally:
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    ttfa_s: list[float] = field(default_factory=list)
    retry_after_s: float = 0.0  # the last 429's Retry-After, for its worker to honour

    def ok(self, kind: str, outcome: str = "ok") -> None:
        self.outcomes[(kind, outcome)] += 1

    def error(self, kind: str, what: str) -> None:
        self.outcomes[(kind, "UNEXPECTED")] += 1
        if len(self.errors) < 50:
            self.errors.append(f"{kind}: {what}"[:300])


def refused(tally: Tally, kind: str, response: httpx.Response) -> None:
    """A 429: counted (expected under load); its worker waits Retry-After, as clients do."""
    tally.ok(kind, "429")
    tally.retry_after_s = float(response.headers.get("retry-after", "1"))


def speech(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": "tts-1", "input": text, "voice": "alloy", **fields}


def decodes(data: bytes, fmt: str) -> bool:
    if fmt == "pcm":
        return len(data) > 0 and len(data) % 2 == 0
    if fmt == "wav" and data[:4] != b"RIFF":
        return False
    try:
        with av.open(io.BytesIO(data), format=DEMUXER[fmt]) as container:
            stream = container.streams.audio[0]
            return sum(frame.samples for frame in container.decode(stream)) > 0
    except (av.error.FFmpegError, IndexError, ValueError):
        return False


async def run_audio(client: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    fmt = rng.choice(FORMATS)
    started = time.monotonic()
    first: float | None = None
    body = bytearray()
    async with client.stream(
        "POST", SPEECH, json=speech(rng.choice(TEXTS), response_format=fmt)
    ) as r:
        if r.status_code == 429:
            return refused(tally, "audio", r)
        if r.status_code != 200:
            return tally.error(
                "audio", f"{fmt}: status {r.status_code}: {(await r.aread())[:200]!r}"
            )
        async for part in r.aiter_bytes():
            if first is None:
                first = time.monotonic() - started
            body += part
    if first is not None:
        tally.ttfa_s.append(first)
    if not decodes(bytes(body), fmt):
        return tally.error("audio", f"{fmt}: {len(body)} bytes do not decode")
    tally.ok("audio")


async def run_sse(client: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    body = speech(rng.choice(TEXTS), stream_format="sse", response_format=rng.choice(FORMATS))
    started = time.monotonic()
    events: list[dict[str, Any]] = []
    async with client.stream("POST", SPEECH, json=body) as r:
        if r.status_code == 429:
            return refused(tally, "sse", r)
        if r.status_code != 200:
            return tally.error("sse", f"status {r.status_code}")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                if not events:
                    tally.ttfa_s.append(time.monotonic() - started)
                events.append(json.loads(line[6:]))
    if not events or events[-1].get("type") != "speech.audio.done":
        last = events[-1] if events else None
        return tally.error("sse", f"no speech.audio.done at the end: {str(last)[:200]}")
    tally.ok("sse")


async def run_websocket(base_ws: str, tally: Tally, rng: random.Random, key: str | None) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with websockets.connect(
        base_ws + "/v1/audio/speech/stream", additional_headers=headers, open_timeout=10
    ) as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": "alloy"}))
        text = rng.choice(TEXTS)
        words = text.split(" ")
        cut = max(1, len(words) // 2)
        for piece in (" ".join(words[:cut]) + " ", " ".join(words[cut:])):
            await ws.send(json.dumps({"type": "input.text", "text": piece}))
        await ws.send(json.dumps({"type": "input.done"}))
        audio = 0
        while True:
            message = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(message, bytes):
                audio += len(message)
                continue
            event = json.loads(message)
            if event["type"] == "audio.done":
                break
            if event["type"] == "error":
                code = event["error"].get("code")
                if code == "rate_limit_exceeded":
                    tally.retry_after_s = 1.0
                    return tally.ok("websocket", "429")
                return tally.error("websocket", f"error event {event['error']}")
        await ws.send(json.dumps({"type": "session.close"}))
    if audio == 0:
        return tally.error("websocket", "audio.done without audio")
    tally.ok("websocket")


async def run_cancel(client: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    body = speech(TEXTS[-1], response_format=rng.choice(FORMATS))
    async with client.stream("POST", SPEECH, json=body) as r:
        if r.status_code == 429:
            return refused(tally, "cancel", r)
        if r.status_code != 200:
            return tally.error("cancel", f"status {r.status_code}")
        async for _ in r.aiter_bytes():
            break  # one piece of audio, then the client leaves
    tally.ok("cancel")


async def run_disconnect(base: str, tally: Tally, rng: random.Random, key: str | None) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:  # gives up before any answer can come
        async with httpx.AsyncClient(base_url=base, timeout=rng.uniform(0.005, 0.05)) as c:
            await c.post(SPEECH, json=speech(TEXTS[-1]), headers=headers)
    except httpx.TimeoutException:
        return tally.ok("disconnect")
    tally.ok("disconnect", "answered")


async def run_bad_body(client: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    r = await client.post(SPEECH, content=rng.choice(BAD_BODIES))
    if not 400 <= r.status_code < 500:
        return tally.error("bad_body", f"status {r.status_code}: {r.text[:200]}")
    error = r.json().get("error", {})
    if set(error) != {"message", "type", "param", "code"}:
        return tally.error("bad_body", f"not the envelope: {r.text[:200]}")
    tally.ok("bad_body")


async def worker(
    index: int, base: str, deadline: float, tally: Tally, key: str | None, seed: int
) -> None:
    rng = random.Random(seed * 1000 + index)
    kinds, weights = zip(*MIX.items(), strict=True)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    base_ws = "ws" + base[len("http") :]
    async with httpx.AsyncClient(base_url=base, timeout=120, headers=headers) as client:
        while time.monotonic() < deadline:
            kind = rng.choices(kinds, weights)[0]
            try:
                if kind == "audio":
                    await run_audio(client, tally, rng)
                elif kind == "sse":
                    await run_sse(client, tally, rng)
                elif kind == "websocket":
                    await run_websocket(base_ws, tally, rng, key)
                elif kind == "cancel":
                    await run_cancel(client, tally, rng)
                elif kind == "disconnect":
                    await run_disconnect(base, tally, rng, key)
                else:
                    await run_bad_body(client, tally, rng)
            except Exception as exc:  # a transport error where none was meant
                tally.error(kind, f"{type(exc).__name__}: {exc}")
            wait_s, tally.retry_after_s = min(tally.retry_after_s, 10.0), 0.0
            await asyncio.sleep(wait_s * rng.uniform(0.5, 1.0) + rng.uniform(0.0, 0.2))


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def metric(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}{re.escape('{' + labels + '}') if labels else ''} (\S+)$"
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else 0.0


def labelled_sum(text: str, name: str) -> float:
    """The sum of a labelled metric's samples."""
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}\{{.*\}} (\S+)$", text, re.M))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def soak(args: argparse.Namespace, base: str, pid: int) -> dict[str, Any]:
    tally = Tally()
    key = args.api_key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    started = time.monotonic()
    deadline = started + args.minutes * 60
    warmup_s = min(60.0, args.minutes * 60 * 0.2)
    samples: list[tuple[float, int]] = []
    workers = [
        asyncio.ensure_future(worker(i, base, deadline, tally, key, args.seed))
        for i in range(args.clients)
    ]
    async with httpx.AsyncClient(base_url=base, timeout=10, headers=headers) as probe:
        last_report = started
        while not all(w.done() for w in workers):
            await asyncio.sleep(args.sample_s)
            now = time.monotonic()
            samples.append((now - started, rss_bytes(pid)))
            if now - last_report >= 30:
                last_report = now
                done = sum(n for (_, o), n in tally.outcomes.items() if o != "UNEXPECTED")
                print(
                    f"  {now - started:6.0f} s: {done} requests, "
                    f"{len(tally.errors)} unexpected, RSS {samples[-1][1] / 2**20:.0f} MiB",
                    flush=True,
                )
        await asyncio.gather(*workers)
        await asyncio.sleep(args.settle_s)  # streams end, buffers are freed
        end_rss = rss_bytes(pid)
        metrics = (await probe.get("/metrics")).text
    # the baseline: the median RSS over the 30 s after the warm-up (allocator pools filled)
    window = [rss for t, rss in samples if warmup_s <= t < warmup_s + 30]
    baseline = sorted(window or [rss for _, rss in samples])[len(window or samples) // 2]
    peak = max(rss for _, rss in samples)
    kinds = sorted({kind for kind, _ in tally.outcomes})
    return {
        "minutes": args.minutes,
        "config": args.config,
        "clients": args.clients,
        "outcomes": {
            kind: {o: n for (k, o), n in sorted(tally.outcomes.items()) if k == kind}
            for kind in kinds
        },
        "unexpected_errors": sum(n for (_, o), n in tally.outcomes.items() if o == "UNEXPECTED"),
        "first_errors": tally.errors[:10],
        "memory": {
            "baseline_mib": round(baseline / 2**20, 1),
            "peak_mib": round(peak / 2**20, 1),
            "end_mib": round(end_rss / 2**20, 1),
            "growth_pct": round(100 * (end_rss - baseline) / baseline, 2),
            "baseline": f"median over {warmup_s:.0f}..{warmup_s + 30:.0f} s",
        },
        "server": {
            "streams_done": metric(metrics, "playhead_streams_total", 'state="done"'),
            "streams_cancelled": metric(metrics, "playhead_streams_total", 'state="cancelled"'),
            "streams_failed": metric(metrics, "playhead_streams_total", 'state="failed"'),
            "rejected_429": labelled_sum(metrics, "playhead_admission_rejections_total"),
            "capacity_audio_s_per_s": metric(metrics, "playhead_capacity_audio_seconds_per_second"),
            "stalls": metric(metrics, "playhead_stalls_total"),
            "stall_s": metric(metrics, "playhead_stall_seconds_total"),
            "audio_s": metric(metrics, "playhead_audio_seconds_total"),
            "stage_timeouts": labelled_sum(metrics, "playhead_stage_timeouts_total"),
        },
        "ttfa_s": {
            "p50": percentile(tally.ttfa_s, 0.5),
            "p95": percentile(tally.ttfa_s, 0.95),
            "n": len(tally.ttfa_s),
        },
    }


def start_server(args: argparse.Namespace) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYHEAD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "app", "serve", "--config", args.config, "--port", str(args.port)]
    argv += ["--set", "server.log_level=warning"]
    if args.api_key:
        argv += ["--set", f"server.api_key={args.api_key}"]
    for item in args.set:
        argv += ["--set", item]
    log = open(args.server_log, "w")  # noqa: SIM115 (closed by the caller's process end)
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
    )


def wait_ready(base: str, proc: subprocess.Popen[str], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not become ready")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    parser.add_argument("--clients", type=int, default=6, help="concurrent client loops")
    parser.add_argument("--port", type=int, default=8150)
    parser.add_argument("--api-key", default="soak-key", help="run with this key ('' = none)")
    parser.add_argument("--set", action="append", default=[], help="a server override")
    parser.add_argument("--sample-s", type=float, default=2.0)
    parser.add_argument("--settle-s", type=float, default=10.0)
    parser.add_argument("--max-growth", type=float, default=5.0, help="percent")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--server-log", default="/tmp/playhead-soak-server.log")
    args = parser.parse_args(argv)
    base = f"http://127.0.0.1:{args.port}"
    print(f"soak: {args.minutes:g} min, {args.clients} clients, {args.config}", flush=True)
    proc = start_server(args)
    try:
        wait_ready(base, proc)
        report = asyncio.run(soak(args, base, proc.pid))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    server_log = Path(args.server_log).read_text(errors="replace")
    report["server_exit"] = proc.returncode
    report["server_tracebacks"] = server_log.count("Traceback")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    ttfa = report["ttfa_s"]
    memory = report["memory"]
    failed = (
        report["unexpected_errors"] > 0
        or memory["growth_pct"] > args.max_growth
        or report["server_exit"] != 0
        or report["server_tracebacks"] > 0
    )
    print(
        f"\nsoak {'FAILED' if failed else 'passed'}: {report['unexpected_errors']} unexpected "
        f"errors; RSS {memory['baseline_mib']} -> {memory['end_mib']} MiB "
        f"({memory['growth_pct']:+.1f}%, peak {memory['peak_mib']}); stalls "
        f"{report['server']['stalls']:.0f} ({report['server']['stall_s']:.2f} s) over "
        f"{report['server']['audio_s']:.0f} s of audio; TTFA p50 "
        f"{(ttfa['p50'] or 0) * 1000:.0f} ms p95 {(ttfa['p95'] or 0) * 1000:.0f} ms; server "
        f"exit {report['server_exit']}, {report['server_tracebacks']} tracebacks"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The peer in `make bench-voice`: piper's own HTTP server, measured like Playhead.

`python -m piper.http_server -m <voice.onnx>` (Flask, one thread per request) answers
POST /synthesize {"text": ...} with a whole WAV file once the whole text is synthesised.
The client here plays that WAV through the same 1x player (benchmarks/player.py) as the
bytes arrive: TTFA is the first byte of the WAV body (the first audio sample, since the
44-byte header and the samples leave together), durations come from the WAV's format.

`peer_closed_loop` has the semantics of `benchmarks.loadgen.closed_loop` (a listener
sends its next request once it has heard the last one, or at its last byte; measured
requests are those sent in [warmup_s, duration_s) or the first `count`; unmeasured ones
keep the load up until the last measured one ends; xRT counts every audio arrival in the
window), because loadgen's loop only speaks OpenAI's API.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from benchmarks.loadgen import (
    NEXT_REQUEST,
    Arrival,
    Clock,
    LoadResult,
    RequestOptions,
    RequestResult,
    Tracker,
)
from benchmarks.player import (
    Outcome,
    Player,
    StreamRecord,
    listening_in_window,
    summarize,
)

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def piper_server(model_path: Path, log_path: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """piper's HTTP server on a free loopback port; yields its base URL once it answers."""
    port = free_port()
    command = [
        sys.executable, "-m", "piper.http_server", "-m", str(model_path),
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    log = log_path.open("w", encoding="utf-8")
    proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"piper's server exited with {proc.returncode}; see {log_path}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/info", timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"piper's server not up after {timeout_s} s; see {log_path}")
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


class WavReader:
    """Seconds of audio in a WAV body read piece by piece (RIFF chunks up to "data")."""

    def __init__(self) -> None:
        self._head = b""
        self._bytes_per_s: float | None = None
        self._frame_bytes = 2
        self._odd = 0  # bytes of a sample frame split across reads

    def feed(self, data: bytes) -> float:
        if self._bytes_per_s is None:
            self._head += data
            start = self._parse()
            if start is None:
                return 0.0
            data, self._head = self._head[start:], b""
        usable = (self._odd + len(data)) // self._frame_bytes * self._frame_bytes
        self._odd = self._odd + len(data) - usable
        assert self._bytes_per_s is not None
        return usable / self._bytes_per_s

    def _parse(self) -> int | None:
        head = self._head
        if len(head) < 12:
            return None
        if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            raise ValueError("not a WAV body")
        pos = 12
        rate_hz = channels = bits = 0
        while pos + 8 <= len(head):
            tag, size = head[pos : pos + 4], struct.unpack_from("<I", head, pos + 4)[0]
            if tag == b"data":
                if not rate_hz:
                    raise ValueError("WAV data before its fmt chunk")
                self._frame_bytes = channels * bits // 8
                self._bytes_per_s = float(rate_hz * self._frame_bytes)
                return pos + 8
            if pos + 8 + size > len(head):
                return None
            if tag == b"fmt ":
                channels, rate_hz = struct.unpack_from("<HI", head, pos + 10)
                bits = struct.unpack_from("<H", head, pos + 22)[0]
            pos += 8 + size + (size & 1)
        return None


async def peer_request(
    client: httpx.AsyncClient, base_url: str, text: str, clock: Clock, tracker: Tracker
) -> RequestResult:
    """POST /synthesize and play the WAV as it arrives. Never raises for HTTP errors."""
    player = Player()
    tracker.players.add(player)
    arrivals: list[Arrival] = []
    sent = answered = clock()
    status: int | None = None
    outcome, error = Outcome.FAILED, None
    try:
        async with client.stream(
            "POST", base_url.rstrip("/") + "/synthesize", json={"text": text}
        ) as response:
            answered = clock()
            status = response.status_code
            if status != 200:
                error = (await response.aread()).decode("utf-8", "replace")[:300]
            else:
                wav = WavReader()
                async for data in response.aiter_raw():
                    now = clock()
                    seconds = wav.feed(data)
                    if seconds > 0:
                        player.feed(now, seconds)
                        arrivals.append(Arrival(now, seconds))
                        tracker.arrivals.append(arrivals[-1])
                outcome = Outcome.OK
    except (httpx.HTTPError, OSError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        tracker.players.discard(player)
    record = StreamRecord(
        outcome=outcome,
        sent_at_s=sent,
        answered_at_s=answered,
        finished_at_s=clock(),
        playback=player.result(),
        text_chars=len(text),
        http_status=status,
        error=error,
    )
    return RequestResult(record, tuple(arrivals))


async def peer_closed_loop(
    base_url: str,
    texts: Sequence[str],
    *,
    streams: int,
    duration_s: float | None = None,
    count: int | None = None,
    warmup_s: float = 0.0,
    seed: int = 0,
    slo_s: float = 1.0,
    timeout_s: float = 300.0,
    next_request: str = "after_playback",
) -> LoadResult:
    """N listeners against piper's server, each sending its next text when it has heard
    the last one (or, `next_request="after_last_byte"`, when its WAV has arrived)."""
    if duration_s is None and count is None:
        raise ValueError("give duration_s or count (or both)")
    if next_request not in NEXT_REQUEST:
        raise ValueError(f"next_request must be one of {NEXT_REQUEST}, got {next_request!r}")
    clock, tracker = Clock(), Tracker()
    measured: list[RequestResult] = []
    background: list[RequestResult] = []
    issued = in_flight = 0
    first_measured_s: float | None = None
    last_finished_s = 0.0
    done = asyncio.Event()

    def window_open() -> bool:
        if duration_s is not None and clock() >= duration_s:
            return False
        return count is None or issued < count

    def check() -> None:
        if in_flight == 0 and not window_open() and clock() >= warmup_s:
            done.set()

    async def one_client(index: int, client: httpx.AsyncClient) -> None:
        nonlocal issued, in_flight, first_measured_s, last_finished_s
        rng = random.Random(f"{seed}:{index}")
        while True:
            text = rng.choice(texts)
            is_measured = clock() >= warmup_s and window_open()
            if is_measured:
                issued += 1
                in_flight += 1
                if first_measured_s is None:
                    first_measured_s = clock()
            res = await peer_request(client, base_url, text, clock, tracker)
            (measured if is_measured else background).append(res)
            if is_measured:
                in_flight -= 1
                last_finished_s = max(last_finished_s, res.record.finished_at_s)
                check()
            ended_s = res.record.playback.ended_at_s
            if res.record.outcome is not Outcome.OK:
                await asyncio.sleep(0.5)
            elif next_request == "after_playback" and ended_s is not None:
                await asyncio.sleep(max(0.0, ended_s - clock()))

    def result() -> LoadResult:
        start = first_measured_s if first_measured_s is not None else warmup_s
        end = max(last_finished_s, start + 1e-9)
        received = sum(a.duration_s for a in tracker.arrivals if start <= a.at_s <= end)
        intervals = [
            (pb.started_at_s, pb.ended_at_s)
            for res in measured + background
            if (pb := res.record.playback).started_at_s is not None and pb.ended_at_s is not None
        ]
        intervals += [(p.started_at_s, end) for p in tracker.players if p.started_at_s is not None]
        records = tuple(r.record for r in sorted(measured, key=lambda r: r.record.sent_at_s))
        summary = summarize(
            records,
            wall_s=end - start,
            audio_received_s=received,
            listening_s=listening_in_window(intervals, start, end),
            slo_s=slo_s,
        )
        options = RequestOptions(voice="piper-http", response_format="wav")
        return LoadResult(
            "closed",
            float(streams),
            records,
            summary,
            (start, end),
            len(background),
            options,
            tuple(tracker.arrivals),
        )

    limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4)
    timeout = httpx.Timeout(connect=10.0, read=timeout_s, write=10.0, pool=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        tasks = [asyncio.create_task(one_client(i, client)) for i in range(streams)]
        timer = (
            asyncio.get_running_loop().call_later(max(duration_s, warmup_s) + 1e-3, check)
            if duration_s is not None
            else None
        )
        try:
            limit_s = None if duration_s is None else duration_s + timeout_s
            await asyncio.wait_for(done.wait(), timeout=limit_s)
            return result()  # before the cuts: requests still in flight are playing
        finally:
            if timer is not None:
                timer.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

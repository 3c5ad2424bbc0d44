"""The load generator: a client that plays every stream it receives (see docs/benchmarking.md).

It speaks POST /v1/audio/speech (OpenAI's speech API) over httpx, plays each response
through the simulated 1x player (benchmarks/player.py) as the bytes arrive, and never asks
the server how it did. Reusable for any server speaking that API: every entry point takes
`base_url`, the texts, the load, and `RequestOptions` (format, rate, voice).

Durations: `pcm` is s16le mono at the requested sample rate, so a read of n bytes carries
n / 2 / rate seconds. Encoded formats are decoded with PyAV after the stream ends; each
packet's decoded samples are credited at the arrival time of the read that completed the
packet (an Ogg page for opus), so the player hears them when a real decoder could.

Load:
- closed loop: N listeners, each sends its next request when it has heard its stream to
  the end (or, `next_request="after_last_byte"`, as soon as the last byte arrived);
- open loop: Poisson arrivals at a rate.
Requests sent in [warmup_s, duration_s) (and, with `count`, the first `count` of them) are
measured. To keep the load steady while they play, clients keep sending unmeasured
requests until the last measured stream ends; then everything still running is cancelled.
The window runs from the first measured request to the last measured stream's end; xRT
counts all audio received in it, measured or not (`drain=False` instead cuts the run at
duration_s, for a throughput measurement).

A 429 is recorded (with its Retry-After and answer latency). In the closed loop the client
waits Retry-After and sends the same text again; every attempt is a request of its own
(measured when sent in the window; a rejected one does not use up `count`), and the
accepted one records how long its client waited since the first. In the open loop a
rejected arrival is not retried.

Entry points: `closed_loop`, `open_loop` (async, return a LoadResult with the records, the
Summary of benchmarks/player.py and every arrival), `request_once`, `load_corpus`. Other
servers' clients plug into `closed_loop(request=...)`, with `play_request` and a BodyReader
doing the playing and the recording.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.listening import (
    Arrival,
    BodyReader,
    EncodedReader,
    PcmReader,
    RequestResult,
    StreamRecorder,
    Tracker,
)
from benchmarks.player import (
    Outcome,
    StreamRecord,
    Summary,
    listening_in_window,
    parse_server_timing,
    summarize,
)

CORPUS_PATH = Path(__file__).with_name("corpus.txt")
NEXT_REQUEST = ("after_playback", "after_last_byte")


def load_corpus(path: str | Path = CORPUS_PATH) -> tuple[str, ...]:
    """One text per line; blank lines and lines starting with '#' are skipped."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    texts = tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))
    if not texts:
        raise ValueError(f"no texts in {path}")
    return texts


@dataclass(frozen=True)
class RequestOptions:
    """The body of every request (besides `input`)."""

    voice: str = "alloy"
    model: str = "tts-1"
    response_format: str = "pcm"
    sample_rate_hz: int = 24000
    speed: float = 1.0
    api_key: str | None = None
    timeout_s: float = 120.0  # per read; a stream silent this long fails

    def body(self, text: str) -> dict[str, object]:
        return {
            "model": self.model,
            "input": text,
            "voice": self.voice,
            "response_format": self.response_format,
            "speed": self.speed,
            "sample_rate": self.sample_rate_hz,
        }

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class LoadResult:
    """One load run: measured stream records, the summary, and what shaped it."""

    kind: str  # "closed" or "open"
    load: float  # clients (closed) or arrivals per second (open)
    records: tuple[StreamRecord, ...]  # measured requests, every attempt
    summary: Summary
    window_s: tuple[float, float]  # measured window on the run's clock
    unmeasured_requests: int
    options: RequestOptions = field(default_factory=RequestOptions)
    arrivals: tuple[Arrival, ...] = ()  # all audio the run received, measured or not

    def ttfas_s(self) -> list[float]:
        return [t for r in self.records if r.outcome is Outcome.OK and (t := r.ttfa_s) is not None]

    def burst_throughput(self, gap_s: float = 0.05) -> float:
        """Audio seconds per second after the first burst of the window.

        A server that answers in turns delivers audio in bursts; counting the audio of a
        fixed window can catch one burst more or less than its length deserves. Here the
        arrivals in the window are grouped into bursts (gaps > gap_s), and the audio that
        arrived after the first burst is divided by the time from that burst's last
        arrival to the window's last arrival: whole turns for a server that answers in
        turns, and, for one that streams with few gaps (a fast CPU voice), its rate over
        that span (ending the span at the last burst's first arrival, as this did before
        2026-12-02, counted a long last burst's audio over too short a span: 25-52 audio s
        per s read for 30-32 delivered).
        """
        start, end = self.window_s
        inside = sorted((a for a in self.arrivals if start <= a.at_s <= end), key=lambda a: a.at_s)
        first_end = 0  # index of the first burst's last arrival
        bursts = 1 if inside else 0
        for index in range(1, len(inside)):
            if inside[index].at_s - inside[index - 1].at_s > gap_s:
                bursts += 1
            elif bursts == 1:
                first_end = index
        if bursts < 3:
            return self.summary.xrt
        span_s = inside[-1].at_s - inside[first_end].at_s
        audio_s = sum(a.duration_s for a in inside[first_end + 1 :])
        return audio_s / span_s


async def request_once(
    client: httpx.AsyncClient,
    base_url: str,
    text: str,
    options: RequestOptions,
    clock: Clock,
    waited_s: float = 0.0,
    tracker: Tracker | None = None,
) -> RequestResult:
    """POST /v1/audio/speech and play its stream. Never raises for HTTP or stream errors."""
    reader: BodyReader
    if options.response_format == "pcm":
        reader = PcmReader(options.sample_rate_hz)
    else:
        reader = EncodedReader(options.response_format)
    return await play_request(
        client,
        base_url.rstrip("/") + "/v1/audio/speech",
        text,
        clock,
        body=options.body(text),
        headers=options.headers(),
        reader=reader,
        waited_s=waited_s,
        tracker=tracker,
    )


async def play_request(
    client: httpx.AsyncClient,
    url: str,
    text: str,
    clock: Clock,
    *,
    body: dict[str, object],
    reader: BodyReader,
    headers: dict[str, str] | None = None,
    waited_s: float = 0.0,
    tracker: Tracker | None = None,
) -> RequestResult:
    """POST `body` (JSON) to `url` and play the answer through a 1x player as `reader`
    credits its audio. A non-200 answer is recorded (429: rejected, with its Retry-After),
    never raised, as are HTTP and stream errors."""
    status: int | None = None
    outcome, error, retry_after = Outcome.FAILED, None, None
    timing: dict[str, float] = {}
    with StreamRecorder(clock, text, waited_s=waited_s, tracker=tracker) as recorder:
        answered = recorder.sent_at_s
        try:
            async with client.stream("POST", url, json=body, headers=headers) as response:
                answered = clock()
                status = response.status_code
                if status != 200:
                    error = (await response.aread()).decode("utf-8", "replace")[:300]
                    retry_after = _retry_after(response.headers.get("retry-after"))
                    outcome = Outcome.REJECTED if status == 429 else Outcome.FAILED
                else:
                    timing = parse_server_timing(response.headers.get("server-timing"))
                    async for data in response.aiter_raw():
                        now = clock()
                        recorder.hear(now, reader.feed(now, data))
                    finished = clock()
                    for arrival in reader.flush():
                        recorder.hear(arrival.at_s, arrival.duration_s)
                    outcome = Outcome.OK
        except (httpx.HTTPError, OSError, ValueError) as exc:
            outcome, error, retry_after = Outcome.FAILED, f"{type(exc).__name__}: {exc}", None
    if outcome is not Outcome.OK:
        finished = clock()
    return recorder.result(
        outcome,
        answered_at_s=answered,
        finished_at_s=finished,
        retry_after_s=retry_after,
        http_status=status,
        error=error,
        server_timing=timing,
    )


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


class Clock:
    """Seconds since the run started (perf_counter)."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self._t0


class _Run:
    """Shared state of one run: which requests are measured, and when the run may end."""

    def __init__(
        self, warmup_s: float, duration_s: float | None, count: int | None, drain: bool = True
    ) -> None:
        if duration_s is None and count is None:
            raise ValueError("give duration_s or count (or both)")
        if not drain and duration_s is None:
            raise ValueError("drain=False needs duration_s")
        self.drain = drain
        self.clock = Clock()
        self.warmup_s = warmup_s
        self.duration_s = duration_s
        self.count = count
        self.issued = 0
        self.in_flight = 0
        self.measured: list[RequestResult] = []
        self.background: list[RequestResult] = []
        self.done = asyncio.Event()
        self.first_measured_s: float | None = None
        self.last_finished_s = 0.0
        self.tracker = Tracker()

    def window_open(self) -> bool:
        now = self.clock()
        if self.duration_s is not None and now >= self.duration_s:
            return False
        return self.count is None or self.issued < self.count

    def claim(self) -> bool:
        """Should the request about to be sent be measured?"""
        if self.clock() < self.warmup_s or not self.window_open():
            return False
        self.issued += 1
        self.in_flight += 1
        if self.first_measured_s is None:
            self.first_measured_s = self.clock()
        return True

    def release(self, finished_s: float, counted: bool = True) -> None:
        """A measured request ended; a rejected one (counted=False) leaves `count` room."""
        self.in_flight -= 1
        if not counted:
            self.issued -= 1
        self.last_finished_s = max(self.last_finished_s, finished_s)
        self.check()

    def check(self) -> None:
        now = self.clock()
        cut = not self.drain and now >= (self.duration_s or 0.0)
        drained = self.in_flight == 0 and not self.window_open() and now >= self.warmup_s
        if cut or drained:
            self.done.set()

    def arm(self) -> asyncio.TimerHandle | None:
        """Re-check when the window closes by time (nothing measured may be in flight then)."""
        if self.duration_s is None:
            return None
        delay = max(self.duration_s, self.warmup_s) - self.clock() + 1e-3
        return asyncio.get_running_loop().call_later(max(delay, 0.0), self.check)

    def result(self, kind: str, load: float, options: RequestOptions, slo_s: float) -> LoadResult:
        start = self.first_measured_s if self.first_measured_s is not None else self.warmup_s
        if self.drain:
            end = max(self.last_finished_s, start + 1e-9)
        else:  # cut at the window's end: streams still playing are left out of the records
            start = self.warmup_s
            end = max(float(self.duration_s or 0.0), start + 1e-9)
        received = sum(a.duration_s for a in self.tracker.arrivals if start <= a.at_s <= end)
        intervals = []
        for res in self.measured + self.background:
            pb = res.record.playback
            if pb.started_at_s is not None and pb.ended_at_s is not None:
                intervals.append((pb.started_at_s, pb.ended_at_s))
        for player in self.tracker.players:  # cut at the end: playing or stalled until then
            if player.started_at_s is not None:
                intervals.append((player.started_at_s, end))
        records = tuple(r.record for r in sorted(self.measured, key=lambda r: r.record.sent_at_s))
        summary = summarize(
            records,
            wall_s=end - start,
            audio_received_s=received,
            listening_s=listening_in_window(intervals, start, end),
            slo_s=slo_s,
        )
        return LoadResult(
            kind,
            load,
            records,
            summary,
            (start, end),
            len(self.background),
            options,
            tuple(self.tracker.arrivals),
        )


def _client(streams: int, options: RequestOptions) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=streams + 16, max_keepalive_connections=streams + 16)
    timeout = httpx.Timeout(connect=10.0, read=options.timeout_s, write=10.0, pool=None)
    return httpx.AsyncClient(limits=limits, timeout=timeout)


async def _stop(tasks: Sequence[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# closed_loop's `request=` hook, request_once's signature: (client, base_url, text, options,
# clock, waited_s, tracker) -> the request's result; never raises for HTTP or stream errors.
Requester = Callable[
    [httpx.AsyncClient, str, str, RequestOptions, Clock, float, Tracker | None],
    Awaitable[RequestResult],
]


async def closed_loop(
    base_url: str,
    texts: Sequence[str],
    *,
    streams: int,
    duration_s: float | None = None,
    count: int | None = None,
    warmup_s: float = 0.0,
    options: RequestOptions = RequestOptions(),
    seed: int = 0,
    slo_s: float = 1.0,
    drain_timeout_s: float = 120.0,
    drain: bool = True,
    next_request: str = "after_playback",
    request: Requester = request_once,
) -> LoadResult:
    """N listeners, each sending its next request when its stream ends.

    next_request: "after_playback" (default) sends it when the listener's player has
    played the last sample (N listeners: N players, less the waits for first audio);
    "after_last_byte" sends it as soon as the last byte arrived (N requests always open at
    the server, which is then saturated at any N: a throughput measurement).
    drain=False ends the run at `duration_s` sharp (xRT over [warmup_s, duration_s]);
    only the streams that finished by then are recorded.
    request: how one request is made and played (default: request_once, OpenAI's speech
    API); another server's client goes here, e.g. benchmarks.voice_peer.peer_request."""
    if streams < 1:
        raise ValueError("streams must be >= 1")
    if next_request not in NEXT_REQUEST:
        raise ValueError(f"next_request must be one of {NEXT_REQUEST}, got {next_request!r}")
    after_playback = next_request == "after_playback"
    run = _Run(warmup_s, duration_s, count, drain)

    async def one_client(index: int, client: httpx.AsyncClient) -> None:
        rng = random.Random(f"{seed}:{index}")
        while True:
            text = rng.choice(texts)
            first_sent = run.clock()
            waited = 0.0
            while True:
                measured = run.claim()  # every attempt: a retry is a new request
                res = await request(client, base_url, text, options, run.clock, waited, run.tracker)
                (run.measured if measured else run.background).append(res)
                rec = res.record
                if measured:
                    run.release(rec.finished_at_s, counted=rec.outcome is not Outcome.REJECTED)
                if rec.outcome is not Outcome.REJECTED:
                    break
                await asyncio.sleep(rec.retry_after_s if rec.retry_after_s is not None else 1.0)
                waited = run.clock() - first_sent
            if rec.outcome is Outcome.FAILED:
                await asyncio.sleep(0.5)  # don't spin on a broken server
            elif after_playback and rec.playback.ended_at_s is not None:
                await asyncio.sleep(max(0.0, rec.playback.ended_at_s - run.clock()))

    async with _client(streams, options) as client:
        tasks = [asyncio.create_task(one_client(i, client)) for i in range(streams)]
        timer = run.arm()
        try:
            limit = duration_s + drain_timeout_s if duration_s is not None else None
            await asyncio.wait_for(run.done.wait(), timeout=limit)
            return run.result("closed", float(streams), options, slo_s)  # before the cuts
        finally:
            if timer is not None:
                timer.cancel()
            await _stop(tasks)


async def open_loop(
    base_url: str,
    texts: Sequence[str],
    *,
    rate_per_s: float,
    duration_s: float,
    max_count: int | None = None,
    warmup_s: float = 0.0,
    options: RequestOptions = RequestOptions(),
    seed: int = 0,
    slo_s: float = 1.0,
    drain_timeout_s: float = 120.0,
    max_in_flight: int = 1024,
) -> LoadResult:
    """Poisson arrivals at `rate_per_s`; a rejected arrival is counted, not retried."""
    if rate_per_s <= 0:
        raise ValueError("rate_per_s must be > 0")
    run = _Run(warmup_s, duration_s, max_count)
    rng = random.Random(f"{seed}:open")
    pending: set[asyncio.Task[None]] = set()

    async def one_request(text: str, measured: bool, client: httpx.AsyncClient) -> None:
        res = await request_once(client, base_url, text, options, run.clock, tracker=run.tracker)
        (run.measured if measured else run.background).append(res)
        if measured:
            run.release(res.record.finished_at_s)

    async def arrivals(client: httpx.AsyncClient) -> None:
        next_at = 0.0
        while True:
            next_at += rng.expovariate(rate_per_s)
            text = rng.choice(texts)
            delay = next_at - run.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(pending) >= max_in_flight:
                continue  # the client side is saturated: skip this arrival
            task = asyncio.create_task(one_request(text, run.claim(), client))
            pending.add(task)
            task.add_done_callback(pending.discard)

    async with _client(max_in_flight, options) as client:
        producer = asyncio.create_task(arrivals(client))
        timer = run.arm()
        try:
            await asyncio.wait_for(run.done.wait(), timeout=duration_s + drain_timeout_s)
            return run.result("open", rate_per_s, options, slo_s)
        finally:
            if timer is not None:
                timer.cancel()
            await _stop([producer, *pending])


async def fetch_voice(base_url: str, api_key: str | None = None) -> str:
    """The first voice the server lists (GET /v1/audio/voices)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=10.0) as client:
        response = await client.get(base_url.rstrip("/") + "/v1/audio/voices", headers=headers)
        response.raise_for_status()
        return str(response.json()["voices"][0]["id"])

"""The load generator against live HTTP servers: a scripted one with known chunk timings
(so the stalls it must hear are known), and Playhead itself on the sim backend."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import socket
import threading
import time
import wave
from collections.abc import AsyncIterator, Iterator

import av
import httpx
import numpy as np
import pytest
import uvicorn

from benchmarks.listening import Arrival, credit_encoded, decoded_durations
from benchmarks.loadgen import (
    Clock,
    LoadResult,
    Requester,
    RequestOptions,
    RequestResult,
    Tracker,
    closed_loop,
    load_corpus,
    open_loop,
    request_once,
)
from benchmarks.player import Outcome, Player, StreamRecord, parse_server_timing, summarize
from benchmarks.voice_peer import PEER_OPTIONS, peer_request

RATE_HZ = 24000
BYTES_PER_S = 2 * RATE_HZ


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _request_body(scope, receive, send) -> bytes | None:  # type: ignore[no-untyped-def]
    """For the scripted ASGI servers: answer the lifespan protocol (None), or read the whole
    request body."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return None
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


class _Listened:
    """A scripted server that can wait for its client's player: `heard` is the run's
    tracker, set by the test's request hook (one request at a time), so a script can send
    its next piece only once the audio it sent before has been credited, whatever the
    machine's load."""

    def __init__(self) -> None:
        self.heard: Tracker | None = None

    def _arrivals(self) -> int:
        return len(self.heard.arrivals) if self.heard is not None else 0

    async def send_heard(self, send, body: bytes) -> None:  # type: ignore[no-untyped-def]
        """Send one more piece of the response body, then wait until the client's player
        has credited audio from it (at most 10 s: a client that never credits the piece
        fails the test's checks instead of hanging it)."""
        before = self._arrivals()
        await send({"type": "http.response.body", "body": body, "more_body": True})
        for _ in range(2000):
            if self._arrivals() > before:
                return
            await asyncio.sleep(0.005)

    def hook(self, inner: Requester = request_once) -> Requester:
        """`inner` (a closed_loop request hook), telling this server the run's tracker."""

        async def request(
            client: httpx.AsyncClient,
            base_url: str,
            text: str,
            options: RequestOptions,
            clock: Clock,
            waited_s: float = 0.0,
            tracker: Tracker | None = None,
        ) -> RequestResult:
            self.heard = tracker
            return await inner(client, base_url, text, options, clock, waited_s, tracker)

        return request


STALL_GAP_S = 0.55  # "stall": from the player hearing its first piece to the second


class _Scripted(_Listened):
    """An ASGI app answering POST /v1/audio/speech from a script keyed by `input`:
    - "reject-once:<x>": 429 with Retry-After 0.2 the first time, then like "<x>";
    - "stall": 0.4 s of PCM at 0.05 s, then 0.2 s more STALL_GAP_S after the client's
      player heard the first piece (a stall of at least 0.15 s), with the byte counts odd
      so that samples straddle reads;
    - anything else: 0.3 s of PCM in one chunk after 50 ms."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        body = await _request_body(scope, receive, send)
        if body is None:
            return
        text = json.loads(body)["input"]
        if text.startswith("reject-once:"):
            if text not in self.seen:
                self.seen.add(text)
                await send(
                    {
                        "type": "http.response.start",
                        "status": 429,
                        "headers": [
                            (b"retry-after", b"0.2"),
                            (b"content-type", b"application/json"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": b'{"error": {}}'})
                return
            text = text.split(":", 1)[1]
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"audio/pcm")],
            }
        )
        await asyncio.sleep(0.05)
        if text == "stall":
            size = int(0.2 * BYTES_PER_S)
            await self.send_heard(send, b"\0" * (2 * size + 1))
            await asyncio.sleep(STALL_GAP_S)
            await send(
                {"type": "http.response.body", "body": b"\0" * (size - 1), "more_body": True}
            )
        else:
            size = int(0.3 * BYTES_PER_S)
            await send({"type": "http.response.body", "body": b"\0" * size, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def _serve(app: object) -> Iterator[str]:
    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[str, _Scripted]]:
    app = _Scripted()
    for url in _serve(app):
        yield url, app


@pytest.fixture(scope="module")
def scripted_url(scripted: tuple[str, _Scripted]) -> str:
    return scripted[0]


async def test_closed_loop_hears_the_scripted_stall(scripted: tuple[str, _Scripted]) -> None:
    url, app = scripted
    result = await closed_loop(url, ["stall"], streams=1, count=4, request=app.hook())
    assert len(result.records) == 4
    for rec in result.records:
        assert rec.outcome is Outcome.OK
        pb = rec.playback
        assert pb.audio_s == pytest.approx(0.6, abs=1e-9)  # odd reads lose no sample
        # h = t0 + 0.4 after the first piece; the second comes STALL_GAP_S after the player
        # started: a stall of at least 0.15 s, and only one
        assert pb.stall_count() == 1
        assert pb.stall_s >= STALL_GAP_S - 0.4 - 0.005
        assert rec.ttfa_s is not None and rec.ttfa_s >= 0.05
    s = result.summary
    assert s.streams_ok == 4
    assert s.stall_free_share == 0.0
    assert s.stall_ratio == pytest.approx(sum(r.playback.stall_s for r in result.records) / 2.4)


async def test_closed_loop_retries_after_429(scripted_url: str) -> None:
    texts = ["reject-once:a", "reject-once:bb", "reject-once:ccc"]
    result = await closed_loop(scripted_url, texts, streams=3, duration_s=0.8, seed=1)
    rejected = [r for r in result.records if r.outcome is Outcome.REJECTED]
    ok = [r for r in result.records if r.outcome is Outcome.OK]
    assert 1 <= len(rejected) <= 3  # each text is rejected the first time only
    assert all(r.retry_after_s == pytest.approx(0.2) and r.http_status == 429 for r in rejected)
    assert result.summary.rejected == len(rejected)
    assert result.summary.reject_latency_max_ms is not None
    # every rejected client came back after its Retry-After and was served, its wait recorded
    for rec in rejected:
        retried = [r for r in ok if r.text_chars == rec.text_chars and r.waited_s > 0]
        assert len(retried) == 1
        assert retried[0].waited_s >= 0.2
        assert retried[0].sent_at_s >= rec.sent_at_s + 0.2
    assert result.summary.wait_p99_ms is not None and result.summary.wait_p99_ms >= 200
    # a server that sends no Server-Timing: nothing is made up
    assert all(r.server_first_audio_s is None for r in result.records)
    assert result.summary.server_start_wait_p99_ms is None


async def test_open_loop_counts_and_measures(scripted_url: str) -> None:
    result = await open_loop(
        scripted_url, ["quick"], rate_per_s=20.0, duration_s=1.0, max_count=8, seed=3
    )
    assert len(result.records) == 8
    assert all(r.outcome is Outcome.OK for r in result.records)
    assert result.summary.stall_free_share == 1.0
    assert result.summary.audio_s == pytest.approx(8 * 0.3)
    assert result.summary.xrt > 0


def _encode(fmt: str, seconds: float) -> bytes:
    codec, container, rate = {
        "mp3": ("libmp3lame", "mp3", RATE_HZ),
        "opus": ("libopus", "ogg", 48000),
        "aac": ("aac", "adts", RATE_HZ),
        "flac": ("flac", "flac", RATE_HZ),
        "wav": ("pcm_s16le", "wav", RATE_HZ),
    }[fmt]
    signal = (0.3 * np.sin(np.arange(int(seconds * RATE_HZ)) * 2 * np.pi * 440 / RATE_HZ)).astype(
        np.float32
    )
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(signal[None, :], format="flt", layout="mono")
        frame.sample_rate = RATE_HZ
        resampler = av.AudioResampler(format=stream.codec_context.format, layout="mono", rate=rate)
        for part in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(part):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
def test_encoded_durations_come_from_decoded_samples(fmt: str) -> None:
    body = _encode(fmt, 2.0)
    total = sum(seconds for _, seconds in decoded_durations(body, fmt))
    assert total == pytest.approx(2.0, abs=0.06)  # codec priming/padding only
    # Half the bytes at t=1, the rest at t=2: no audio is credited before its bytes came.
    half = len(body) // 2
    arrivals = credit_encoded([(1.0, half), (2.0, len(body))], body, fmt)
    assert [a.at_s for a in arrivals] == sorted(a.at_s for a in arrivals)
    early = sum(a.duration_s for a in arrivals if a.at_s == 1.0)
    assert early <= total * half / len(body) + 0.1
    assert sum(a.duration_s for a in arrivals) == pytest.approx(total)


def test_corpus_has_several_lengths() -> None:
    texts = load_corpus()
    assert len(texts) >= 24
    lengths = sorted(len(t) for t in texts)
    assert lengths[0] < 40 and lengths[-1] > 200


def test_request_options_body_is_the_openai_shape() -> None:
    body = RequestOptions(voice="sim", response_format="wav", sample_rate_hz=16000).body("hi")
    assert body == {
        "model": "tts-1",
        "input": "hi",
        "voice": "sim",
        "response_format": "wav",
        "speed": 1.0,
        "sample_rate": 16000,
    }


def test_burst_throughput_counts_whole_turns() -> None:
    # A server that delivers 8 s of audio at the end of every 1 s turn: a 10 s window
    # catches 11 bursts (88 s of audio, "8.8x"), but the turns say 8x.
    arrivals = tuple(Arrival(0.5 + i, 8.0) for i in range(11))
    summary = summarize([], wall_s=10.0, audio_received_s=88.0)
    result = LoadResult("closed", 22, (), summary, (0.2, 10.2), 0, RequestOptions(), arrivals)
    assert result.summary.xrt == pytest.approx(8.8)
    assert result.burst_throughput() == pytest.approx(8.0)


def test_burst_throughput_of_a_stream_with_few_gaps_is_its_rate() -> None:
    # 10 audio s per s in 10 ms arrivals, with two 60 ms gaps that cut it into three long
    # bursts: the rate after the first burst, not the audio of two bursts over the time
    # to the last one's start (11.8x).
    times = [0.3 + 0.01 * i for i in range(271)]
    times += [times[-1] + 0.06 + 0.01 * i for i in range(300)]
    times += [times[-1] + 0.06 + 0.01 * i for i in range(380)]
    arrivals = tuple(Arrival(t, 0.1) for t in times)
    summary = summarize([], wall_s=10.0, audio_received_s=0.1 * len(times))
    result = LoadResult("closed", 16, (), summary, (0.2, 10.2), 0, RequestOptions(), arrivals)
    assert result.burst_throughput() == pytest.approx(10.0, rel=0.02)


@pytest.fixture(scope="module")
def playhead_url() -> Iterator[str]:
    from app.server import create_app
    from app.settings import load_settings

    # no start-up calibration: two streams need no measured capacity
    settings = load_settings(
        "configs/sim.yaml", ["server.log_level=warning", "engine.calibration_calls=0"]
    )
    served = _serve(create_app(settings))
    url = next(served)
    deadline = time.monotonic() + 20
    while httpx.get(f"{url}/ready", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.05)
    yield url
    served.close()


async def test_playhead_sim_streams_arrive_whole(playhead_url: str) -> None:
    from pipeline.backends.sim import expected_frames

    texts = ["The kettle clicked off.", "Turn left at the second bridge, then keep going."]
    options = RequestOptions(voice="sim")
    result = await closed_loop(playhead_url, texts, streams=2, count=4, options=options, seed=5)
    assert len(result.records) == 4
    by_chars = {len(t): t for t in texts}
    for rec in result.records:
        assert rec.outcome is Outcome.OK, rec.error
        # every frame of the sim voice (80 ms) arrived, measured from the byte count
        frames = expected_frames(by_chars[rec.text_chars])
        assert rec.playback.audio_s == pytest.approx(frames * 0.08)
        # the server's split of the first audio (Server-Timing), within what the client saw
        assert rec.server_start_wait_s is not None and rec.server_first_audio_s is not None
        assert rec.ttfa_s is not None
        assert 0 < rec.server_start_wait_s + rec.server_first_audio_s <= rec.ttfa_s
    assert result.summary.ttfa_p99_ms is not None and result.summary.ttfa_p99_ms < 2000
    assert result.summary.server_first_audio_p99_ms is not None
    assert result.summary.server_first_audio_p99_ms <= result.summary.ttfa_p99_ms


def test_server_timing_is_read_by_name_in_seconds() -> None:
    header = 'start-wait;dur=12.5, first-audio;desc="submit";dur=80, cache;desc="hit", bad;dur=x'
    assert parse_server_timing(header) == {"start-wait": 0.0125, "first-audio": 0.08}
    assert parse_server_timing(None) == {}
    assert parse_server_timing("total;dur=-1") == {}


# piper's HTTP server as the peer client sees it (benchmarks/voice_peer.py): POST /synthesize
# {"text": ...} answered by one WAV file, here sent in three pieces.
PEER_RATE_HZ = 22050
PEER_AUDIO_S = {"Hello there.": 1.5, "A somewhat longer sentence, for the peer.": 0.5}
PEER_FIRST_PIECE_S = 0.15  # after the response headers
PEER_PIECE_GAP_S = 0.1  # at least this between the later pieces


def _wav(seconds: float, rate_hz: int) -> bytes:
    samples = (np.arange(round(seconds * rate_hz)) % 200 - 100).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate_hz)
        out.writeframes(samples.tobytes())
    return buf.getvalue()


class _ScriptedPiper(_Listened):
    """An ASGI app answering POST /synthesize like piper's server: the WAV of
    PEER_AUDIO_S[text], the header and the first samples together PEER_FIRST_PIECE_S after
    the response headers, then the rest in two pieces (cut at odd byte counts, so samples
    straddle reads); 400 for any other body.

    The later pieces wait until the client's player has heard the first, so whether a
    client plays on the first byte does not depend on how busy the machine is."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[object] = []

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        raw = await _request_body(scope, receive, send)
        if raw is None:
            return
        body = json.loads(raw)
        self.bodies.append(body)
        ok = scope["method"] == "POST" and scope["path"] == "/synthesize"
        if not ok or not isinstance(body, dict) or body.get("text") not in PEER_AUDIO_S:
            await send({"type": "http.response.start", "status": 400, "headers": []})
            await send({"type": "http.response.body", "body": b"bad request"})
            return
        wav = _wav(PEER_AUDIO_S[body["text"]], PEER_RATE_HZ)
        data_bytes = len(wav) - 44
        cuts = [0, 44 + (data_bytes // 3 | 1), 44 + (2 * data_bytes // 3 | 1), len(wav)]
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"audio/wav")],
            }
        )
        await asyncio.sleep(PEER_FIRST_PIECE_S)
        await self.send_heard(send, wav[: cuts[1]])
        for lo, hi in itertools.pairwise(cuts[1:]):
            await asyncio.sleep(PEER_PIECE_GAP_S)
            await send({"type": "http.response.body", "body": wav[lo:hi], "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def test_scripted_wav_is_what_the_peer_test_expects() -> None:
    wav = _wav(1.5, PEER_RATE_HZ)
    assert len(wav) == 44 + 2 * 33075  # the canonical header, then 1.5 s of samples
    with wave.open(io.BytesIO(wav)) as parsed:
        assert parsed.getnframes() / parsed.getframerate() == 1.5


@pytest.fixture
def scripted_piper() -> Iterator[tuple[str, _ScriptedPiper]]:
    app = _ScriptedPiper()
    for url in _serve(app):
        yield url, app


async def test_closed_loop_plays_piper_peer_wavs(
    scripted_piper: tuple[str, _ScriptedPiper],
) -> None:
    url, app = scripted_piper
    texts = list(PEER_AUDIO_S)
    result = await closed_loop(
        url,
        texts,
        streams=1,
        count=4,
        options=PEER_OPTIONS,
        request=app.hook(peer_request),
        next_request="after_last_byte",
        seed=2,
    )
    assert len(result.records) == 4
    assert result.options is PEER_OPTIONS
    by_chars = {len(t): t for t in texts}
    assert {r.text_chars for r in result.records} == set(by_chars)  # seed 2 sends both
    for rec in result.records:
        assert rec.outcome is Outcome.OK, rec.error
        assert rec.http_status == 200
        # every sample of the WAV, none of its 44 header bytes, at its own rate
        assert rec.playback.audio_s == pytest.approx(PEER_AUDIO_S[by_chars[rec.text_chars]])
        # audio starts with the first body byte (header and samples together): not with the
        # response headers, and not once the whole WAV is in (the server sends the rest only
        # after the player has heard the first piece, at least two gaps before the end)
        assert rec.playback.started_at_s is not None and rec.ttfa_s is not None
        assert rec.playback.started_at_s - rec.answered_at_s >= PEER_FIRST_PIECE_S - 0.05
        assert rec.finished_at_s - rec.playback.started_at_s >= 2 * PEER_PIECE_GAP_S - 0.01
    assert result.summary.streams_ok == 4
    assert sorted(result.ttfas_s()) == sorted(r.ttfa_s for r in result.records)
    # every request sent piper's body, nothing else
    assert app.bodies and all(b in [{"text": t} for t in texts] for b in app.bodies)


async def test_closed_loop_calls_the_given_request_hook() -> None:
    calls: list[tuple[str, str, float]] = []
    returned: list[StreamRecord] = []
    options = RequestOptions(voice="hooked", response_format="wav")
    base_url = "http://127.0.0.1:9"  # nothing listens: the default client would fail

    async def fake_request(
        client: httpx.AsyncClient,
        url: str,
        text: str,
        opts: RequestOptions,
        clock: Clock,
        waited_s: float = 0.0,
        tracker: Tracker | None = None,
    ) -> RequestResult:
        assert isinstance(client, httpx.AsyncClient) and opts is options
        assert tracker is not None
        calls.append((url, text, waited_s))
        sent = clock()
        await asyncio.sleep(0.01)
        arrival = Arrival(clock(), 0.02 * len(calls))  # a distinct duration per call
        tracker.arrivals.append(arrival)
        player = Player()
        player.feed(arrival.at_s, arrival.duration_s)
        record = StreamRecord(
            outcome=Outcome.OK,
            sent_at_s=sent,
            answered_at_s=arrival.at_s,
            finished_at_s=arrival.at_s,
            playback=player.result(),
            text_chars=len(text),
            http_status=299,
        )
        returned.append(record)
        return RequestResult(record, (arrival,))

    result = await closed_loop(
        base_url,
        ["one", "three"],
        streams=2,
        count=5,
        options=options,
        request=fake_request,
        next_request="after_last_byte",
    )
    assert len(result.records) == 5
    assert len(returned) == len(result.records) + result.unmeasured_requests
    assert len(calls) >= len(returned)  # calls cut off at the end never return
    assert all(url == base_url and text in ("one", "three") and w == 0.0 for url, text, w in calls)
    # the LoadResult holds the hook's own records, in the order they were sent
    assert all(any(rec is mine for mine in returned) for rec in result.records)
    assert [r.sent_at_s for r in result.records] == sorted(r.sent_at_s for r in result.records)
    assert all(r.http_status == 299 for r in result.records)
    assert result.summary.streams_ok == 5
    assert result.summary.audio_s == pytest.approx(sum(r.playback.audio_s for r in result.records))
    # and the arrivals it reported through the run's tracker
    assert len(result.arrivals) >= len(returned)
    assert {a.duration_s for a in result.arrivals} >= {r.playback.audio_s for r in returned}


async def test_a_socket_stream_is_recorded_by_the_same_recorder() -> None:
    """mixed_protocols' socket streams go through listening.StreamRecorder as HTTP ones do:
    odd bytes carried to the next message, first audio at the first whole sample, the
    run's tracker hearing every arrival and no longer counting the player at the end."""
    from benchmarks.mixed_protocols import SAMPLE_RATE_HZ, play_socket

    ticks = iter([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])

    async def three_messages(base_url: str, text: str, voice: str) -> AsyncIterator[bytes]:
        yield b"\x00"  # half a sample: no audio yet
        yield b"\x00" * (2 * SAMPLE_RATE_HZ // 10 - 1)  # completes 0.1 s with the byte before
        yield b"\x00" * (2 * SAMPLE_RATE_HZ // 10)

    tracker = Tracker()
    result = await play_socket(
        three_messages, "ws://x", "hi", "v", lambda: next(ticks), 0.0, tracker
    )
    record = result.record
    assert record.outcome is Outcome.OK
    assert [(a.at_s, round(a.duration_s, 6)) for a in result.arrivals] == [(0.2, 0.1), (0.3, 0.1)]
    assert record.sent_at_s == 0.0 and record.answered_at_s == 0.2
    assert record.ttfa_s == pytest.approx(0.2)
    assert tracker.arrivals == list(result.arrivals) and not tracker.players

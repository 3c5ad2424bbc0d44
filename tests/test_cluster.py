"""Playhead on Ray Serve: a local Ray with two sim replicas behind Serve's HTTP proxy.

One cluster for the module (Ray and Serve take ~15 s to start here): two replicas, each
admitting at most 2 streams (admission.max_streams), the slack router. The replica-killing
test runs last. Needs the `cluster` extra (ray[serve]).
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack

import httpx
import pytest

ray = pytest.importorskip("ray")

from app.cluster import launch  # noqa: E402
from app.cluster.replica import APP_NAME, DEPLOYMENT_NAME, REPLICA_HEADER  # noqa: E402
from pipeline.backends.sim import decode_sim_signal  # noqa: E402
from tests.api_support import (  # noqa: E402
    decode,
    expected_audio_s,
    parse_sse,
    sim_settings,
    speech_body,
)

MAX_STREAMS = 6  # per replica
LONG_TEXT = " ".join(["This sentence keeps a listener busy for a while."] * 40)
START_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, object]]:
    port = _free_port()
    settings = sim_settings(
        f"admission.max_streams={MAX_STREAMS}",
        "cluster.replicas=2",
        "cluster.stats_period_s=0.1",
        f"server.port={port}",
        "server.log_level=warning",
    )
    launch.start(settings)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                ready = httpx.get(f"{url}/ready", timeout=5)
                if ready.status_code == 200 and ready.json()["replicas"]["running"] == 2:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the cluster did not become ready"
            time.sleep(0.2)
        yield url, settings
    finally:
        launch.stop()


def speech(url: str, text: str = "Hello there.", **fields: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/speech", json=speech_body(text, **fields), timeout=30)


async def _open_stream(client: httpx.AsyncClient, stack, text: str = LONG_TEXT):
    """Start a long stream and hold it open (its body unread past the first bytes)."""
    response = await stack.enter_async_context(
        client.stream("POST", "/v1/audio/speech", json=speech_body(text, response_format="pcm"))
    )
    return response


async def test_admission_spreads_streams_and_429_only_when_every_replica_refuses(
    cluster,
) -> None:
    """Twelve long streams fit (six per replica): the router sends none to a full replica;
    the thirteenth finds both full and gets 429 with Retry-After. (First in the module: the
    short streams of the other tests count for admission until their players end.)"""
    url, _ = cluster
    async with httpx.AsyncClient(base_url=url, timeout=30) as client, AsyncExitStack() as stack:
        opened = []
        for _ in range(2 * MAX_STREAMS):
            response = await _open_stream(client, stack)
            assert response.status_code == 200, await response.aread()
            opened.append(response.headers[REPLICA_HEADER])
        assert len(set(opened)) == 2 and all(opened.count(r) == MAX_STREAMS for r in set(opened))
        refused = await client.post(
            "/v1/audio/speech", json=speech_body("One more, please.", response_format="pcm")
        )
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    # The streams were cancelled with their clients: room again (after the next reports).
    deadline = time.monotonic() + 10
    while (status := speech(url, "Back again.").status_code) != 200:
        assert status == 429 and time.monotonic() < deadline
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac", "mp3", "opus"])
async def test_speech_through_the_cluster_decodes_whole(cluster, fmt: str) -> None:
    url, settings = cluster
    text = "Hello there. A test of the cluster."
    response = await asyncio.to_thread(speech, url, text, response_format=fmt)
    assert response.status_code == 200, response.text
    assert response.headers[REPLICA_HEADER]
    samples, rate_hz = decode(response.content, fmt)
    assert len(samples) / rate_hz == pytest.approx(expected_audio_s(settings, text), abs=0.08)
    if fmt == "pcm":  # lossless: the sim signal names each frame; all there, in order
        frames = decode_sim_signal(samples, settings.sim.samples_per_frame)
        assert [index for _, index in frames] == list(range(len(frames)))
        assert len({tag for tag, _ in frames}) == 1


def test_sse_through_the_cluster(cluster) -> None:
    url, settings = cluster
    text = "Events, one delta at a time."
    response = speech(url, text, stream_format="sse", response_format="pcm")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.content)
    assert events[-1]["type"] == "speech.audio.done"
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2  # chunk by chunk, not one buffered blob
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)  # type: ignore[arg-type]
    assert len(pcm) / 2 / 24000 == pytest.approx(expected_audio_s(settings, text), abs=0.08)


def test_listings_metrics_and_ready(cluster) -> None:
    url, _ = cluster
    assert httpx.get(f"{url}/v1/models", timeout=10).json()["object"] == "list"
    voices = httpx.get(f"{url}/v1/audio/voices", timeout=10).json()["voices"]
    assert [v["id"] for v in voices] == ["sim"]
    metrics = httpx.get(f"{url}/metrics", timeout=10)
    assert metrics.status_code == 200 and "playhead_" in metrics.text
    assert metrics.headers[REPLICA_HEADER]  # one replica's metrics, named
    ready = httpx.get(f"{url}/ready", timeout=10).json()
    assert ready["status"] == "ready"
    assert ready["replicas"]["running"] == 2 and ready["replicas"]["target"] == 2


async def test_websocket_through_the_cluster(cluster) -> None:
    """WS /v1/audio/speech/stream through Ray's proxy: one utterance, its audio whole."""
    websockets = pytest.importorskip("websockets")
    url, settings = cluster
    text = "Hello over the socket."
    pcm = b""
    events = []
    ws_url = url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    async with asyncio.timeout(30), websockets.connect(ws_url) as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": "sim"}))
        await ws.send(json.dumps({"type": "input.text", "text": text}))
        await ws.send(json.dumps({"type": "input.done"}))
        while not events or events[-1]["type"] not in ("audio.done", "error"):
            message = await ws.recv()
            if isinstance(message, bytes):
                pcm += message
            else:
                events.append(json.loads(message))
    assert [e["type"] for e in events] == ["audio.start", "audio.done"]
    assert len(pcm) / 2 / 24000 == pytest.approx(expected_audio_s(settings, text), abs=0.08)


async def _open_when_admitted(
    client: httpx.AsyncClient, stack: AsyncExitStack, fields: dict[str, str], timeout_s: float = 20
) -> httpx.Response:
    """A long stream, once there is room (the other tests' short streams count for
    admission until their players end)."""
    deadline = time.monotonic() + timeout_s
    while True:
        request = client.stream("POST", "/v1/audio/speech", json=speech_body(LONG_TEXT, **fields))
        response = await stack.enter_async_context(request)
        if response.status_code != 429 or time.monotonic() > deadline:
            return response
        await response.aclose()
        await asyncio.sleep(0.3)


def _wait_running(url: str, replicas: int = 2, timeout_s: float = 60) -> None:
    """Until Ray runs `replicas` replicas again (a killed one is replaced)."""
    deadline = time.monotonic() + timeout_s
    while httpx.get(f"{url}/ready", timeout=10).json()["replicas"]["running"] != replicas:
        assert time.monotonic() < deadline, "the killed replica was not replaced"
        time.sleep(0.3)


@pytest.mark.parametrize(
    "fields",
    [{"response_format": "wav"}, {"response_format": "pcm", "stream_format": "sse"}],
    ids=["wav", "sse"],
)
async def test_a_killed_replica_cuts_its_streams_and_is_routed_around(
    cluster, fields: dict[str, str]
) -> None:
    url, _ = cluster
    await asyncio.to_thread(_wait_running, url)
    body = b""
    cut = False
    async with httpx.AsyncClient(base_url=url, timeout=30) as client, AsyncExitStack() as stack:
        response = await _open_when_admitted(client, stack, fields)
        assert response.status_code == 200
        victim = response.headers[REPLICA_HEADER]
        chunks = response.aiter_raw()
        body += await anext(chunks)  # audio flows
        actor = ray.get_actor(
            f"SERVE_REPLICA::{APP_NAME}#{DEPLOYMENT_NAME}#{victim}", namespace="serve"
        )
        ray.kill(actor, no_restart=True)
        try:
            async with asyncio.timeout(20):  # never a hang: TimeoutError fails the test
                async for chunk in chunks:
                    body += chunk
        except httpx.HTTPError:
            cut = True  # the transfer ended without its last chunk
    if "stream_format" in fields and not cut:
        last = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
        assert b'"type":"error"' in last, last[:200]
    else:
        assert cut
    # New requests go to the live replica (or the one Ray starts instead) at once.
    statuses = []
    for _ in range(4):
        response = await asyncio.to_thread(speech, url, "Still here?")
        statuses.append(response.status_code)
        assert response.headers[REPLICA_HEADER] != victim
    assert statuses[0] == 200 and set(statuses) <= {200, 429}

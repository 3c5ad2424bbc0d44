"""A client that leaves while it waits in admission's queue gives its place back at once,
on every protocol (docs/admission.md), and app/disconnect.py's ClientWatch, the one
watcher of an ASGI receive channel behind it.

Overload is made as in tests/test_admission_queue.py: admission.max_streams slots held by
streams submitted to the engine and left unread (they park with work left), a queue
bound of 600 s, so that a place can only come back from the leaver itself. The checks
read the engine's admission state (its waiter and granted counts), not the clock alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import websockets
from api_support import asgi_client, expected_audio_s, live_server, sim_settings
from api_support import speech_body as _speech_body
from starlette.requests import ClientDisconnect
from test_admission_queue import QUEUE, hold, nothing_held, until
from ws_client import connect
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize
from wyoming_support import free_port

from app.disconnect import ClientWatch
from app.server import create_app
from pipeline.admission import admit
from pipeline.engine import Engine
from pipeline.errors import Rejected
from scheduling.admission import Decision


def speech_body(text: str) -> dict[str, object]:
    return _speech_body(text, response_format="pcm")


async def test_a_refusal_at_once_leaves_no_unawaited_watch() -> None:
    """`admit(engine, watch.gone())` refused by `reserve()` before any wait: the watch's
    coroutine is closed, not left for a "never awaited" warning (which the ElevenLabs
    HTTP route's 429 raised)."""

    class Full:
        def reserve(self) -> None:
            raise Rejected(Decision(accept=False, retry_after_s=1, reason="capacity"))

    _, receive = channel()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(Rejected):
            await admit(Full(), ClientWatch(receive).gone())
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)], caught


# --- ClientWatch over a channel fed by hand ---


def channel(*messages: dict[str, Any]) -> tuple[asyncio.Queue[dict[str, Any]], Any]:
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for message in messages:
        queue.put_nowait(message)
    return queue, queue.get


def body(data: bytes, more: bool = True) -> dict[str, Any]:
    return {"type": "http.request", "body": data, "more_body": more}


async def test_the_watch_keeps_what_it_reads_and_returns_when_the_client_leaves() -> None:
    queue, receive = channel(body(b"ab"), body(b"cd", more=False))
    watch = ClientWatch(receive)
    gone = asyncio.ensure_future(watch.gone())
    await asyncio.sleep(0.01)
    assert not gone.done() and not watch.left
    queue.put_nowait({"type": "http.disconnect"})
    await asyncio.wait_for(gone, 1)
    assert watch.left
    # the reader after it gets every message, in order, then the disconnect (again)
    assert [await watch.receive() for _ in range(4)] == [
        body(b"ab"),
        body(b"cd", more=False),
        {"type": "http.disconnect"},
        {"type": "http.disconnect"},
    ]


async def test_a_cancelled_watch_loses_no_message() -> None:
    queue, receive = channel(body(b"one"))
    watch = ClientWatch(receive)
    for _ in range(3):  # admitted before the client sent anything more: cancelled
        gone = asyncio.ensure_future(watch.gone())
        await asyncio.sleep(0.01)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        queue.put_nowait(body(b"more"))
    queue.put_nowait(body(b"", more=False))
    data = b""
    while (message := await watch.receive())["more_body"]:
        data += message["body"]
    assert data == b"onemoremoremore" and not watch.left


async def test_the_watch_reads_ahead_at_most_its_bound() -> None:
    queue, receive = channel(*(body(b"x" * 100) for _ in range(10)))
    watch = ClientWatch(receive, max_kept_bytes=250)
    gone = asyncio.ensure_future(watch.gone())
    await asyncio.sleep(0.01)
    assert queue.qsize() == 7  # 3 messages kept (300 bytes), then it stopped reading
    await watch.receive()
    await asyncio.sleep(0.01)
    assert queue.qsize() == 6  # room for one more
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)


async def test_unless_gone_cancels_the_wait_when_the_client_leaves() -> None:
    queue, receive = channel()
    watch = ClientWatch(receive)
    started = asyncio.Event()
    cancelled = False

    async def first_audio() -> str:
        nonlocal cancelled
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled = True
            raise
        return "audio"

    waiting = asyncio.ensure_future(watch.unless_gone(first_audio()))
    await started.wait()
    queue.put_nowait({"type": "http.disconnect"})
    with pytest.raises(ClientDisconnect):
        await asyncio.wait_for(waiting, 1)
    assert cancelled

    async def fails() -> None:
        raise ValueError("the stream failed")

    with pytest.raises(ValueError):  # a client still there: the wait's own error
        await ClientWatch(channel()[1]).unless_gone(fails())
    assert await ClientWatch(channel()[1]).unless_gone(asyncio.sleep(0, "first")) == "first"


# --- HTTP: the body read while the request waits reaches the route whole ---


async def test_a_body_sent_in_pieces_while_queued_reaches_the_route() -> None:
    """The gate reads the request while it waits (to see a disconnect): the body's pieces
    it read are handed on to the route, in order; it reads ahead no more than
    server.max_request_bytes, so a body over the limit still gets its 413."""
    async with asgi_client(sim_settings(*QUEUE)) as client:
        engine = client.app.state.playhead.engine
        held = hold(engine)
        data = json.dumps(speech_body("Sent in pieces while it waits.")).encode()
        sent: list[int] = []

        async def pieces(chunks: list[bytes]):
            for chunk in chunks:
                sent.append(len(chunk))
                yield chunk

        split = [data[i : i + 7] for i in range(0, len(data), 7)]
        request = asyncio.ensure_future(
            client.post("/v1/audio/speech", content=pieces(split))  # chunked
        )
        await until(lambda: engine.admission.waiting == 1 and len(sent) == len(split))
        big = [b"x" * 1000] * 100  # 100 kB, chunked: over the 64 KiB limit
        too_large = asyncio.ensure_future(client.post("/v1/audio/speech", content=pieces(big)))
        await until(lambda: engine.admission.waiting == 2)
        await asyncio.sleep(0.05)
        assert len(sent) - len(split) <= 66  # read ahead up to the limit, then it stopped
        engine.cancel(held[0])
        response = await asyncio.wait_for(request, 10)
        assert response.status_code == 200 and len(response.content) > 0
        engine.cancel(held[1])
        refused = await asyncio.wait_for(too_large, 10)
        assert refused.status_code == 413, refused.text
        await until(lambda: engine.in_flight == 0)
        assert nothing_held(engine)


# --- every protocol: a waiter whose client leaves is out of the queue at once ---


def on_loop(engine: Engine, call: Callable[[], Any]) -> Any:
    """Run `call` on the live server's loop (the engine's)."""

    async def run() -> Any:
        return call()

    loop = engine._supervisor.get_loop()
    return asyncio.run_coroutine_threadsafe(run(), loop).result(5)


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 3.0) -> None:
    """Poll a live server's state from the test's loop; the bound is far below the
    queue's 600 s, so only the leaver's own release can pass it."""
    deadline_s = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline_s, what
        await asyncio.sleep(0.005)


async def test_the_websocket_leaves_the_queue_and_the_next_waiter_goes_first() -> None:
    """Playhead's socket: its receive loop reads on while an utterance waits. The
    client who leaves gives its place back at once; a second one queued behind it is
    granted as soon as a slot frees, and what it sent while waiting is all spoken."""
    with live_server(sim_settings(*QUEUE)) as live:
        engine = live.app.state.playhead.engine
        held = on_loop(engine, lambda: hold(engine))
        config = {"voice": "sim", "response_format": "pcm"}
        pieces = ["Queued behind them, ", "and more text sent ", "while it waits. "]
        async with connect(live.base_url, config=config) as second:
            async with connect(live.base_url, config=config) as first:
                await first.send("input.text", text="The one who leaves. ")
                await wait_until(lambda: engine.admission.waiting == 1, "never queued")
                await second.send("input.text", text=pieces[0])
                await wait_until(lambda: engine.admission.waiting == 2, "never queued")
            # the first closed its socket while it waited
            await wait_until(lambda: engine.admission.waiting == 1, "its place was kept")
            assert engine.admission.granted == 0 and engine.in_flight == 2
            for piece in pieces[1:]:  # read while it waits, handled once admitted
                await second.send("input.text", text=piece)
            await second.send("input.done")
            on_loop(engine, lambda: engine.cancel(held[0]))
            done = (await second.until(lambda e: e["type"] in ("error", "audio.done"), 10)).event
            assert done["type"] == "audio.done", done
            heard_s = second.pcm(done["utterance"]).size / 24000
            assert heard_s == pytest.approx(
                expected_audio_s(live.settings, "".join(pieces)), rel=0.1
            )
        on_loop(engine, lambda: engine.cancel(held[1]))
        await wait_until(lambda: engine.in_flight == 0, "a stream was left behind")
        assert nothing_held(engine)


async def test_the_websocket_drop_while_queued_frees_the_place() -> None:
    """A socket that drops (no close handshake) while its utterance waits."""
    with live_server(sim_settings(*QUEUE)) as live:
        engine = live.app.state.playhead.engine
        held = on_loop(engine, lambda: hold(engine))
        async with connect(live.base_url, config={"voice": "sim"}) as client:
            await client.send("input.text", text="Queued behind them. ")
            await wait_until(lambda: engine.admission.waiting == 1, "never queued")
            client.ws.transport.abort()
        await wait_until(lambda: nothing_held(engine), "its place was kept")
        assert engine.in_flight == 2
        on_loop(engine, lambda: [engine.cancel(stream_id) for stream_id in held])


def elevenlabs_url(base_url: str) -> str:
    base = base_url.replace("http://", "ws://")
    return f"{base}/v1/text-to-speech/sim/multi-stream-input?output_format=pcm_24000"


def cartesia_url(base_url: str) -> str:
    return base_url.replace("http", "ws") + "/tts/websocket?cartesia_version=2025-04-16"


def cartesia_request(context_id: str, transcript: str) -> str:
    return json.dumps(
        {
            "model_id": "sonic-2",
            "voice": {"mode": "id", "id": "sim"},
            "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000},
            "context_id": context_id,
            "transcript": transcript,
            "continue": True,
        }
    )


@pytest.mark.parametrize(
    ("url", "first_message"),
    [
        (elevenlabs_url, json.dumps({"text": "Queued behind them. ", "context_id": "a"})),
        (cartesia_url, cartesia_request("a", "Queued behind them. ")),
    ],
    ids=["elevenlabs", "cartesia"],
)
async def test_a_socket_protocols_waiter_leaves_the_queue_with_its_client(
    url: Callable[[str], str], first_message: str
) -> None:
    with live_server(sim_settings(*QUEUE)) as live:
        engine = live.app.state.playhead.engine
        held = on_loop(engine, lambda: hold(engine))
        async with websockets.connect(url(live.base_url)) as ws:
            await ws.send(first_message)
            await wait_until(lambda: engine.admission.waiting == 1, "never queued")
        # at once: not after the 2 s the socket's end gives its contexts to finish
        await wait_until(lambda: nothing_held(engine), "its place was kept", timeout_s=1.0)
        assert engine.in_flight == 2
        on_loop(engine, lambda: [engine.cancel(stream_id) for stream_id in held])
        await wait_until(lambda: engine.in_flight == 0, "a stream was left behind")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/text-to-speech/sim/stream?output_format=pcm_24000", {"text": "Queued behind."}),
        (
            "/tts/bytes",
            {
                "model_id": "sonic-2",
                "transcript": "Queued behind.",
                "voice": {"mode": "id", "id": "sim"},
                "output_format": {
                    "container": "raw",
                    "encoding": "pcm_s16le",
                    "sample_rate": 24000,
                },
            },
        ),
    ],
    ids=["elevenlabs", "cartesia"],
)
async def test_an_http_protocols_waiter_leaves_the_queue_with_its_client(
    path: str, body: dict[str, Any]
) -> None:
    """ElevenLabs' and Cartesia's HTTP routes wait in the queue watching their client."""
    with live_server(sim_settings(*QUEUE)) as live:
        engine = live.app.state.playhead.engine
        held = on_loop(engine, lambda: hold(engine))
        async with httpx.AsyncClient(timeout=30) as client:
            request = asyncio.create_task(client.post(live.base_url + path, json=body))
            await wait_until(lambda: engine.admission.waiting == 1, "never queued")
            request.cancel()  # the client leaves: its connection closes
            with contextlib.suppress(asyncio.CancelledError):
                await request
        await wait_until(lambda: nothing_held(engine), "its place was kept", timeout_s=1.0)
        assert engine.in_flight == 2
        on_loop(engine, lambda: [engine.cancel(stream_id) for stream_id in held])
        await wait_until(lambda: engine.in_flight == 0, "a stream was left behind")


async def test_a_wyoming_waiter_leaves_the_queue_with_its_client() -> None:
    port = free_port()
    settings = sim_settings("wyoming.enabled=true", f"wyoming.port={port}", *QUEUE)
    app = create_app(settings)
    state = app.state.playhead
    async with app.router.lifespan_context(app):
        await asyncio.wait_for(state.wait_loaded(), 10)
        engine = state.engine
        held = hold(engine)
        client = AsyncTcpClient("127.0.0.1", port)
        await client.connect()
        await client.write_event(Synthesize(text="Queued behind them.").event())
        await until(lambda: engine.admission.waiting == 1)
        await client.disconnect()
        await until(lambda: nothing_held(engine), timeout_s=3.0)
        assert engine.in_flight == 2
        for stream_id in held:
            engine.cancel(stream_id)
        await until(lambda: engine.in_flight == 0)

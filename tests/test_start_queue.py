"""The start queue over HTTP (app/admission_gate.py, Engine.reserve / wait_start).

A request admitted while admission.max_starting_streams streams are in their start phase
waits for a start slot instead of a 429: a few simultaneous requests on an idle server
all get 200; a waiter whose client leaves gives its slot back; one that waits out
admission.start_queue_timeout_s gets the 429 "starting" with Retry-After; one waiting
while the engine drains gets the 503. The start phase is filled by hand here (streams
submitted to the engine directly, with a start phase longer than their audio, so that
only their end frees a start slot): no timing decides these tests.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import httpx
from api_support import (
    asgi_client,
    live_server,
    metric_value,
    request_bytes,
    sim_settings,
    speech_body,
)

from benchmarks.player import parse_server_timing
from pipeline.engine import Engine

LONG = "A long sentence that keeps its stream busy for a while. " * 20
# a calibrated engine (the start limit needs one) whose start phase lasts until a
# stream ends
QUEUE = (
    "engine.calibration_calls=8",
    "engine.calibration_max_s=0.3",  # enough to measure something with the fast sim
    "engine.recalibrate_idle_s=0",
    "admission.max_streams=10",
    "admission.max_starting_streams=2",
)
# (a queue timeout far beyond the tests' own bounds: a slot must come from the wake)
HELD_START = (
    *QUEUE,
    "admission.start_phase_chunks=100000",
    "admission.start_queue_timeout_s=600",
)


def fill_start_phase(engine: Engine) -> list[str]:
    """Two streams in their start phase (the limit), straight into the engine."""
    assert engine.calibrated_capacity > 0
    return [engine.submit(LONG, voice="sim", reservation=engine.reserve()).id for _ in range(2)]


def nothing_held(engine: Engine) -> bool:
    return engine._reserved == 0 and engine._reserved_starting == 0 and not engine._start_queue


async def until(condition, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.005)


async def test_three_simultaneous_requests_on_an_idle_server_all_get_200() -> None:
    async with asgi_client(sim_settings(*QUEUE)) as client:
        engine = client.app.state.playhead.engine
        assert engine.calibrated_capacity > 0
        queued: list[bool] = []
        reserve = engine.reserve

        def recording_reserve():
            reservation = reserve()
            queued.append(reservation.queued)
            return reservation

        engine.reserve = recording_reserve
        body = speech_body("Hello there. How are you today?", response_format="pcm")
        responses = await asyncio.gather(
            *(client.post("/v1/audio/speech", json=body) for _ in range(3))
        )
        assert [r.status_code for r in responses] == [200, 200, 200]
        assert all(len(r.content) > 0 for r in responses)
        assert queued == [False, False, True]  # the 3rd waited for a start slot
        await until(lambda: engine.in_flight == 0)
        assert nothing_held(engine)


async def test_a_queued_request_starts_when_a_start_slot_frees(caplog) -> None:
    caplog.set_level(logging.INFO, logger="playhead.engine")
    async with asgi_client(sim_settings(*HELD_START)) as client:
        engine = client.app.state.playhead.engine
        held = fill_start_phase(engine)
        body = speech_body("Hello there.", response_format="pcm")
        request = asyncio.ensure_future(client.post("/v1/audio/speech", json=body))
        await until(lambda: len(engine._start_queue) == 1)
        await asyncio.sleep(0.05)
        assert not request.done()  # waiting, not refused
        engine.cancel(held[0])  # a start slot frees
        response = await asyncio.wait_for(request, 5)
        assert response.status_code == 200 and len(response.content) > 0
        assert parse_server_timing(response.headers["server-timing"])["start-wait"] >= 0.05
        engine.cancel(held[1])
        assert nothing_held(engine)
        await until(lambda: engine.in_flight == 0)
        # the wait is reported: the two held streams found a slot free (0), the request
        # waited at least as long as the slot was held above
        metrics = (await client.get("/metrics")).text
    assert metric_value(metrics, "playhead_start_wait_seconds_count") == 3
    assert metric_value(metrics, "playhead_start_wait_seconds_bucket", 'le="0.01"') == 2
    assert metric_value(metrics, "playhead_start_wait_seconds_sum") >= 0.05
    # each stream's end line: the request's (done) with its wait, every other (the held
    # streams and the calibration's, all cancelled) with none
    ended = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stream ")]
    waits = {m: int(m.split("start_wait_ms=")[1].split()[0]) for m in ended}
    done = [m for m in ended if " done " in m]
    assert len(done) == 1 and waits[done[0]] >= 50, ended
    assert all(wait == 0 for m, wait in waits.items() if m not in done), ended


async def test_a_request_that_waits_out_the_start_queue_gets_429_starting() -> None:
    settings = sim_settings(
        *HELD_START, "admission.start_queue_timeout_s=0.1", "admission.start_retry_after_s=2"
    )
    async with asgi_client(settings) as client:
        engine = client.app.state.playhead.engine
        held = fill_start_phase(engine)
        response = await client.post("/v1/audio/speech", json=speech_body("Hello there."))
        assert response.status_code == 429
        assert response.headers["retry-after"] == "2"
        assert "(starting)" in response.json()["error"]["message"]
        assert nothing_held(engine)
        for stream_id in held:
            engine.cancel(stream_id)
        metrics = (await client.get("/metrics")).text
        assert 'playhead_admission_rejections_total{reason="starting"} 1.0' in metrics


async def test_a_request_waiting_while_the_engine_drains_gets_503() -> None:
    async with asgi_client(sim_settings(*HELD_START)) as client:
        engine = client.app.state.playhead.engine
        held = fill_start_phase(engine)
        request = asyncio.ensure_future(
            client.post("/v1/audio/speech", json=speech_body("Hello there."))
        )
        await until(lambda: len(engine._start_queue) == 1)
        engine.close_admission()
        response = await asyncio.wait_for(request, 5)
        assert response.status_code == 503
        assert nothing_held(engine)
        for stream_id in held:
            engine.cancel(stream_id)


def test_a_waiter_whose_client_disconnects_gives_its_slot_back() -> None:
    """Over a real socket: the client closes its connection while its request waits for
    a start slot; the slot and the place in the queue are given back at once (before
    any start slot frees), and the request never reaches the engine."""
    with live_server(sim_settings(*HELD_START)) as server:
        engine = server.app.state.playhead.engine
        # the engine lives on the server's event loop (another thread): act there
        loop = engine._supervisor.get_loop()

        def on_server_loop(call):
            async def run():
                return call()

            return asyncio.run_coroutine_threadsafe(run(), loop).result(5)

        held = on_server_loop(lambda: fill_start_phase(engine))
        body = httpx.Request("POST", "/", json=speech_body("Hello there.")).read()
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(request_bytes(body, server.port))
            deadline = time.monotonic() + 5
            while len(engine._start_queue) != 1:
                assert time.monotonic() < deadline, "the request never queued"
                time.sleep(0.005)
            assert engine._reserved == 1
        deadline = time.monotonic() + 5
        while not nothing_held(engine):
            assert time.monotonic() < deadline, "the waiter's slot was not given back"
            time.sleep(0.005)
        assert engine.in_flight == 2  # the two held streams, nothing else
        on_server_loop(lambda: [engine.cancel(stream_id) for stream_id in held])

"""Graceful shutdown, as an operator sees it: `playhead serve` (a real process, sim
backend) gets SIGTERM with streams in flight.

New requests are answered 503 with Retry-After (not refused), a short stream in flight
finishes whole, a stream still running when `server.shutdown_grace_s` ends is cancelled
with an SSE error event, the log has no traceback, and the process exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from api_support import parse_sse

ROOT = Path(__file__).resolve().parent.parent
GRACE_S = 3.0
# The sim vocoder at ~0.5x real time per stream: a long text cannot end within the grace;
# a short one (~1.5 s of audio) ends in about 1 s.
SERVE_SETTINGS = (
    "sim.vocoder_per_frame_ms=40",
    "sim.vocoder_base_ms=2",
    # no start-up calibration: at these costs it runs its full 5 s, and nothing here admits
    "engine.calibration_calls=0",
    f"server.shutdown_grace_s={GRACE_S}",
    "admission.enabled=false",
)
LONG_TEXT = "This sentence is here to make a long stream that cannot end soon. " * 40
SHORT_TEXT = "Short and done."


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int, *settings: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLAYHEAD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "app", "serve", "--config", str(ROOT / "configs/sim.yaml")]
    argv += ["--port", str(port)]
    for item in settings:
        argv += ["--set", item]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the server did not become ready: " + proc.communicate()[1])
        time.sleep(0.1)


def speech(text: str, **fields: object) -> dict[str, object]:
    return {"model": "tts-1", "input": text, "voice": "sim", **fields}


def test_sigterm_drains_then_cancels_and_exits_0() -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(port, *SERVE_SETTINGS)
    results: dict[str, object] = {}

    def long_sse() -> None:
        with httpx.stream(
            "POST",
            f"{base}/v1/audio/speech",
            json=speech(LONG_TEXT, stream_format="sse"),
            timeout=30,
        ) as response:
            results["long_status"] = response.status_code
            results["long_body"] = response.read()

    def short_audio() -> None:
        response = httpx.post(
            f"{base}/v1/audio/speech", json=speech(SHORT_TEXT, response_format="wav"), timeout=30
        )
        results["short"] = response

    try:
        long_thread = threading.Thread(target=long_sse)
        long_thread.start()
        time.sleep(0.5)  # the long stream is playing
        short_thread = threading.Thread(target=short_audio)
        short_thread.start()
        time.sleep(0.1)  # the short one is in flight too
        signalled_s = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)

        # admission is closed, but the server still answers
        refused = httpx.post(f"{base}/v1/audio/speech", json=speech("Too late."), timeout=5)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "shutting_down"
        # ElevenLabs' and Cartesia's clients get it in their own API's shape
        el = httpx.post(f"{base}/v1/text-to-speech/sim/stream", json={"text": "Late."}, timeout=5)
        assert el.status_code == 503 and el.headers["retry-after"], el.text
        assert el.json()["detail"]["status"] == "shutting_down", el.text
        body = {"model_id": "sonic-2", "transcript": "Late.", "voice": {"mode": "id", "id": "sim"}}
        ca = httpx.post(f"{base}/tts/bytes", json=body, timeout=5)
        assert ca.status_code == 503 and ca.headers["retry-after"], ca.text
        assert ca.json()["error_code"] == "shutting_down", ca.text
        assert 1 <= int(refused.headers["retry-after"]) <= GRACE_S
        assert refused.headers["connection"] == "close"
        assert httpx.get(f"{base}/ready", timeout=5).status_code == 503
        assert httpx.get(f"{base}/health", timeout=5).status_code == 200

        short_thread.join(timeout=10)
        long_thread.join(timeout=GRACE_S + 10)
        _, err = proc.communicate(timeout=GRACE_S + 10)
        exited_after_s = time.monotonic() - signalled_s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert "shutting down: admission closed, 2 stream(s) in flight" in err
    assert "cancelling 1 stream(s)" in err
    assert GRACE_S <= exited_after_s < GRACE_S + 5

    short = results["short"]
    assert isinstance(short, httpx.Response) and short.status_code == 200
    assert short.content[:4] == b"RIFF" and len(short.content) > 44  # the whole file

    assert results["long_status"] == 200
    events = parse_sse(results["long_body"])  # type: ignore[arg-type]
    assert events[0]["type"] == "speech.audio.delta"
    last = events[-1]
    assert last["type"] == "error", json.dumps(last)[:200]
    assert last["error"]["code"] == "shutting_down"  # type: ignore[index]


def test_a_second_sigterm_ends_the_grace_at_once() -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(port, *SERVE_SETTINGS[:3], "server.shutdown_grace_s=60")
    done = threading.Event()

    def long_sse() -> None:
        try:
            with httpx.stream(
                "POST",
                f"{base}/v1/audio/speech",
                json=speech(LONG_TEXT, stream_format="sse"),
                timeout=30,
            ) as response:
                response.read()
        except httpx.HTTPError:
            pass
        done.set()

    try:
        thread = threading.Thread(target=long_sse)
        thread.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None  # draining: the 60 s grace runs
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        thread.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert done.is_set()

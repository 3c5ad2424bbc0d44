"""First audio right after a barge-in, against an idle server's.

A voice agent that is interrupted drops the stream it is playing (closes the connection
mid-body) and sends the next request at once. That request's first audio should not wait
behind work for the stream that is gone. This measures, on a `playhead serve` subprocess
(the default voice unless --config says otherwise):

- idle: time to the first audio byte of a request sent to an idle server;
- after barge-in: a long request is read for `--read-s` of audio, its connection closed,
  and the next request sent at once; its time to the first audio byte.

    python -m benchmarks.lab.barge_in [--trials 10] [--config configs/default.yaml]

Target: first audio after a barge-in at most 1.3x an idle server's (medians).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.bench import serve

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
LONG_TEXT = (
    "This is a long answer that the listener will interrupt before it is over. "
    "It goes on about the weather, the trains, and the price of coffee in the old town. "
    "Nobody will hear the end of it, because the caller has something to say."
)
NEXT_TEXT = "Sorry, go ahead."
PCM_BYTES_PER_S = 24000 * 2  # the default output: 24 kHz s16le


def _body(text: str) -> dict[str, object]:
    return {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}


async def _first_audio_s(client: httpx.AsyncClient, url: str, text: str) -> float:
    """Seconds from sending a request to its first audio byte (the body is read whole)."""
    sent = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", url, json=_body(text)) as response:
        response.raise_for_status()
        async for chunk in response.aiter_bytes():
            if chunk and first is None:
                first = time.perf_counter() - sent
    assert first is not None, "no audio"
    return first


async def _barge_in(client: httpx.AsyncClient, url: str, read_s: float) -> float:
    """Read `read_s` of a long answer, drop it, and time the next request's first audio."""
    async with (
        httpx.AsyncClient(timeout=30.0) as dropped,  # its own connection, closed below
        dropped.stream("POST", url, json=_body(LONG_TEXT)) as response,
    ):
        response.raise_for_status()
        received = 0
        async for chunk in response.aiter_bytes():
            received += len(chunk)
            if received >= read_s * PCM_BYTES_PER_S:
                break
    return await _first_audio_s(client, url, NEXT_TEXT)


async def measure(base_url: str, trials: int, read_s: float) -> dict[str, object]:
    url = base_url + "/v1/audio/speech"
    async with httpx.AsyncClient(timeout=30.0) as client:
        for _ in range(2):  # warm the voice and the encoders
            await _first_audio_s(client, url, NEXT_TEXT)
        idle, after = [], []
        for _ in range(trials):
            await asyncio.sleep(0.5)  # the server is idle again
            idle.append(await _first_audio_s(client, url, NEXT_TEXT))
            await asyncio.sleep(0.5)
            after.append(await _barge_in(client, url, read_s))
    idle_ms = statistics.median(idle) * 1000
    after_ms = statistics.median(after) * 1000
    return {
        "trials": trials,
        "idle_ttfa_ms_p50": round(idle_ms, 1),
        "after_barge_in_ttfa_ms_p50": round(after_ms, 1),
        "after_barge_in_ttfa_ms_max": round(max(after) * 1000, 1),
        "ratio": round(after_ms / idle_ms, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--read-s", type=float, default=1.0, help="audio read before the drop")
    parser.add_argument("--set", action="append", default=[], help="section.field=value")
    parser.add_argument("--log", type=Path, help="keep the server's log here")
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory() as tmp,
        serve(
            args.config,
            ["admission.enabled=false", *args.set],
            args.log or Path(tmp) / "server.log",
        ) as base_url,
    ):
        result = asyncio.run(measure(base_url, args.trials, args.read_s))
    print(
        f"first audio: idle {result['idle_ttfa_ms_p50']} ms, right after a barge-in "
        f"{result['after_barge_in_ttfa_ms_p50']} ms (max {result['after_barge_in_ttfa_ms_max']}), "
        f"ratio {result['ratio']} over {result['trials']} trials (medians)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

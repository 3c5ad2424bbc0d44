"""Every protocol at once under one engine: are they all scheduled as one?

    python -m benchmarks.mixed_protocols [--config configs/default.yaml] [--load 0.9]

Starts a `playhead serve`, measures its capacity C (saturating clients on OpenAI's HTTP
API, as `make bench` does), then runs a closed loop of round(load x C) listeners whose
requests take turns over four protocols: OpenAI's `POST /v1/audio/speech` (pcm), Playhead's
WebSocket (live text, then `input.done`), ElevenLabs' multi-context WebSocket (text, `flush`,
`close_context`) and Cartesia's WebSocket (a `continue: true` message, then the end).
Every stream plays through the same 1x player (benchmarks/player.py) as its audio arrives;
the report gives each protocol's share of streams stall-free, its TTFA and its refusals,
beside the whole run's. A refusal on a socket (an error message saying to retry) counts
as a 429 does on HTTP, and its client waits the time it names before trying again.

The socket clients speak the wire protocols as the hosted services define them (and as
pipecat's and LiveKit's services send them); the tests run the real client packages.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import websockets

from benchmarks.bench import LoadPlan, measure_capacity, serve
from benchmarks.listening import PcmReader, RequestResult, StreamRecorder, Tracker
from benchmarks.loadgen import (
    Clock,
    RequestOptions,
    closed_loop,
    fetch_voice,
    load_corpus,
    request_once,
)
from benchmarks.player import Outcome, summarize

ROOT = Path(__file__).resolve().parent.parent
PROTOCOLS = ("openai", "playhead-ws", "elevenlabs", "cartesia")
SAMPLE_RATE_HZ = 24000


class Refused(Exception):
    """The server refused the stream (admission); retry after `retry_after_s`."""

    def __init__(self, retry_after_s: float | None) -> None:
        super().__init__(f"refused, retry after {retry_after_s}")
        self.retry_after_s = retry_after_s


def _ws_url(base_url: str, path: str) -> str:
    return "ws" + base_url.removeprefix("http") + path


def _halves(text: str) -> list[str]:
    """The text in two pieces, as a language model would stream it."""
    words = text.split(" ")
    cut = max(1, len(words) // 2)
    return [" ".join(words[:cut]) + " ", " ".join(words[cut:]) + " "]


async def playhead_ws(base_url: str, text: str, voice: str) -> AsyncIterator[bytes]:
    """Playhead's own WebSocket: yields s16le PCM as it arrives."""
    async with websockets.connect(_ws_url(base_url, "/v1/audio/speech/stream")) as ws:
        config = {"type": "session.config", "voice": voice, "response_format": "pcm"}
        await ws.send(json.dumps({**config, "sample_rate": SAMPLE_RATE_HZ}))
        for piece in _halves(text):
            await ws.send(json.dumps({"type": "input.text", "text": piece}))
        await ws.send(json.dumps({"type": "input.done"}))
        async for message in ws:
            if isinstance(message, bytes):
                yield message
                continue
            event = json.loads(message)
            if event["type"] == "audio.done":
                return
            if event["type"] == "error":
                if event["error"].get("code") == "rate_limit_exceeded":
                    raise Refused(event.get("retry_after_s"))
                raise RuntimeError(f"error event: {event['error']}")


async def elevenlabs_ws(base_url: str, text: str, voice: str) -> AsyncIterator[bytes]:
    """ElevenLabs' multi-context socket, one context per stream, as pipecat uses it."""
    query = f"?model_id=eleven_flash_v2_5&output_format=pcm_{SAMPLE_RATE_HZ}"
    path = f"/v1/text-to-speech/{voice}/multi-stream-input{query}"
    context = uuid.uuid4().hex
    async with websockets.connect(_ws_url(base_url, path)) as ws:
        await ws.send(json.dumps({"text": " ", "context_id": context}))
        for piece in _halves(text):
            await ws.send(json.dumps({"text": piece, "context_id": context}))
        await ws.send(json.dumps({"context_id": context, "flush": True}))
        await ws.send(json.dumps({"context_id": context, "close_context": True}))
        async for message in ws:
            event = json.loads(message)
            if event.get("error") or event.get("message_type") == "error":
                _raise_for(event)
            if event.get("audio"):
                yield base64.b64decode(event["audio"])
            if event.get("isFinal"):
                return


async def cartesia_ws(base_url: str, text: str, voice: str) -> AsyncIterator[bytes]:
    """Cartesia's socket: the text in `continue: true` pieces, then an empty last one."""
    path = "/tts/websocket?cartesia_version=2025-04-16"
    context = uuid.uuid4().hex
    request = {
        "model_id": "sonic-2",
        "voice": {"mode": "id", "id": voice},
        "output_format": {
            "container": "raw",
            "encoding": "pcm_s16le",
            "sample_rate": SAMPLE_RATE_HZ,
        },
        "context_id": context,
    }
    async with websockets.connect(_ws_url(base_url, path)) as ws:
        for piece in _halves(text):
            await ws.send(json.dumps({**request, "transcript": piece, "continue": True}))
        await ws.send(json.dumps({**request, "transcript": "", "continue": False}))
        async for message in ws:
            event = json.loads(message)
            kind = event.get("type")
            if kind == "error":
                _raise_for(event)
            if kind == "chunk" and event.get("data"):
                yield base64.b64decode(event["data"])
            if kind == "done" or event.get("done") is True:
                return


def _raise_for(event: dict[str, Any]) -> None:
    status = event.get("status_code") or event.get("status")
    if status == 429 or "retry" in json.dumps(event).lower():
        retry = event.get("retry_after_s") or event.get("retry_after")
        raise Refused(float(retry) if isinstance(retry, int | float) else None)
    raise RuntimeError(f"error message: {json.dumps(event)[:300]}")


SocketClient = Callable[[str, str, str], AsyncIterator[bytes]]
SOCKETS: dict[str, SocketClient] = {
    "playhead-ws": playhead_ws,
    "elevenlabs": elevenlabs_ws,
    "cartesia": cartesia_ws,
}


async def play_socket(
    client: SocketClient,
    base_url: str,
    text: str,
    voice: str,
    clock: Clock,
    waited_s: float,
    tracker: Tracker | None,
) -> RequestResult:
    """One stream over a socket protocol, played through a 1x player as it arrives."""
    reader = PcmReader(SAMPLE_RATE_HZ)
    outcome, error, retry_after = Outcome.FAILED, None, None
    with StreamRecorder(clock, text, waited_s=waited_s, tracker=tracker) as recorder:
        answered = recorder.sent_at_s
        try:
            async for data in client(base_url, text, voice):
                now = clock()
                seconds = reader.feed(now, data)
                if seconds > 0 and not recorder.arrivals:
                    answered = now
                recorder.hear(now, seconds)
            outcome = Outcome.OK if recorder.arrivals else Outcome.FAILED
            error = None if recorder.arrivals else "the stream ended without audio"
        except Refused as exc:
            outcome, retry_after = Outcome.REJECTED, exc.retry_after_s
        except (OSError, RuntimeError, ValueError, websockets.WebSocketException) as exc:
            error = f"{type(exc).__name__}: {exc}"
    return recorder.result(
        outcome,
        answered_at_s=answered,
        finished_at_s=clock(),
        retry_after_s=retry_after,
        error=error,
    )


@dataclass
class Mix:
    """closed_loop's requester: each request takes the next protocol in turn."""

    voice: str
    protocols: tuple[str, ...] = PROTOCOLS

    def __post_init__(self) -> None:
        self._turns = itertools.cycle(self.protocols)
        self.by_record: dict[int, str] = {}

    async def __call__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        text: str,
        options: RequestOptions,
        clock: Clock,
        waited_s: float = 0.0,
        tracker: Tracker | None = None,
    ) -> RequestResult:
        protocol = next(self._turns)
        result: Awaitable[RequestResult]
        if protocol == "openai":
            result = request_once(client, base_url, text, options, clock, waited_s, tracker)
        else:
            result = play_socket(
                SOCKETS[protocol], base_url, text, self.voice, clock, waited_s, tracker
            )
        done = await result
        self.by_record[id(done.record)] = protocol
        return done


def report(result: Any, mix: Mix, capacity: float) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    groups = {"all": list(result.records)}
    for protocol in mix.protocols:
        groups[protocol] = [r for r in result.records if mix.by_record.get(id(r)) == protocol]
    wall_s = result.window_s[1] - result.window_s[0]
    for name, records in groups.items():
        s = summarize(records, wall_s=wall_s)
        rows[name] = {
            "streams_ok": s.streams_ok,
            "failed": s.streams_failed,
            "refused": s.rejected,
            "stall_free_share": s.stall_free_share,
            "interruptions": s.interruptions,
            "ttfa_p50_ms": s.ttfa_p50_ms,
            "ttfa_p99_ms": s.ttfa_p99_ms,
            "worst_stall_ms": 1000.0
            * max((max(r.playback.stalls_s, default=0.0) for r in records), default=0.0),
        }
    failures = [r.error for r in result.records if r.outcome is Outcome.FAILED][:5]
    return {
        "capacity_audio_s_per_s": capacity,
        "listeners": int(result.load),
        "listening_mean": result.summary.listening_mean,
        "protocols": rows,
        "first_failures": failures,
    }


def table(figures: dict[str, Any]) -> str:
    lines = [
        f"C = {figures['capacity_audio_s_per_s']:.2f} audio s per s; "
        f"{figures['listeners']} listeners; {figures['listening_mean']:.1f} playing on average",
        "",
        "| protocol | streams | stall-free | worst stall | interruptions | TTFA p50 / p99 ms "
        "| refused | failed |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for name, row in figures["protocols"].items():
        p50, p99 = row["ttfa_p50_ms"] or 0.0, row["ttfa_p99_ms"] or 0.0
        lines.append(
            f"| {name} | {row['streams_ok']} | {100 * row['stall_free_share']:.0f}% | "
            f"{row['worst_stall_ms']:.0f} ms | {row['interruptions']} | "
            f"{p50:.0f} / {p99:.0f} | {row['refused']} | {row['failed']} |"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs/default.yaml")
    parser.add_argument("--load", type=float, default=0.9, help="listeners per unit of C")
    parser.add_argument("--capacity", type=float, help="C, if known (skips its measurement)")
    parser.add_argument("--capacity-streams", type=int, default=16)
    parser.add_argument("--duration", type=float, default=30.0, help="measured window, s")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument(
        "--protocols", default=",".join(PROTOCOLS), help=f"a subset of {','.join(PROTOCOLS)}"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    unknown = set(args.protocols.split(",")) - set(PROTOCOLS)
    if unknown:
        raise SystemExit(f"unknown protocols: {sorted(unknown)}; known: {PROTOCOLS}")
    args.out.mkdir(parents=True, exist_ok=True)
    texts = load_corpus()
    options = RequestOptions(voice="alloy", sample_rate_hz=SAMPLE_RATE_HZ)
    plan = LoadPlan(texts=texts, options=options, warmup_s=args.warmup)
    capacity = args.capacity
    if capacity is None:
        log = args.out / "mixed-capacity.log"
        capacity, _ = measure_capacity(args.config, [], args.capacity_streams, plan, log)
        print(f"C = {capacity:.2f} audio s per s", file=sys.stderr)
    listeners = max(1, round(args.load * capacity))
    with serve(args.config, [], args.out / "mixed-server.log") as url:
        voice = asyncio.run(fetch_voice(url))  # the id every protocol names
        mix = Mix(voice=voice, protocols=tuple(args.protocols.split(",")))
        result = asyncio.run(
            closed_loop(
                url,
                texts,
                streams=listeners,
                duration_s=args.warmup + args.duration,
                warmup_s=args.warmup,
                options=options,
                request=mix,
            )
        )
    figures = report(result, mix, capacity)
    figures["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    figures["load"] = args.load
    (args.out / "mixed-latest.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(table(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

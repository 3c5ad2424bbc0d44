"""A test client of WS /v1/audio/speech/stream (the `websockets` package): sends JSON
messages, files binary audio under the utterance of the last audio.start, and records when
each message arrived."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import websockets

PATH = "/v1/audio/speech/stream"


@dataclass
class Arrival:
    at_s: float  # time.monotonic()
    event: dict[str, Any] | None  # None: a binary frame
    size: int = 0  # bytes of a binary frame


@dataclass
class WsClient:
    ws: websockets.ClientConnection
    arrivals: list[Arrival] = field(default_factory=list)
    audio: dict[int, bytearray] = field(default_factory=dict)
    current: int | None = None  # utterance of the last audio.start

    async def send(self, type_: str, **fields: Any) -> float:
        """Send one message; returns when it was sent (time.monotonic())."""
        await self.ws.send(json.dumps({"type": type_, **fields}))
        return time.monotonic()

    async def send_raw(self, data: str | bytes) -> None:
        await self.ws.send(data)

    async def receive(self, timeout_s: float = 20.0) -> Arrival:
        message = await asyncio.wait_for(self.ws.recv(), timeout_s)
        now_s = time.monotonic()
        if isinstance(message, bytes):
            assert self.current is not None, "audio before audio.start"
            self.audio[self.current] += message
            arrival = Arrival(now_s, None, len(message))
        else:
            event = json.loads(message)
            if event["type"] == "audio.start":
                self.current = event["utterance"]
                self.audio.setdefault(self.current, bytearray())
            arrival = Arrival(now_s, event)
        self.arrivals.append(arrival)
        return arrival

    async def until(
        self, predicate: Callable[[dict[str, Any]], bool] | str, timeout_s: float = 20.0
    ) -> Arrival:
        """Receive until an event matching `predicate` (or of that type) arrives."""
        if isinstance(predicate, str):
            wanted = predicate
            predicate = lambda event: event["type"] == wanted  # noqa: E731
        deadline_s = time.monotonic() + timeout_s
        while True:
            arrival = await self.receive(max(0.01, deadline_s - time.monotonic()))
            if arrival.event is not None and predicate(arrival.event):
                return arrival

    async def closed(self, timeout_s: float = 20.0) -> tuple[int | None, list[dict[str, Any]]]:
        """Receive until the server closes: (close code, the events received meanwhile)."""
        events = []
        try:
            while True:
                arrival = await self.receive(timeout_s)
                if arrival.event is not None:
                    events.append(arrival.event)
        except websockets.ConnectionClosed as closed:
            return (closed.rcvd.code if closed.rcvd else None), events

    def events(self, type_: str | None = None) -> list[dict[str, Any]]:
        return [
            a.event
            for a in self.arrivals
            if a.event is not None and (type_ is None or a.event["type"] == type_)
        ]

    def pcm(self, utterance: int) -> np.ndarray:
        return np.frombuffer(bytes(self.audio.get(utterance, b"")), dtype="<i2")


@asynccontextmanager
async def connect(
    base_url: str, *, config: dict[str, Any] | None = None, query: str = "", **kwargs: Any
) -> AsyncIterator[WsClient]:
    """A connected client; `config` is sent as session.config first (unless None)."""
    url = base_url.replace("http://", "ws://") + PATH + query
    async with websockets.connect(url, max_size=None, **kwargs) as ws:
        client = WsClient(ws)
        if config is not None:
            await client.send("session.config", **config)
        yield client


async def speak(client: WsClient, *pieces: str) -> dict[str, Any]:
    """Send the pieces and input.done; returns the utterance's audio.done."""
    for piece in pieces:
        await client.send("input.text", text=piece)
    await client.send("input.done")
    return (await client.until("audio.done")).event  # type: ignore[return-value]

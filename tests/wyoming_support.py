"""Helpers of the Wyoming tests: what a client reads back, timed, and raw exchanges.

The client is the wyoming package's own (`AsyncTcpClient`), as Home Assistant uses it."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field

import numpy as np
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, async_read_event
from wyoming.tts import SynthesizeStopped


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Reply:
    """The events of one synthesis, each with its arrival time (time.monotonic)."""

    events: list[tuple[float, Event]] = field(default_factory=list)
    closed: bool = False  # the server closed the connection

    @property
    def types(self) -> list[str]:
        return [event.type for _, event in self.events]

    def first(self, event_type: str) -> tuple[float, Event]:
        return next((at, e) for at, e in self.events if e.type == event_type)

    @property
    def error(self) -> Error | None:
        found = [Error.from_event(e) for _, e in self.events if Error.is_type(e.type)]
        return found[0] if found else None

    @property
    def start(self) -> AudioStart:
        return AudioStart.from_event(self.first("audio-start")[1])

    @property
    def chunks(self) -> list[AudioChunk]:
        return [AudioChunk.from_event(e) for _, e in self.events if AudioChunk.is_type(e.type)]

    @property
    def pcm(self) -> np.ndarray:
        """The audio as int16 samples."""
        data = b"".join(chunk.audio for chunk in self.chunks)
        return np.frombuffer(data, dtype="<i2")

    @property
    def audio_s(self) -> float:
        return self.pcm.size / self.start.rate


async def read_reply(client: AsyncTcpClient, *, streamed: bool, timeout_s: float = 30.0) -> Reply:
    """Events until the synthesis ends (audio-stop; for a streamed one synthesize-stopped),
    an error, or the connection closing."""
    reply = Reply()
    async with asyncio.timeout(timeout_s):
        while True:
            event = await client.read_event()
            if event is None:
                reply.closed = True
                return reply
            reply.events.append((time.monotonic(), event))
            if Error.is_type(event.type):
                return reply
            if AudioStop.is_type(event.type) and not streamed:
                return reply
            if SynthesizeStopped.is_type(event.type):
                return reply


async def read_until_closed(client: AsyncTcpClient, timeout_s: float = 10.0) -> Reply:
    reply = Reply()
    async with asyncio.timeout(timeout_s):
        while (event := await client.read_event()) is not None:
            reply.events.append((time.monotonic(), event))
    reply.closed = True
    return reply


def frame(event_type: str, data: dict[str, object] | None = None) -> bytes:
    """One event as the wire has it, the data in the header line."""
    header: dict[str, object] = {"type": event_type}
    if data is not None:
        header["data"] = data
    return json.dumps(header).encode() + b"\n"


async def raw_exchange(port: int, data: bytes, timeout_s: float = 10.0) -> Reply:
    """Write raw bytes on a new connection; read every event until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        reply = Reply()
        async with asyncio.timeout(timeout_s):
            while (event := await async_read_event(reader)) is not None:
                reply.events.append((time.monotonic(), event))
        reply.closed = True
        return reply
    finally:
        writer.close()

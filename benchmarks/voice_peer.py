"""The peer in `make bench-voice`: piper's own HTTP server, measured like Playhead.

`python -m piper.http_server -m <voice.onnx>` (Flask, one thread per request) answers
POST /synthesize {"text": ...} with a whole WAV file once the whole text is synthesised.
The client here plays that WAV through the same 1x player (benchmarks/player.py) as the
bytes arrive: TTFA is the first byte of the WAV body (the first audio sample, since the
44-byte header and the samples leave together), durations come from the WAV's format.

Loads run through benchmarks.loadgen's `closed_loop` with `request=peer_request` and
`options=PEER_OPTIONS` (the same loop, window and figures as Playhead's).
"""

from __future__ import annotations

import struct
import sys
from contextlib import AbstractContextManager
from pathlib import Path

import httpx

from benchmarks.bench import free_port, server_process
from benchmarks.loadgen import (
    Arrival,
    Clock,
    PcmReader,
    RequestOptions,
    RequestResult,
    Tracker,
    play_request,
)

# What a piper run's LoadResult reports; piper reads nothing of it but the read timeout.
PEER_OPTIONS = RequestOptions(voice="piper-http", response_format="wav", timeout_s=300.0)
PEER_DRAIN_TIMEOUT_S = 300.0  # piper finishes every request it started


def piper_server(
    model_path: Path, log_path: Path, timeout_s: float = 60.0
) -> AbstractContextManager[str]:
    """piper's HTTP server on a free loopback port; yields its base URL once it answers."""
    port = free_port()
    command = [
        sys.executable, "-m", "piper.http_server", "-m", str(model_path),
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    return server_process(
        command, port, log_path, ready_path="/info", name="piper's server", timeout_s=timeout_s
    )


class WavReader:
    """Seconds of audio in a WAV body read piece by piece (RIFF chunks up to "data", then
    PCM); a loadgen BodyReader."""

    def __init__(self) -> None:
        self._head = b""
        self._pcm: PcmReader | None = None

    def feed(self, at_s: float, data: bytes) -> float:
        if self._pcm is None:
            self._head += data
            parsed = self._parse()
            if parsed is None:
                return 0.0
            start, self._pcm = parsed
            data, self._head = self._head[start:], b""
        return self._pcm.feed(at_s, data)

    def flush(self) -> list[Arrival]:
        return []

    def _parse(self) -> tuple[int, PcmReader] | None:
        """(where the samples start, their reader) once the header is in."""
        head = self._head
        if len(head) < 12:
            return None
        if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            raise ValueError("not a WAV body")
        pos = 12
        rate_hz = channels = bits = 0
        while pos + 8 <= len(head):
            tag, size = head[pos : pos + 4], struct.unpack_from("<I", head, pos + 4)[0]
            if tag == b"data":
                if not rate_hz:
                    raise ValueError("WAV data before its fmt chunk")
                return pos + 8, PcmReader(rate_hz, channels * bits // 8)
            if pos + 8 + size > len(head):
                return None
            if tag == b"fmt ":
                channels, rate_hz = struct.unpack_from("<HI", head, pos + 10)
                bits = struct.unpack_from("<H", head, pos + 22)[0]
            pos += 8 + size + (size & 1)
        return None


async def peer_request(
    client: httpx.AsyncClient,
    base_url: str,
    text: str,
    options: RequestOptions,
    clock: Clock,
    waited_s: float = 0.0,
    tracker: Tracker | None = None,
) -> RequestResult:
    """POST /synthesize and play the WAV as it arrives (a loadgen Requester; `options` only
    label the run). Never raises for HTTP errors."""
    return await play_request(
        client,
        base_url.rstrip("/") + "/synthesize",
        text,
        clock,
        body={"text": text},
        reader=WavReader(),
        waited_s=waited_s,
        tracker=tracker,
    )

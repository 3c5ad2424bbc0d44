"""First decodable audio per response format, against pcm, on a running server.

For each run, one request per format (the formats in a rotated order, so that none is
always first after an idle pause), each a one-sentence text on the server's default voice.
The body is fed to an incremental PyAV decoder as it arrives (benchmarks/stream_decoder.py)
and two times are taken from the request's start: the first body byte and the first decoded
sample. Prints the medians per format, their difference from pcm's, and the median wait
from the first byte to the first sample (what the format costs a player once bytes flow,
apart from the server's own time to first audio, which a busy machine makes noisy).

    playhead serve --port 8000 &
    python -m benchmarks.first_audio_formats [--server http://127.0.0.1:8000] [--runs 5]
        [--mode parse|demux] [--formats pcm,mp3,opus,aac,flac,wav]

--mode demux decodes everything through libavformat's demuxer (as ffplay does); its mp3
demuxer needs ~1 KiB of frames before a sample whatever the server sends (see
stream_decoder.py), so mp3 then measures the demuxer, not the server.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

import httpx

from benchmarks.stream_decoder import MODES, StreamDecoder

FORMATS = ("pcm", "mp3", "opus", "aac", "flac", "wav")
BUSY_RETRIES = 30
TEXT = "The quick brown fox jumps over the lazy dog near the river bank."


@dataclass(frozen=True)
class FirstAudio:
    fmt: str
    first_byte_ms: float
    first_sample_ms: float
    bytes_at_first_sample: int


def first_audio(
    client: httpx.Client,
    fmt: str,
    *,
    text: str = TEXT,
    mode: str = "parse",
    voice: str = "alloy",
    sample_rate_hz: int | None = None,
) -> FirstAudio:
    """One request; times from just before it is sent. Reads the body to its end."""
    body: dict[str, object] = {
        "model": "tts-1",
        "input": text,
        "voice": voice,
        "response_format": fmt,
    }
    if sample_rate_hz is not None:
        body["sample_rate"] = sample_rate_hz
    for _ in range(BUSY_RETRIES):
        try:
            return _first_audio(client, fmt, body, mode, sample_rate_hz or 24000)
        except _Busy as busy:  # a busy machine's capacity estimate: wait, as a client would
            time.sleep(busy.retry_after_s)
    raise RuntimeError(f"{fmt}: still refused (429) after {BUSY_RETRIES} tries")


class _Busy(Exception):
    def __init__(self, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s


def _first_audio(
    client: httpx.Client, fmt: str, body: dict[str, object], mode: str, rate_hz: int
) -> FirstAudio:
    decoder = StreamDecoder(fmt, rate_hz, mode)
    first_byte_s: float | None = None
    start_s = time.perf_counter()
    with client.stream("POST", "/v1/audio/speech", json=body) as response:
        if response.status_code == 429:
            raise _Busy(float(response.headers.get("retry-after", "1")))
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"{fmt}: HTTP {response.status_code}: {response.text[:200]}")
        for data in response.iter_raw():
            if first_byte_s is None:
                first_byte_s = time.perf_counter()
            if decoder.first_sample_s is None:
                decoder.feed(data)
                decoder.settle()
    decoder.end()
    if decoder.error is not None:
        raise RuntimeError(f"{fmt}: decoding failed: {decoder.error}")
    if first_byte_s is None or decoder.first_sample_s is None:
        raise RuntimeError(f"{fmt}: no audio decoded")
    return FirstAudio(
        fmt,
        (first_byte_s - start_s) * 1e3,
        (decoder.first_sample_s - start_s) * 1e3,
        decoder.bytes_at_first_sample or 0,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="http://127.0.0.1:8000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mode", choices=MODES, default="parse")
    parser.add_argument("--formats", default=",".join(FORMATS[:5]))
    parser.add_argument("--text", default=TEXT)
    args = parser.parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if "pcm" not in formats:
        formats.insert(0, "pcm")
    results: dict[str, list[FirstAudio]] = {fmt: [] for fmt in formats}
    with httpx.Client(base_url=args.server, timeout=60) as client:
        first_audio(client, "pcm", text=args.text)  # warm-up, not counted
        for run in range(args.runs):
            shift = run % len(formats)
            for fmt in formats[shift:] + formats[:shift]:
                results[fmt].append(first_audio(client, fmt, text=args.text, mode=args.mode))
    pcm_ms = statistics.median(r.first_sample_ms for r in results["pcm"])
    print(f"first decodable audio, medians of {args.runs} ({args.mode} decoder), {args.server}")
    print(f"{'format':<7}{'first byte ms':>15}{'first sample ms':>17}{'vs pcm ms':>11}"
          f"{'after 1st byte':>16}{'bytes needed':>14}")  # fmt: skip
    for fmt, runs in results.items():
        byte_ms = statistics.median(r.first_byte_ms for r in runs)
        sample_ms = statistics.median(r.first_sample_ms for r in runs)
        wait_ms = statistics.median(r.first_sample_ms - r.first_byte_ms for r in runs)
        needed = statistics.median(r.bytes_at_first_sample for r in runs)
        print(f"{fmt:<7}{byte_ms:>15.1f}{sample_ms:>17.1f}{sample_ms - pcm_ms:>+11.1f}"
              f"{wait_ms:>16.1f}{needed:>14.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

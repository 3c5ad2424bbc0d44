"""Every format's first audio is decodable as soon as its first bytes arrive.

The decoder is benchmarks/stream_decoder.py: PyAV fed the bytes as they come, its parser
(mp3, aac, flac) or libavformat's Ogg demuxer (opus) with the low-latency options LiveKit's
decoder uses. `settle()` says whether the bytes fed so far gave a sample before the
decoder asked for more.

What each codec needs before its first packet (24 kHz): mp3 (LAME, no bit reservoir) 1152
samples, aac 2048 (a frame of look-ahead; the first write is aligned to whole frames with
leading silence), opus 480. FLAC's frames are there at once, but libavcodec's FLAC parser
only hands one on once it has seen 10 more frame headers, so FLAC is decodable later: 11
blocks, which are 24 ms long (264 ms of audio; ffmpeg's default 2304-sample blocks made it
1056 ms); its header, though, leaves with the first write.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.audio import open_encoder
from app.settings import load_settings
from benchmarks.stream_decoder import StreamDecoder
from tests.api_support import LiveServer, live_server, sim_settings

ROOT = Path(__file__).resolve().parent.parent
VOICE_START_S = 120.0
PIPER_RATE_HZ = 22050
PIPER_FIRST_CHUNK = 8 * 256  # the default ramp's first chunk: 8 Piper frames, 93 ms
OUTPUT_RATE_HZ = 24000
FIRST_DECODABLE = ("pcm", "wav", "mp3", "opus", "aac")
TEXT = "The quick brown fox jumps over the lazy dog near the river bank."


def _speechlike(samples: int, rate_hz: int) -> np.ndarray:
    t = np.arange(samples) / rate_hz
    phase = 2 * np.pi * np.cumsum(140 + 20 * np.sin(2 * np.pi * 3 * t)) / rate_hz
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    return (0.2 * voiced * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def _decodable_alone(fmt: str, data: bytes, mode: str = "parse") -> bool:
    decoder = StreamDecoder(fmt, OUTPUT_RATE_HZ, mode)
    try:
        decoder.feed(data)
        return decoder.settle()
    finally:
        decoder.end()


# --- the encoder: what its first write gives --------------------------------------------


@pytest.mark.parametrize("fmt", FIRST_DECODABLE)
def test_the_first_chunk_of_the_voice_is_decodable_from_its_own_bytes(fmt):
    encoder = open_encoder(fmt, PIPER_RATE_HZ, OUTPUT_RATE_HZ)
    try:
        first = encoder.encode(_speechlike(PIPER_FIRST_CHUNK, PIPER_RATE_HZ))
    finally:
        encoder.close()
    assert first, f"{fmt}: the first chunk gave no bytes"
    assert _decodable_alone(fmt, first)


def test_opus_first_write_is_decodable_by_a_demuxing_player():
    encoder = open_encoder("opus", PIPER_RATE_HZ, OUTPUT_RATE_HZ)
    try:
        first = encoder.encode(_speechlike(PIPER_FIRST_CHUNK, PIPER_RATE_HZ))
    finally:
        encoder.close()
    assert _decodable_alone("opus", first, mode="demux")


@pytest.mark.parametrize("first_samples", [1100, 1781, 2047, 2049, 3000])
def test_aac_gives_a_packet_for_any_first_write_over_one_frame(first_samples):
    encoder = open_encoder("aac", OUTPUT_RATE_HZ, OUTPUT_RATE_HZ)
    try:
        first = encoder.encode(_speechlike(first_samples, OUTPUT_RATE_HZ))
        later = encoder.encode(_speechlike(4096, OUTPUT_RATE_HZ)) + encoder.finish()
    finally:
        encoder.close()
    assert _decodable_alone("aac", first)
    # still one valid stream: the whole decodes, the leading silence at most one frame
    decoder = StreamDecoder("aac", OUTPUT_RATE_HZ)
    decoder.feed(first + later)
    decoder.end()
    assert decoder.error is None
    extra = decoder.samples - (first_samples + 4096)
    assert 1024 <= extra <= 1024 + 1023 + 1024  # priming + alignment + last-frame padding


def test_mp3_needs_two_frames_for_its_first_bytes():
    encoder = open_encoder("mp3", OUTPUT_RATE_HZ, OUTPUT_RATE_HZ)
    try:
        assert encoder.encode(_speechlike(1151, OUTPUT_RATE_HZ)) == b""
        first = encoder.encode(_speechlike(1, OUTPUT_RATE_HZ))  # 1152: two 576-sample frames
    finally:
        encoder.close()
    assert first and _decodable_alone("mp3", first)


def test_flac_is_decodable_after_eleven_short_blocks():
    encoder = open_encoder("flac", OUTPUT_RATE_HZ, OUTPUT_RATE_HZ)
    decoder = StreamDecoder("flac", OUTPUT_RATE_HZ)
    fed = 0
    try:
        while fed < OUTPUT_RATE_HZ and not decoder.settle():
            decoder.feed(encoder.encode(_speechlike(240, OUTPUT_RATE_HZ)))
            fed += 240
    finally:
        encoder.close()
        decoder.end()
    assert fed <= 11 * 576 + 240  # 11 blocks of 24 ms: ~0.27 s of audio at 24 kHz


@pytest.mark.parametrize(("fmt", "magic"), [("flac", b"fLaC"), ("opus", b"OggS"), ("wav", b"RIFF")])
def test_the_container_header_leaves_with_the_first_write(fmt, magic):
    encoder = open_encoder(fmt, OUTPUT_RATE_HZ, OUTPUT_RATE_HZ)
    try:
        first = encoder.encode(_speechlike(100, OUTPUT_RATE_HZ))  # less than a codec frame
    finally:
        encoder.close()
    assert first.startswith(magic)
    if fmt == "opus":
        assert b"OpusHead" in first and b"OpusTags" in first


# --- a live server: the HTTP body as it streams -------------------------------------------


def _first_audio(client: httpx.Client, fmt: str) -> tuple[float, bool, float]:
    """(ms to the first body byte, whether that first piece decoded alone, ms to the first
    decoded sample)."""
    body = {"model": "tts-1", "input": TEXT, "voice": "alloy", "response_format": fmt}
    decoder = StreamDecoder(fmt, OUTPUT_RATE_HZ)
    start_s = time.perf_counter()
    first_byte_ms: float | None = None
    alone = False
    with client.stream("POST", "/v1/audio/speech", json=body) as response:
        assert response.status_code == 200, response.read()[:300]
        for piece in response.iter_raw():
            if decoder.first_sample_s is not None or not piece:
                continue
            decoder.feed(piece)
            decodable = decoder.settle()
            if first_byte_ms is None:
                first_byte_ms = (time.perf_counter() - start_s) * 1e3
                alone = decodable
    decoder.end()
    assert first_byte_ms is not None and decoder.first_sample_s is not None
    return first_byte_ms, alone, (decoder.first_sample_s - start_s) * 1e3


def _report(label: str, results: dict[str, list[tuple[float, bool, float]]]) -> None:
    pcm_ms = statistics.median(r[2] for r in results["pcm"])
    lines = [f"first decodable audio ({label}), medians, vs pcm:"]
    for fmt, runs in results.items():
        sample_ms = statistics.median(r[2] for r in runs)
        lines.append(f"  {fmt:<5} {sample_ms:7.1f} ms  {sample_ms - pcm_ms:+6.1f} ms")
    print("\n".join(lines))


def _measure(base_url: str, formats: tuple[str, ...], runs: int):
    results: dict[str, list[tuple[float, bool, float]]] = {fmt: [] for fmt in formats}
    with httpx.Client(base_url=base_url, timeout=60) as client:
        _first_audio(client, "pcm")  # warm-up
        for run in range(runs):
            for fmt in formats[run % len(formats) :] + formats[: run % len(formats)]:
                results[fmt].append(_first_audio(client, fmt))
    return results


def test_live_sim_server_first_body_piece_decodes_alone():
    formats = ("pcm", "mp3", "opus", "aac", "wav")
    with live_server(sim_settings("admission.enabled=false")) as server:
        results = _measure(server.base_url, formats, runs=3)
    _report("sim backend, busy CI machine", results)
    for fmt, runs in results.items():
        assert all(alone for _, alone, _ in runs), f"{fmt}: a first body piece did not decode"


@contextmanager
def _voice_server(settings):
    """A live server of the real voice: loading it takes a while on a busy machine."""
    live = LiveServer(settings)
    live.start(timeout_s=VOICE_START_S)
    try:
        yield live
    finally:
        live.stop()


@pytest.mark.slow
def test_live_voice_first_body_piece_decodes_alone():
    """The default voice: a 93 ms first chunk at 22050 Hz, resampled to 24 kHz."""
    settings = load_settings(
        ROOT / "configs" / "default.yaml",
        [
            "backend.kind=piper",
            "server.log_level=warning",
            "admission.enabled=false",
            "engine.calibration_calls=0",
        ],
        environ={},
    )
    formats = ("pcm", "mp3", "opus", "aac")
    with _voice_server(settings) as server:
        results = _measure(server.base_url, formats, runs=3)
    _report("default voice, busy CI machine", results)
    for fmt, runs in results.items():
        assert all(alone for _, alone, _ in runs), f"{fmt}: a first body piece did not decode"

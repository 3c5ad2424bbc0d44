"""G.711 u-law output, checked against ffmpeg's encoder and decoded back by ffmpeg."""

from __future__ import annotations

import io

import av
import numpy as np

from app.audio import FORMATS, open_encoder
from app.audio_codecs import ulaw_encode


def _ffmpeg_ulaw(s16: np.ndarray, rate_hz: int) -> bytes:
    """ffmpeg's pcm_mulaw encoding of s16 samples (the reference)."""
    sink = io.BytesIO()
    with av.open(sink, "w", format="mulaw") as container:
        stream = container.add_stream("pcm_mulaw", rate=rate_hz, layout="mono")
        frame = av.AudioFrame.from_ndarray(s16.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate_hz
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return sink.getvalue()


def _ffmpeg_decode(data: bytes, rate_hz: int) -> np.ndarray:
    options = {"sample_rate": str(rate_hz), "ch_layout": "mono"}
    with av.open(io.BytesIO(data), format="mulaw", options=options) as container:
        planes = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
    return np.concatenate(planes).astype(np.float32) / 32768.0


def test_every_16_bit_value_encodes_within_one_level_of_ffmpeg():
    s16 = np.arange(-32768, 32768, dtype=np.int16)
    ours = np.frombuffer(ulaw_encode(s16), np.uint8)
    theirs = np.frombuffer(_ffmpeg_ulaw(s16, 8000), np.uint8)
    differ = ours != theirs
    # ffmpeg rounds to the nearest level where g711.c truncates: a level apart, rarely
    assert differ.mean() < 0.01
    assert np.all(np.abs(ours.astype(int) - theirs.astype(int))[differ] == 1)
    # decoded, every value lands within its segment's step (the quantiser is sound)
    decoded = _ffmpeg_decode(ours.tobytes(), 8000) * 32768.0
    step = np.maximum(8.0, 2.0 ** (np.floor(np.log2(np.abs(s16.astype(float)) + 132)) - 3))
    assert np.all(np.abs(decoded - np.clip(s16, -32124, 32124)) <= step)


def test_stream_encoder_resamples_to_8k_ulaw_without_holding_samples_back():
    rate_in_hz = 22050
    t = np.arange(rate_in_hz) / rate_in_hz
    pcm = (0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    encoder = open_encoder("ulaw", rate_in_hz, 8000)
    assert encoder.content_type == FORMATS["ulaw"] == "audio/basic"
    assert encoder.raw and encoder.output_rate_hz == 8000
    parts = [encoder.encode(pcm[i : i + 2205]) for i in range(0, pcm.size, 2205)]
    assert all(parts[1:])  # every chunk brings its bytes (after the resampler's delay)
    data = b"".join(parts) + encoder.finish()
    assert len(data) == encoder.output_samples == 8000  # one byte a sample, exact length
    decoded = _ffmpeg_decode(data, 8000)
    spectrum = np.abs(np.fft.rfft(decoded * np.hanning(decoded.size)))
    assert abs(np.argmax(spectrum) * 8000 / decoded.size - 440.0) < 2.0
    rms_ratio = np.sqrt(np.mean(decoded**2) / np.mean(pcm**2))
    assert 0.9 < rms_ratio < 1.1

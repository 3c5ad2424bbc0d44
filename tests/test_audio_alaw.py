"""G.711 A-law output: bit-exact with ITU-T's reference encoder, checked against ffmpeg's
pcm_alaw encoder and decoded back by ffmpeg."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from app.audio import FORMATS, open_encoder
from app.audio_codecs import alaw_encode

EVERY_S16 = np.arange(-32768, 32768, dtype=np.int16)


def _g191_alaw(sample: int) -> int:
    """ITU-T G.191's alaw_compress for one 16-bit sample, step by step as the reference
    writes it (a loop finds the exponent), so the vectorised encoder is checked against
    another way of computing the same thing."""
    ix = (~sample if sample < 0 else sample) >> 4  # one's complement of a negative sample
    if ix > 15:
        exponent = 1
        while ix > 16 + 15:
            ix >>= 1
            exponent += 1
        ix -= 16  # the leading one goes
        ix += exponent << 4
    if sample >= 0:
        ix |= 0x80  # the sign bit
    return ix ^ 0x55  # even bits inverted


def _ffmpeg_alaw(s16: np.ndarray, rate_hz: int) -> bytes:
    """ffmpeg's pcm_alaw encoding of s16 samples."""
    sink = io.BytesIO()
    with av.open(sink, "w", format="alaw") as container:
        stream = container.add_stream("pcm_alaw", rate=rate_hz, layout="mono")
        frame = av.AudioFrame.from_ndarray(s16.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate_hz
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return sink.getvalue()


def _ffmpeg_decode(data: bytes, rate_hz: int) -> np.ndarray:
    """ffmpeg's pcm_alaw decoder: s16 values."""
    options = {"sample_rate": str(rate_hz), "ch_layout": "mono"}
    with av.open(io.BytesIO(data), format="alaw", options=options) as container:
        planes = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
    return np.concatenate(planes).astype(np.int32)


def test_every_16_bit_value_encodes_as_the_itu_reference() -> None:
    ours = np.frombuffer(alaw_encode(EVERY_S16), np.uint8)
    reference = np.array([_g191_alaw(int(s)) for s in EVERY_S16], dtype=np.uint8)
    assert np.array_equal(ours, reference)
    # G.711's own table ends: zero and the extremes
    at = {int(s): int(c) for s, c in zip(EVERY_S16, ours, strict=True)}
    assert (at[0], at[-1], at[32767], at[-32768]) == (0xD5, 0x55, 0xAA, 0x2A)


def test_ffmpeg_rounds_to_the_nearest_level_where_g711_has_decision_levels() -> None:
    """ffmpeg's pcm_alaw is a table on x >> 2 (a negative sample's magnitude rounded up to
    a multiple of 4) that picks the nearest reconstruction level; G.711 quantises x (a
    negative one through its one's complement) between its decision levels, the edges of
    the intervals. Where the step doubles, at a segment edge b (512, 1024 ... 16384), the
    b / 128 magnitudes just above b are nearer to the level below it: ffmpeg takes that
    one. 964 of the 65536 values (1.5 %) differ, each by one level, never in sign."""
    ours = np.frombuffer(alaw_encode(EVERY_S16), np.uint8)
    theirs = np.frombuffer(_ffmpeg_alaw(EVERY_S16, 8000), np.uint8)
    x = EVERY_S16.astype(int)
    # ffmpeg's rule, written out: its table is exactly this
    positive_codes = ((np.arange(128) | 0x80) ^ 0x55).astype(np.uint8)
    levels = _ffmpeg_decode(positive_codes.tobytes(), 8000)  # the 128 magnitudes
    thresholds = (levels[:-1] + levels[1:] + 4) >> 3  # midpoints, on x >> 2
    shifted = x >> 2
    level = np.searchsorted(thresholds, np.abs(shifted), side="right")
    assert np.array_equal(np.where(shifted < 0, level, level | 0x80) ^ 0x55, theirs)
    # where and how far the two differ
    magnitude = lambda codes: (codes.astype(int) ^ 0x55) & 0x7F  # noqa: E731
    differ = ours != theirs
    assert differ.sum() == 964
    assert np.all(np.abs(magnitude(theirs[differ]) - magnitude(ours[differ])) == 1)
    assert np.all((ours[differ] ^ theirs[differ]) & 0x80 == 0)
    edges = [512 << k for k in range(6)]
    above_an_edge = np.zeros_like(differ)
    for b in edges:
        above_an_edge |= (b <= x) & (x < b + b // 128)
    assert np.array_equal(differ & (x >= 0), above_an_edge)
    # decoded, each of ours lands within half its level's step of the sample (G.711's
    # reconstruction levels are the middles of its intervals)
    decoded = _ffmpeg_decode(ours.tobytes(), 8000)
    segment = magnitude(ours) >> 4
    half_step = 8 << np.maximum(segment - 1, 0)
    assert np.all(np.abs(decoded - x) <= half_step)


def test_stream_encoder_resamples_to_8k_alaw_without_holding_samples_back() -> None:
    rate_in_hz = 22050
    t = np.arange(rate_in_hz) / rate_in_hz
    pcm = (0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    encoder = open_encoder("alaw", rate_in_hz, 8000)
    assert encoder.content_type == FORMATS["alaw"] == "audio/PCMA"
    assert encoder.raw and encoder.output_rate_hz == 8000
    parts = [encoder.encode(pcm[i : i + 2205]) for i in range(0, pcm.size, 2205)]
    assert all(parts[1:])  # every chunk brings its bytes (after the resampler's delay)
    data = b"".join(parts) + encoder.finish()
    assert len(data) == encoder.output_samples == 8000  # one byte a sample, exact length
    decoded = _ffmpeg_decode(data, 8000) / 32768.0
    spectrum = np.abs(np.fft.rfft(decoded * np.hanning(decoded.size)))
    assert abs(np.argmax(spectrum) * 8000 / decoded.size - 440.0) < 2.0
    reference = open_encoder("pcm", rate_in_hz, 8000)
    exact = np.frombuffer(reference.encode(pcm) + reference.finish(), "<i2") / 32768.0
    noise = decoded - exact
    snr_db = 10 * np.log10(np.mean(exact**2) / np.mean(noise**2))
    assert snr_db > 30.0  # G.711 gives ~38 dB on a loud signal


@pytest.mark.parametrize("rate_hz", [8000, 16000])
def test_alaw_is_a_byte_a_sample_at_any_rate(rate_hz: int) -> None:
    encoder = open_encoder("alaw", rate_hz, rate_hz)
    data = encoder.encode(np.zeros(rate_hz // 10, np.float32)) + encoder.finish()
    assert data == b"\xd5" * (rate_hz // 10)  # silence: positive zero

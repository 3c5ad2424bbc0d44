"""Streaming encoders: real PyAV, real soxr; every stream is decoded back and measured."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest
import soundfile as sf
import soxr

from app.audio import (
    FORMATS,
    EncoderClosed,
    UnsupportedFormat,
    UnsupportedSampleRate,
    encoded_rate_hz,
    open_encoder,
)
from app.encoding_config import EncodingConfig

INPUT_RATE_HZ = 22050
OUTPUT_RATE_HZ = 24000
SIGNAL_S = 2.3
CHUNK_PATTERN = (2048, 512, 4096)  # uneven, like vocoder chunks
COMPRESSED = ("mp3", "opus", "aac", "flac")
DEMUXER = {"mp3": "mp3", "opus": "ogg", "aac": "aac", "flac": "flac", "wav": "wav"}
# Decoded minus input duration, seconds. mp3/aac: the decoder sees the encoder's priming
# samples and last-frame padding (neither container can say to trim them); opus trims both
# through pre-skip and the final granule; flac, wav and pcm are sample-exact. aac also has
# up to one frame (43 ms at 24 kHz) of silence before the first audio (align_first_write).
EXTRA_S_RANGE = {
    "mp3": (0.0, 0.060),
    "aac": (0.0, 0.100),
    "opus": (-0.001, 0.001),
    "flac": (-0.001, 0.001),
    "wav": (-0.001, 0.001),
    "pcm": (-0.001, 0.001),
    "ulaw": (-0.001, 0.001),
    "alaw": (-0.001, 0.001),
}


def _tones(duration_s: float, rate_hz: int, freqs_hz: tuple[float, ...]) -> np.ndarray:
    t = np.arange(round(duration_s * rate_hz)) / rate_hz
    mix = sum(np.sin(2 * np.pi * f * t) for f in freqs_hz) / len(freqs_hz)
    return (0.5 * mix).astype(np.float32)


def _chunks(pcm: np.ndarray):
    start, i = 0, 0
    while start < pcm.size:
        size = CHUNK_PATTERN[i % len(CHUNK_PATTERN)]
        yield pcm[start : start + size]
        start, i = start + size, i + 1


def _encode(fmt: str, pcm: np.ndarray, in_hz: int, out_hz: int) -> tuple[list[bytes], bytes]:
    """(bytes from each encode() call, bytes from finish())."""
    encoder = open_encoder(fmt, in_hz, out_hz)
    try:
        parts = [encoder.encode(chunk) for chunk in _chunks(pcm)]
        return parts, encoder.finish()
    finally:
        encoder.close()


def _decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """Decode a whole stream with libavformat/libavcodec; (float mono samples, rate)."""
    with av.open(io.BytesIO(data), format=DEMUXER[fmt]) as container:
        stream = container.streams.audio[0]
        planes = [frame.to_ndarray().reshape(-1) for frame in container.decode(stream)]
        rate_hz = stream.rate
    samples = np.concatenate(planes)
    if samples.dtype == np.int16:
        samples = samples.astype(np.float32) / 32768.0
    return samples, rate_hz


def _decode_g711(data: bytes, rate_hz: int, law: str) -> np.ndarray:
    """Raw G.711 ("mulaw" or "alaw", ffmpeg's demuxer names) decoded by ffmpeg."""
    options = {"sample_rate": str(rate_hz), "ch_layout": "mono"}
    with av.open(io.BytesIO(data), format=law, options=options) as container:
        planes = [frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)]
    return np.concatenate(planes).astype(np.float32) / 32768.0


def _decodable_s(data: bytes, fmt: str) -> float:
    """Seconds of audio a decoder gets from a stream cut short (what a client has so far)."""
    try:
        samples, rate_hz = _decode(data, fmt)
    except (av.FFmpegError, ValueError):  # too little to probe, or no frames yet
        return 0.0
    return samples.size / rate_hz


def _opus_head_rate_hz(data: bytes) -> int:
    at = data.index(b"OpusHead")
    return struct.unpack_from("<I", data, at + 12)[0]


def _dominant_hz(samples: np.ndarray, rate_hz: int) -> float:
    windowed = samples * np.hanning(samples.size)
    n_fft = 8 * samples.size  # zero padding: ~0.1 Hz bins
    spectrum = np.abs(np.fft.rfft(windowed, n_fft))
    return float(np.argmax(spectrum) * rate_hz / n_fft)


def test_formats_map_to_the_api_content_types():
    assert dict(FORMATS) == {
        "mp3": "audio/mpeg",
        "opus": "audio/ogg",
        "aac": "audio/aac",
        "flac": "audio/flac",
        "wav": "audio/wav",
        "pcm": "audio/pcm",
        "ulaw": "audio/basic",
        "alaw": "audio/PCMA",
    }
    for fmt, content_type in FORMATS.items():
        encoder = open_encoder(fmt, INPUT_RATE_HZ, OUTPUT_RATE_HZ)
        assert encoder.content_type == content_type
        encoder.close()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_stream_decodes_whole_with_the_input_duration(fmt):
    pcm = _tones(SIGNAL_S, INPUT_RATE_HZ, (220.0, 440.0, 1000.0))
    parts, tail = _encode(fmt, pcm, INPUT_RATE_HZ, OUTPUT_RATE_HZ)
    data = b"".join(parts) + tail
    if fmt == "pcm":
        decoded, rate_hz = np.frombuffer(data, "<i2") / 32768.0, OUTPUT_RATE_HZ
    elif fmt in ("ulaw", "alaw"):
        law = "mulaw" if fmt == "ulaw" else "alaw"
        decoded, rate_hz = _decode_g711(data, OUTPUT_RATE_HZ, law), OUTPUT_RATE_HZ
    else:
        decoded, rate_hz = _decode(data, fmt)
    if fmt == "opus":
        # Encoded at 24 kHz (OpusHead says so); Ogg Opus decoders always output 48 kHz.
        assert _opus_head_rate_hz(data) == OUTPUT_RATE_HZ
        assert rate_hz == 48000
    else:
        assert rate_hz == OUTPUT_RATE_HZ
    extra_s = decoded.size / rate_hz - pcm.size / INPUT_RATE_HZ
    low_s, high_s = EXTRA_S_RANGE[fmt]
    assert low_s <= extra_s <= high_s
    rms_ratio = np.sqrt(np.mean(decoded**2) / np.mean(pcm**2))
    assert 0.85 < rms_ratio < 1.1  # the signal came through, at its level


def test_wav_streaming_header_and_soundfile_reads_it_whole():
    pcm = _tones(SIGNAL_S, INPUT_RATE_HZ, (440.0,))
    data = b"".join(_encode("wav", pcm, INPUT_RATE_HZ, OUTPUT_RATE_HZ)[0])
    assert (data[:4], data[8:12], data[36:40]) == (b"RIFF", b"WAVE", b"data")
    assert struct.unpack_from("<I", data, 4) == struct.unpack_from("<I", data, 40) == (2**32 - 1,)
    samples, rate_hz = sf.read(io.BytesIO(data), dtype="int16")
    pcm_bytes = b"".join(_encode("pcm", pcm, INPUT_RATE_HZ, OUTPUT_RATE_HZ)[0])
    assert rate_hz == OUTPUT_RATE_HZ
    # wav's payload read by libsndfile is the pcm stream, minus the resampler tail
    # (finish() was not included on either side).
    assert samples.tobytes() == pcm_bytes


@pytest.mark.parametrize("fmt", ["flac", "wav"])
def test_lossless_formats_carry_exactly_the_pcm_samples(fmt):
    pcm = _tones(SIGNAL_S, INPUT_RATE_HZ, (220.0, 440.0, 1000.0))
    parts, tail = _encode(fmt, pcm, INPUT_RATE_HZ, OUTPUT_RATE_HZ)
    decoded, _ = _decode(b"".join(parts) + tail, fmt)
    pcm_parts, pcm_tail = _encode("pcm", pcm, INPUT_RATE_HZ, OUTPUT_RATE_HZ)
    reference = np.frombuffer(b"".join(pcm_parts) + pcm_tail, "<i2")
    np.testing.assert_array_equal(np.rint(decoded * 32768.0).astype(np.int16), reference)


@pytest.mark.parametrize("fmt", COMPRESSED)
def test_compressed_formats_stream_before_finish(fmt):
    """Audio leaves chunk by chunk: what encode() returned so far decodes to nearly all
    of what was fed, both early in the stream and after 4 s."""
    pcm = _tones(4.0, INPUT_RATE_HZ, (440.0,))
    encoder = open_encoder(fmt, INPUT_RATE_HZ, OUTPUT_RATE_HZ)
    try:
        sent, fed = bytearray(), 0
        early_checked = False
        for chunk in _chunks(pcm):
            sent += encoder.encode(chunk)
            fed += chunk.size
            if not early_checked and fed >= 0.5 * INPUT_RATE_HZ:
                early_checked = True
                assert _decodable_s(bytes(sent), fmt) >= fed / INPUT_RATE_HZ - 0.2
        assert _decodable_s(bytes(sent), fmt) >= fed / INPUT_RATE_HZ - 0.2
        assert encoder.finish()  # the rest, trailer included
    finally:
        encoder.close()


def test_pcm_chunk_joins_equal_one_shot_resampling():
    pcm = _tones(SIGNAL_S, INPUT_RATE_HZ, (220.0, 440.0, 1000.0))
    parts, tail = _encode("pcm", pcm, INPUT_RATE_HZ, OUTPUT_RATE_HZ)
    streamed = np.frombuffer(b"".join(parts) + tail, "<i2").astype(np.int32)
    one_shot = soxr.resample(pcm, INPUT_RATE_HZ, OUTPUT_RATE_HZ, quality="HQ")
    expected_samples = pcm.size * OUTPUT_RATE_HZ / INPUT_RATE_HZ
    assert abs(streamed.size - expected_samples) <= 2
    n = min(streamed.size, one_shot.size)
    reference = np.rint(np.clip(one_shot[:n], -1, 1) * 32767).astype(np.int32)
    assert np.max(np.abs(streamed[:n] - reference)) <= 1  # 1 LSB: no clicks at joins


def test_matching_rates_skip_resampling():
    pcm = _tones(1.0, OUTPUT_RATE_HZ, (440.0,))
    parts, tail = _encode("pcm", pcm, OUTPUT_RATE_HZ, OUTPUT_RATE_HZ)
    assert tail == b""  # no resampler tail to flush
    streamed = np.frombuffer(b"".join(parts), "<i2")
    np.testing.assert_array_equal(streamed, np.rint(pcm * 32767).astype(np.int16))


@pytest.mark.parametrize("rate_hz", [16000, 48000])
def test_pcm_sample_rate_extra(rate_hz):
    pcm = _tones(SIGNAL_S, INPUT_RATE_HZ, (440.0,))
    parts, tail = _encode("pcm", pcm, INPUT_RATE_HZ, rate_hz)
    streamed = np.frombuffer(b"".join(parts) + tail, "<i2") / 32768.0
    assert abs(streamed.size - pcm.size * rate_hz / INPUT_RATE_HZ) <= 2
    assert abs(_dominant_hz(streamed, rate_hz) - 440.0) < 1.0


def test_opus_at_44100_is_encoded_at_48000():
    encoder = open_encoder("opus", INPUT_RATE_HZ, 44100)
    assert encoder.output_rate_hz == 48000
    pcm = _tones(1.0, INPUT_RATE_HZ, (440.0,))
    data = encoder.encode(pcm) + encoder.finish()
    decoded, rate_hz = _decode(data, "opus")
    assert _opus_head_rate_hz(data) == 48000 and rate_hz == 48000
    assert abs(decoded.size / rate_hz - 1.0) <= 0.001


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac"])
def test_a_440_hz_sine_survives_lossy_codecs(fmt):
    pcm = _tones(SIGNAL_S, INPUT_RATE_HZ, (440.0,))
    parts, tail = _encode(fmt, pcm, INPUT_RATE_HZ, OUTPUT_RATE_HZ)
    decoded, rate_hz = _decode(b"".join(parts) + tail, fmt)
    assert abs(_dominant_hz(decoded, rate_hz) - 440.0) < 2.0


@pytest.mark.parametrize(
    ("fmt", "requested_hz", "encoded_hz"),
    [
        ("pcm", 16000, 16000),
        ("wav", 44100, 44100),
        ("flac", 23000, 23000),
        ("opus", 24000, 24000),
        ("opus", 22050, 24000),  # the smallest libopus rate >= 22050
        ("opus", 44100, 48000),
        ("opus", 10000, 12000),
        ("opus", 96000, 48000),
        ("mp3", 24000, 24000),
        ("mp3", 23000, 22050),
        ("mp3", 96000, 48000),
        ("aac", 23000, 22050),
        ("aac", 96000, 96000),
    ],
)
def test_encoded_rate(fmt, requested_hz, encoded_hz):
    assert encoded_rate_hz(fmt, requested_hz) == encoded_hz
    encoder = open_encoder(fmt, INPUT_RATE_HZ, requested_hz)
    assert encoder.output_rate_hz == encoded_hz
    encoder.close()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_close_without_finish_releases_and_is_idempotent(fmt):
    encoder = open_encoder(fmt, INPUT_RATE_HZ, OUTPUT_RATE_HZ)
    encoder.encode(_tones(0.5, INPUT_RATE_HZ, (440.0,)))
    encoder.close()
    encoder.close()
    assert encoder.closed
    with pytest.raises(EncoderClosed):
        encoder.encode(np.zeros(100, dtype=np.float32))
    with pytest.raises(EncoderClosed):
        encoder.finish()


def test_close_before_any_audio_and_after_finish():
    with open_encoder("aac", INPUT_RATE_HZ, OUTPUT_RATE_HZ) as never_fed:
        pass
    assert never_fed.closed
    finished = open_encoder("mp3", INPUT_RATE_HZ, OUTPUT_RATE_HZ)
    finished.encode(_tones(0.2, INPUT_RATE_HZ, (440.0,)))
    finished.finish()
    assert finished.closed
    finished.close()


def test_unknown_format_and_bad_rates_raise():
    with pytest.raises(UnsupportedFormat, match="ogg"):
        open_encoder("ogg", INPUT_RATE_HZ, OUTPUT_RATE_HZ)
    with pytest.raises(ValueError):  # UnsupportedFormat is a ValueError
        encoded_rate_hz("wma", OUTPUT_RATE_HZ)
    with pytest.raises(UnsupportedSampleRate):
        open_encoder("pcm", INPUT_RATE_HZ, 4000)
    with pytest.raises(UnsupportedSampleRate):
        open_encoder("pcm", 0, OUTPUT_RATE_HZ)


def test_rejects_pcm_that_is_not_float_mono():
    with open_encoder("pcm", INPUT_RATE_HZ, OUTPUT_RATE_HZ) as encoder:
        with pytest.raises(ValueError):
            encoder.encode(np.zeros((100, 2), dtype=np.float32))
        with pytest.raises(ValueError):
            encoder.encode(np.zeros(100, dtype=np.int16))


def test_empty_chunks_are_fine_and_out_of_range_samples_clip():
    with open_encoder("pcm", OUTPUT_RATE_HZ, OUTPUT_RATE_HZ) as encoder:
        assert encoder.encode(np.zeros(0, dtype=np.float32)) == b""
        loud = encoder.encode(np.array([2.0, -2.0, 0.5], dtype=np.float32))
        assert np.frombuffer(loud, "<i2").tolist() == [32767, -32767, 16384]


@pytest.mark.parametrize("fmt", ["pcm", "flac", "mp3"])
def test_output_samples_counts_the_audio_at_the_encoded_rate(fmt):
    pcm = _tones(SIGNAL_S, INPUT_RATE_HZ, (440.0,))
    encoder = open_encoder(fmt, INPUT_RATE_HZ, OUTPUT_RATE_HZ)
    data = b"".join(encoder.encode(chunk) for chunk in _chunks(pcm)) + encoder.finish()
    if fmt == "pcm":
        assert encoder.output_samples == len(data) // 2
    elif fmt == "flac":
        assert encoder.output_samples == _decode(data, fmt)[0].size
    # mp3 too: the input's length at the encoded rate, priming and padding not counted.
    assert abs(encoder.output_samples - pcm.size * OUTPUT_RATE_HZ / INPUT_RATE_HZ) <= 2


# --- the `encoding` settings reach the codecs ---------------------------------------------


def _noisy_speechlike(duration_s: float, rate_hz: int) -> np.ndarray:
    """A modulated tone plus noise: enough detail that a codec uses the bits it is given."""
    t = np.arange(round(duration_s * rate_hz)) / rate_hz
    noise = np.random.default_rng(0).normal(0.0, 0.05, t.size)
    return (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t) + noise).astype(
        np.float32
    )


def _encode_whole(fmt: str, pcm: np.ndarray, encoding: EncodingConfig) -> bytes:
    with open_encoder(fmt, INPUT_RATE_HZ, OUTPUT_RATE_HZ, encoding=encoding) as encoder:
        return b"".join(encoder.encode(chunk) for chunk in _chunks(pcm)) + encoder.finish()


@pytest.mark.parametrize(
    ("fmt", "field"),
    [("mp3", "mp3_bitrate_bps"), ("aac", "aac_bitrate_bps"), ("opus", "opus_bitrate_bps")],
)
def test_the_configured_bitrate_sets_the_stream_size(fmt, field):
    duration_s = SIGNAL_S
    pcm = _noisy_speechlike(duration_s, INPUT_RATE_HZ)
    sizes = {}
    for bitrate_bps in (24_000, 96_000):
        encoding = EncodingConfig(**{field: bitrate_bps, "ogg_page_ms": 1000})
        data = _encode_whole(fmt, pcm, encoding)
        sizes[bitrate_bps] = len(data)
        assert 0.8 < len(data) * 8 / duration_s / bitrate_bps < 1.25, (bitrate_bps, len(data))
        decoded, rate_hz = _decode(data, fmt)
        low, high = EXTRA_S_RANGE[fmt]
        assert low <= decoded.size / rate_hz - duration_s <= high
    assert sizes[96_000] > 3 * sizes[24_000]


def test_mp3_bitrate_is_constant():
    pcm = _noisy_speechlike(3.0, INPUT_RATE_HZ)
    small = _encode_whole("mp3", pcm, EncodingConfig(mp3_bitrate_bps=32_000))
    large = _encode_whole("mp3", pcm, EncodingConfig(mp3_bitrate_bps=128_000))
    assert len(large) == 4 * len(small)  # CBR: the same frames, four times the bytes each


def _ogg_pages(data: bytes) -> int:
    return data.count(b"OggS")


@pytest.mark.parametrize("page_ms", [20, 100, 1000])
def test_ogg_page_ms_sets_the_number_of_pages(page_ms):
    duration_s = 3.0
    data = _encode_whole(
        "opus", _tones(duration_s, INPUT_RATE_HZ, (440.0,)), EncodingConfig(ogg_page_ms=page_ms)
    )
    # OpusHead and OpusTags pages, then one audio page per page_ms (the last one partial)
    expected = 2 + duration_s * 1000 / page_ms
    assert abs(_ogg_pages(data) - expected) <= 2, (_ogg_pages(data), expected)
    decoded, rate_hz = _decode(data, "opus")
    assert decoded.size / rate_hz == pytest.approx(duration_s, abs=0.001)


def test_pages_shorter_than_an_opus_packet_change_nothing():
    pcm = _tones(1.0, INPUT_RATE_HZ, (440.0,))
    at_5_ms = _encode_whole("opus", pcm, EncodingConfig(ogg_page_ms=5))
    at_20_ms = _encode_whole("opus", pcm, EncodingConfig(ogg_page_ms=20))
    assert _ogg_pages(at_5_ms) == _ogg_pages(at_20_ms)


@pytest.mark.parametrize("quality", ["QQ", "VHQ"])
def test_resample_quality_is_the_configured_soxr_recipe(quality):
    pcm = _tones(SIGNAL_S, INPUT_RATE_HZ, (220.0, 440.0, 5000.0))
    streamed = np.frombuffer(
        _encode_whole("pcm", pcm, EncodingConfig(resample_quality=quality)), "<i2"
    ).astype(np.int32)
    references = {
        q: np.rint(np.clip(soxr.resample(pcm, INPUT_RATE_HZ, OUTPUT_RATE_HZ, quality=q), -1, 1)
                   * 32767).astype(np.int32)
        for q in ("QQ", "VHQ")
    }  # fmt: skip
    n = min(streamed.size, *(r.size for r in references.values()))
    other = "VHQ" if quality == "QQ" else "QQ"
    assert np.max(np.abs(streamed[:n] - references[quality][:n])) <= 1
    assert np.max(np.abs(streamed[:n] - references[other][:n])) > 100

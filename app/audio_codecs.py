"""The codec layer under app/audio.py: s16le (pcm, wav), G.711 u-law (ulaw) and A-law
(alaw), and PyAV muxer + encoder pairs.

A codec takes float32 mono PCM in [-1, 1] already at its own rate and returns the bytes
that are ready: `write(pcm) -> bytes`, `flush() -> bytes` (the rest plus the container's
trailer), `close()` (idempotent, discards anything pending).

PyAV writes into `_ByteSink`, a file object with `write` only: libavformat then treats the
output as non-seekable and never goes back to patch a header (FLAC STREAMINFO keeps
"total samples unknown", mp3 gets no Xing frame), and `flush_packets` makes every muxed
packet reach the sink at once instead of waiting in the 4 KiB AVIO buffer.
"""

from __future__ import annotations

import enum
import logging
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import av
import numpy as np

from app.encoding_config import EncodingConfig

log = logging.getLogger(__name__)

MP3_RATES_HZ = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
OPUS_RATES_HZ = (8000, 12000, 16000, 24000, 48000)
AAC_RATES_HZ = (
    7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000
)  # fmt: skip

_CAP_SMALL_LAST_FRAME = 1 << 6  # AV_CODEC_CAP_SMALL_LAST_FRAME
_CAP_VARIABLE_FRAME_SIZE = 1 << 16  # AV_CODEC_CAP_VARIABLE_FRAME_SIZE
_FALLBACK_FRAME_SAMPLES = 1024  # for codecs that take any frame size
_AVIO_BUFFER_BYTES = 4096
_S16_SCALE = 32767.0


class RateRule(enum.Enum):
    EXACT = "exact"  # any rate in range
    NEAREST = "nearest"  # the nearest supported rate, ties go up
    AT_LEAST = "at_least"  # the smallest supported rate >= requested, else the highest


@dataclass(frozen=True)
class CodecSpec:
    container: str  # libavformat muxer name
    codec: str  # libavcodec encoder name
    sample_format: str  # PyAV sample format the encoder is fed
    bit_rate_bps: int | None  # None: the codec's own (flac; lossy ones: codec_spec)
    rates_hz: tuple[int, ...] = ()
    rate_rule: RateRule = RateRule.EXACT
    container_options: Mapping[str, str] = field(default_factory=dict)
    codec_options: Mapping[str, str] = field(default_factory=dict)
    # Leading silence completes the first write's last codec frame (AvCodec.write): for a
    # codec that emits nothing until it has a frame of look-ahead (aac)
    align_first_write: bool = False
    frame_ms: int | None = None  # the codec's frame (block) duration; None: its own


AV_SPECS: Mapping[str, CodecSpec] = MappingProxyType(
    {
        # The lossy bit rates and the Ogg page duration come from EncodingConfig (codec_spec).
        "mp3": CodecSpec(
            "mp3", "libmp3lame", "fltp", None, MP3_RATES_HZ, RateRule.NEAREST,
            # Bare MPEG frames: no ID3v2 tag (the Xing frame needs a seekable sink anyway).
            container_options={"id3v2_version": "0", "write_xing": "0"},
            # No bit reservoir: LAME then emits each frame one frame sooner (the first
            # after 1152 samples instead of 1728); speech at 64 kb/s loses 0.3 dB of SNR.
            codec_options={"reservoir": "0"},
        ),
        "opus": CodecSpec("ogg", "libopus", "flt", None, OPUS_RATES_HZ, RateRule.AT_LEAST),
        "aac": CodecSpec(
            "adts", "aac", "fltp", None, AAC_RATES_HZ, RateRule.NEAREST, align_first_write=True
        ),
        "flac": CodecSpec(
            "flac", "flac", "s16", None,
            # No 8 KiB PADDING block: the header is never rewritten on a non-seekable sink.
            container_options={"metadata_header_padding": "0"},
            # 24 ms blocks, not ffmpeg's 2304 samples (96 ms at 24 kHz): libavcodec's FLAC
            # parser (ffmpeg, PyAV, LiveKit's decoder) hands a frame on only once it has seen
            # ~10 more frame headers, so a player's first sample needed 1056 ms of audio;
            # now 264 ms, for 4% more bytes (measured on speech-like audio)
            frame_ms=24,
        ),
    }
)  # fmt: skip


def codec_spec(response_format: str, encoding: EncodingConfig) -> CodecSpec | None:
    """The PyAV spec of `response_format` as configured (None: pcm and wav need no PyAV)."""
    if response_format not in AV_SPECS:
        return None
    spec = AV_SPECS[response_format]
    if response_format == "mp3":
        return replace(spec, bit_rate_bps=encoding.mp3_bitrate_bps)
    if response_format == "aac":
        return replace(spec, bit_rate_bps=encoding.aac_bitrate_bps)
    if response_format == "opus":
        # Ogg pages of ogg_page_ms instead of libavformat's 1 s: a page leaves the muxer as
        # soon as the next one starts, so the page duration is the container's added lag.
        page_us = str(encoding.ogg_page_ms * 1000)
        return replace(
            spec,
            bit_rate_bps=encoding.opus_bitrate_bps,
            container_options={**spec.container_options, "page_duration": page_us},
        )
    return spec


def wav_stream_header(rate_hz: int) -> bytes:
    """RIFF/WAVE header for s16le mono of unknown length: RIFF and data sizes 0xFFFFFFFF."""
    block_align = 2
    return b"".join(
        (
            b"RIFF", struct.pack("<I", 0xFFFFFFFF), b"WAVE",
            b"fmt ", struct.pack("<IHHIIHH", 16, 1, 1, rate_hz, rate_hz * block_align,
                                 block_align, 16),
            b"data", struct.pack("<I", 0xFFFFFFFF),
        )
    )  # fmt: skip


def _to_s16(pcm: np.ndarray) -> np.ndarray:
    return np.rint(pcm * _S16_SCALE).astype("<i2")


class RawCodec:
    """pcm and wav: s16le samples; wav's streaming header goes before the first sample."""

    def __init__(self, header: bytes) -> None:
        self._header = header

    def _take_header(self) -> bytes:
        header, self._header = self._header, b""
        return header

    def write(self, pcm: np.ndarray) -> bytes:
        if pcm.size == 0:
            return b""
        return self._take_header() + _to_s16(pcm).tobytes()

    def flush(self) -> bytes:
        return self._take_header()  # an empty wav is still a wav

    def close(self) -> None:
        pass


# G.711 u-law segment ends, on the 14-bit magnitude plus bias (ITU-T G.711, Sun's g711.c)
_ULAW_SEG_ENDS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)
_ULAW_CLIP = 8159
_ULAW_BIAS = 0x84 >> 2


def ulaw_encode(s16: np.ndarray) -> bytes:
    """16-bit linear samples -> G.711 u-law bytes (g711.c's truncating quantiser; ffmpeg's
    pcm_mulaw rounds to the nearest level instead, one level apart at 1 % of the values)."""
    value = s16.astype(np.int32) >> 2  # 14 bits, rounding toward -inf as in g711.c
    mask = np.where(value < 0, 0x7F, 0xFF)
    value = np.minimum(np.abs(value), _ULAW_CLIP) + _ULAW_BIAS
    segment = np.searchsorted(_ULAW_SEG_ENDS, value)
    ulaw = (segment << 4) | ((value >> (segment + 1)) & 0x0F)
    ulaw = np.where(segment >= _ULAW_SEG_ENDS.size, 0x7F, ulaw)  # beyond the last: the top
    return (ulaw ^ mask).astype(np.uint8).tobytes()


# G.711 A-law segment ends, on the 11-bit magnitude (ITU-T G.191's alaw_compress)
_ALAW_SEG_ENDS = np.array([0x0F, 0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF], dtype=np.int32)


def alaw_encode(s16: np.ndarray) -> bytes:
    """16-bit linear samples -> G.711 A-law bytes, as ITU-T G.191's reference encoder
    (alaw_compress): the sample's top 12 bits, a sign and an 11-bit magnitude (a negative
    sample's one's complement: -1 has the magnitude of 0); segments 0 and 1 take the
    magnitude's 4 low bits as mantissa, segment s > 1 the 4 bits after its leading one; the
    sign bit is set for a sample >= 0, then the even bits are inverted (XOR 0x55).
    ffmpeg's pcm_alaw picks the nearest level of x >> 2 instead: one level apart on 1.5 %
    of the values, just above a segment edge where the step doubles and next to a
    decision level for negative ones (tests/test_audio_alaw.py)."""
    value = s16.astype(np.int32)
    negative = value < 0
    magnitude = np.where(negative, ~value, value) >> 4  # 0 ... 2047
    segment = np.searchsorted(_ALAW_SEG_ENDS, magnitude)
    mantissa = (magnitude >> np.maximum(segment - 1, 0)) & 0x0F
    alaw = (segment << 4) | mantissa | np.where(negative, 0x00, 0x80)
    return (alaw ^ 0x55).astype(np.uint8).tobytes()


_G711_ENCODERS = {"ulaw": ulaw_encode, "alaw": alaw_encode}


class G711Codec:
    """Raw G.711 (u-law or A-law), one byte a sample, no header (telephony: Twilio's media
    streams, European trunks); nothing is held back, so every sample leaves with the chunk
    that brought it."""

    def __init__(self, law: str) -> None:
        self._encode = _G711_ENCODERS[law]

    def write(self, pcm: np.ndarray) -> bytes:
        return self._encode(_to_s16(pcm)) if pcm.size else b""

    def flush(self) -> bytes:
        return b""

    def close(self) -> None:
        pass


def raw_codec(response_format: str, rate_hz: int) -> RawCodec | G711Codec:
    """The codec of a format that needs no PyAV: pcm, wav (with its header), ulaw or alaw."""
    if response_format in _G711_ENCODERS:
        return G711Codec(response_format)
    return RawCodec(wav_stream_header(rate_hz) if response_format == "wav" else b"")


class _ByteSink:
    """A write-only, non-seekable file for PyAV: collects bytes until drained."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def write(self, data: bytes) -> int:
        self._buffer += data
        return len(data)

    def drain(self) -> bytes:
        data = bytes(self._buffer)
        self._buffer.clear()
        return data


class AvCodec:
    """A PyAV muxer + encoder fed whole codec frames; returns the muxed bytes per call."""

    def __init__(self, spec: CodecSpec, rate_hz: int) -> None:
        self._spec = spec
        self._rate_hz = rate_hz
        self._sink = _ByteSink()
        self._container = av.open(
            self._sink,
            "w",
            format=spec.container,
            container_options={"flush_packets": "1", **spec.container_options},
            buffer_size=_AVIO_BUFFER_BYTES,
        )
        try:
            self._stream = self._container.add_stream(spec.codec, rate=rate_hz, layout="mono")
            ctx = self._stream.codec_context
            ctx.format = spec.sample_format
            if spec.bit_rate_bps is not None:
                ctx.bit_rate = spec.bit_rate_bps
            options = dict(spec.codec_options)
            if spec.frame_ms is not None:
                options["frame_size"] = str(max(16, rate_hz * spec.frame_ms // 1000))
            ctx.options = options
            ctx.open()
            # The container's header now, not with the first packet: it leaves with the
            # first write even when the codec has no packet yet (FLAC's STREAMINFO, Ogg's
            # OpusHead and OpusTags pages)
            self._container.start_encoding()
        except BaseException:
            self._container.close()
            raise
        capabilities = ctx.codec.capabilities
        self._frame_samples = (
            _FALLBACK_FRAME_SAMPLES
            if ctx.frame_size == 0 or capabilities & _CAP_VARIABLE_FRAME_SIZE
            else ctx.frame_size
        )
        self._pad_last_frame = not capabilities & _CAP_SMALL_LAST_FRAME
        self._pending = np.zeros(0, dtype=np.float32)  # always < one codec frame
        self._pts = 0
        self._align_next_write = spec.align_first_write

    def _encode_frame(self, samples: np.ndarray) -> None:
        if self._spec.sample_format == "s16":
            array = _to_s16(samples)
        else:
            array = np.ascontiguousarray(samples, dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(
            array.reshape(1, -1), format=self._spec.sample_format, layout="mono"
        )
        frame.sample_rate = self._rate_hz
        frame.pts = self._pts
        self._pts += samples.size
        self._container.mux(self._stream.encode(frame))

    def write(self, pcm: np.ndarray) -> bytes:
        if self._align_next_write and pcm.size:
            # The stream's first audio: silence before it, so that it ends on a frame
            # boundary and none of it waits for the next write (aac emits a packet once it
            # has the next frame: 1781 samples, a 93 ms first chunk at 24 kHz, gave no
            # bytes; 267 samples of silence ahead of them give the first packet). At most
            # one frame, once, at the start: the decoder already sees 1024 priming samples.
            self._align_next_write = False
            pcm = np.concatenate((np.zeros(-pcm.size % self._frame_samples, np.float32), pcm))
        if self._pending.size:
            pcm = np.concatenate((self._pending, pcm))
        n = self._frame_samples
        whole = pcm.size - pcm.size % n
        for start in range(0, whole, n):
            self._encode_frame(pcm[start : start + n])
        self._pending = pcm[whole:].copy()
        return self._sink.drain()

    def flush(self) -> bytes:
        if self._pending.size:
            last = self._pending
            if self._pad_last_frame:
                last = np.pad(last, (0, self._frame_samples - last.size))
            self._pending = np.zeros(0, dtype=np.float32)
            self._encode_frame(last)
        self._container.mux(self._stream.encode(None))
        self._container.close()  # writes the trailer (Ogg: the last page, with EOS)
        return self._sink.drain()

    def close(self) -> None:
        try:
            # Frees the muxer (the codec context goes with the last reference to this
            # object). After an abort the trailer it writes is simply dropped.
            self._container.close()
        except av.FFmpegError as exc:
            log.debug("closing an aborted %s encoder: %s", self._spec.codec, exc)
        self._sink.drain()

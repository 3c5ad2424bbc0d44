"""Cartesia's output formats: raw or wav pcm_s16le / pcm_f32le / pcm_mulaw / pcm_alaw, and
mp3.

`open_output(fmt, input_rate_hz, encoding)` returns an encoder with the interface of
app/audio.py's StreamEncoder (`encode`, `finish`, `close`, `raw`, `output_rate_hz`,
`output_samples`, `content_type`), so app/streaming.py's bodies take it as they are.

- raw: the samples and nothing else, at exactly the asked rate (soxr resamples the
  voice's rate, one streaming resampler per stream: chunk joins do not click);
- wav: the same samples after a RIFF header whose sizes are 0xFFFFFFFF (the streaming
  convention: the length is not known when the header leaves), format 1 (s16), 3 (IEEE
  float), 7 (u-law) or 6 (A-law);
- mp3: app/audio.py's encoder at the asked bit rate, at the nearest MPEG rate (every rate
  Cartesia lists is one).

u-law and A-law are G.711 (app/audio_codecs.py's `ulaw_encode` and `alaw_encode`, ITU-T's
reference quantisers; their docstrings say where ffmpeg's rounding differs).
"""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import soxr

from app.audio import EncoderClosed, StreamEncoder, open_encoder
from app.audio_codecs import alaw_encode, ulaw_encode
from app.cartesia.schema import OutputFormat
from app.encoding_config import EncodingConfig

_S16_SCALE = 32767.0
# encoding -> (WAVE format tag, bits per sample, content type of the raw stream)
_SAMPLE_FORMATS = {
    "pcm_s16le": (1, 16, "audio/pcm"),
    "pcm_f32le": (3, 32, "audio/pcm"),
    "pcm_mulaw": (7, 8, "audio/basic"),
    "pcm_alaw": (6, 8, "audio/PCMA"),
}


def wav_header(format_tag: int, bits: int, rate_hz: int) -> bytes:
    """RIFF/WAVE header for mono audio of unknown length (sizes 0xFFFFFFFF)."""
    block_align = bits // 8
    return b"".join(
        (
            b"RIFF",
            struct.pack("<I", 0xFFFFFFFF),
            b"WAVE",
            b"fmt ",
            struct.pack("<IHHIIHH", 16, format_tag, 1, rate_hz, rate_hz * block_align,
                        block_align, bits),
            b"data",
            struct.pack("<I", 0xFFFFFFFF),
        )
    )  # fmt: skip


class PcmEncoder:
    """raw or wav samples of one stream (see the module doc)."""

    raw = True

    def __init__(
        self, fmt: OutputFormat, input_rate_hz: int, *, resample_quality: str = "HQ"
    ) -> None:
        assert fmt.encoding is not None
        format_tag, bits, content_type = _SAMPLE_FORMATS[fmt.encoding]
        self.response_format = f"{fmt.container}/{fmt.encoding}"
        self.encoding = fmt.encoding
        self.content_type = "audio/wav" if fmt.container == "wav" else content_type
        self.input_rate_hz = input_rate_hz
        self.output_rate_hz = fmt.sample_rate_hz
        self.output_samples = 0
        self._header = (
            wav_header(format_tag, bits, fmt.sample_rate_hz) if fmt.container == "wav" else b""
        )
        self._resampler: soxr.ResampleStream | None = (
            None
            if input_rate_hz == fmt.sample_rate_hz
            else soxr.ResampleStream(
                input_rate_hz, fmt.sample_rate_hz, 1, dtype="float32", quality=resample_quality
            )
        )
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _samples(self, pcm: np.ndarray) -> bytes:
        pcm = np.clip(pcm, -1.0, 1.0)
        self.output_samples += pcm.size
        header, self._header = self._header, b""
        if self.encoding == "pcm_f32le":
            return header + pcm.astype("<f4").tobytes()
        s16 = np.rint(pcm * _S16_SCALE).astype("<i2")
        if self.encoding == "pcm_mulaw":
            return header + ulaw_encode(s16)
        if self.encoding == "pcm_alaw":
            return header + alaw_encode(s16)
        return header + s16.tobytes()

    def encode(self, pcm: np.ndarray) -> bytes:
        if self._closed:
            raise EncoderClosed(f"{self.response_format} encoder is finished or closed")
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if self._resampler is not None and pcm.size:
            pcm = self._resampler.resample_chunk(pcm)
        return self._samples(pcm) if pcm.size else b""

    def finish(self) -> bytes:
        if self._closed:
            raise EncoderClosed(f"{self.response_format} encoder is finished or closed")
        out = b""
        if self._resampler is not None:
            tail = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
            if tail.size:
                out = self._samples(tail)
        out = self._header + out  # an empty wav is still a wav
        self._header = b""
        self.close()
        return out

    def close(self) -> None:
        self._closed = True
        self._resampler = None


def open_output(
    fmt: OutputFormat, input_rate_hz: int, encoding: EncodingConfig
) -> PcmEncoder | StreamEncoder:
    """The encoder of one stream; the format was validated (app/cartesia/schema.py)."""
    if fmt.container == "mp3":
        assert fmt.bit_rate_bps is not None
        config = replace(encoding, mp3_bitrate_bps=fmt.bit_rate_bps)
        return open_encoder("mp3", input_rate_hz, fmt.sample_rate_hz, encoding=config)
    return PcmEncoder(fmt, input_rate_hz, resample_quality=encoding.resample_quality)

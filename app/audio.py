"""Streaming audio encoders for every response format, in-process (PyAV, soxr).

One `StreamEncoder` per response stream, built by `open_encoder`. It takes float32 mono PCM
in [-1, 1] at the voice's rate, resamples it with a per-stream soxr streaming resampler (so
chunk joins do not click), and returns the encoded bytes that are ready now. Nothing is
buffered beyond one codec frame, the resampler's filter delay and the container's current
page, so memory per stream is bounded and the first bytes leave with the first codec frame.
The container's header is written when the encoder opens (it leaves with the first write);
LAME runs without its bit reservoir (each frame out one frame sooner); aac, which emits a
packet only once it has the next frame, gets silence ahead of the stream's first write, up
to a whole frame, so that a first chunk of more than one frame gives a decodable packet at
once (tests/test_first_audio_formats.py; the silence adds to the 1024 priming samples).

Encoded sample rate (`encoded_rate_hz`) for a requested output rate:
- pcm, wav, flac: exactly the requested rate.
- opus: libopus runs at 8/12/16/24/48 kHz only; the smallest of those >= the requested rate
  (22050 -> 24000, 44100 -> 48000), 48000 above that. Whatever the encoded rate, Ogg Opus
  decoders (ffmpeg, browsers) play at 48 kHz; the encoded rate is in OpusHead.
- mp3: the nearest MPEG audio rate (8000 ... 48000; ties go up).
- aac: the nearest ADTS sampling-frequency-index rate (7350 ... 96000; ties go up).

Bit rates (mp3, opus, aac), the Ogg page duration and soxr's quality are the settings'
`encoding` section, an `EncodingConfig` (app/encoding_config.py) passed to `open_encoder`.

Containers: mp3 is bare MPEG frames (no ID3, no Xing header); opus is Ogg Opus; aac is
ADTS; flac is native FLAC whose STREAMINFO says "total samples unknown" (the stream is not
seekable, so the header is never rewritten); wav is a RIFF header with 0xFFFFFFFF sizes (the
streaming convention) then s16le; pcm is raw s16le; ulaw and alaw are raw G.711 u-law and
A-law, a byte a sample (ITU-T G.711, no header). mp3 and aac decoders see the encoder's
priming samples (about 529 / 1024 samples at the encoded rate) and the padding of the last
frame, because neither container can signal them (+52 / +47 ms for 2.3 s at 24 kHz); opus,
flac, wav, pcm, ulaw and alaw decode to the exact length.

Errors: UnsupportedFormat, UnsupportedSampleRate (ValueError: before the first byte, a 400);
EncoderError (a codec failure mid-stream); EncoderClosed (use after finish/close: a bug).

An encoder is not thread-safe: one stream, one thread at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import av
import numpy as np
import soxr

from app.audio_codecs import AV_SPECS, AvCodec, G711Codec, RateRule, RawCodec, codec_spec, raw_codec
from app.encoding_config import DEFAULT_ENCODING, EncodingConfig

FORMATS: Mapping[str, str] = MappingProxyType(
    {
        "mp3": "audio/mpeg",
        "opus": "audio/ogg",
        "aac": "audio/aac",
        "flac": "audio/flac",
        "wav": "audio/wav",
        "pcm": "audio/pcm",
        "ulaw": "audio/basic",  # raw G.711 u-law, any rate (telephony: 8000)
        "alaw": "audio/PCMA",  # raw G.711 A-law, any rate (RFC 4856's name; telephony: 8000)
    }
)

MIN_RATE_HZ = 8000
MAX_RATE_HZ = 192000


class UnsupportedFormat(ValueError):
    """The response_format is not one of FORMATS."""


class UnsupportedSampleRate(ValueError):
    """A sample rate outside [MIN_RATE_HZ, MAX_RATE_HZ] (output) or not positive (input)."""


class EncoderError(RuntimeError):
    """The codec or muxer failed mid-stream (PyAV's error, translated)."""


class EncoderClosed(RuntimeError):
    """encode() or finish() on an encoder that was finished or closed."""


def _check_format(response_format: str) -> None:
    if response_format not in FORMATS:
        raise UnsupportedFormat(
            f"unsupported response_format {response_format!r}; supported: {', '.join(FORMATS)}"
        )


def encoded_rate_hz(response_format: str, requested_rate_hz: int) -> int:
    """The sample rate `response_format` is encoded at when `requested_rate_hz` is asked for."""
    _check_format(response_format)
    if not MIN_RATE_HZ <= requested_rate_hz <= MAX_RATE_HZ:
        raise UnsupportedSampleRate(
            f"sample_rate {requested_rate_hz} outside [{MIN_RATE_HZ}, {MAX_RATE_HZ}] Hz"
        )
    spec = AV_SPECS.get(response_format)
    if spec is None or spec.rate_rule is RateRule.EXACT:
        return requested_rate_hz
    if spec.rate_rule is RateRule.AT_LEAST:
        return next((r for r in spec.rates_hz if r >= requested_rate_hz), spec.rates_hz[-1])
    return min(spec.rates_hz, key=lambda r: (abs(r - requested_rate_hz), -r))


class StreamEncoder:
    """Encodes one response stream; see the module docstring for formats and rates.

    Use `open_encoder`. `encode` and `finish` return the bytes ready now (possibly b"");
    `finish` flushes resampler, codec and container, then closes. `close` is idempotent and
    frees the resampler and the PyAV container and codec, dropping whatever was pending
    (client gone); call it in a `finally`.
    """

    def __init__(
        self,
        response_format: str,
        input_rate_hz: int,
        output_rate_hz: int,
        *,
        encoding: EncodingConfig = DEFAULT_ENCODING,
    ) -> None:
        _check_format(response_format)
        if input_rate_hz <= 0:
            raise UnsupportedSampleRate(f"input rate {input_rate_hz} Hz is not positive")
        self.response_format = response_format
        self.content_type = FORMATS[response_format]
        self.input_rate_hz = input_rate_hz
        self.output_rate_hz = encoded_rate_hz(response_format, output_rate_hz)
        self.output_samples = 0  # samples at output_rate_hz handed to the codec so far
        self._resampler = (
            None
            if self.output_rate_hz == input_rate_hz
            else soxr.ResampleStream(
                input_rate_hz,
                self.output_rate_hz,
                1,
                dtype="float32",
                quality=encoding.resample_quality,
            )
        )
        spec = codec_spec(response_format, encoding)
        self._codec: RawCodec | G711Codec | AvCodec | None  # None once closed: PyAV freed
        if spec is not None:
            self._codec = AvCodec(spec, self.output_rate_hz)
        else:
            self._codec = raw_codec(response_format, self.output_rate_hz)

    @property
    def closed(self) -> bool:
        return self._codec is None

    @property
    def raw(self) -> bool:
        """pcm, wav, ulaw or alaw (no PyAV codec: `AV_SPECS` has none), so `encode` is a clip
        and a cast (and resampling when the rates differ), about 0.2-0.5 ms per second of
        audio."""
        return self.response_format not in AV_SPECS

    def _check_open(self) -> RawCodec | G711Codec | AvCodec:
        if self._codec is None:
            raise EncoderClosed(f"{self.response_format} encoder is finished or closed")
        return self._codec

    def _to_codec(self, pcm: np.ndarray) -> bytes:
        codec = self._check_open()
        pcm = np.clip(pcm, -1.0, 1.0)
        self.output_samples += pcm.size
        return codec.write(pcm)

    def encode(self, pcm: np.ndarray) -> bytes:
        """Feed float32 mono PCM at input_rate_hz; returns the encoded bytes ready now."""
        self._check_open()
        pcm = np.asarray(pcm)
        if pcm.ndim != 1 or not np.issubdtype(pcm.dtype, np.floating):
            raise ValueError(f"expected float mono PCM (samples,), got {pcm.dtype} {pcm.shape}")
        pcm = pcm.astype(np.float32, copy=False)
        if self._resampler is not None and pcm.size:
            pcm = self._resampler.resample_chunk(pcm)
        try:
            return self._to_codec(pcm) if pcm.size else b""
        except av.FFmpegError as exc:
            raise EncoderError(f"{self.response_format} encoding failed: {exc}") from exc

    def finish(self) -> bytes:
        """Flush everything and close; returns the last bytes (container trailer included)."""
        codec = self._check_open()
        try:
            out = b""
            if self._resampler is not None:
                tail = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
                out = self._to_codec(tail) if tail.size else b""
            return out + codec.flush()
        except av.FFmpegError as exc:
            raise EncoderError(f"{self.response_format} encoding failed: {exc}") from exc
        finally:
            self.close()

    def close(self) -> None:
        codec, self._codec, self._resampler = self._codec, None, None
        if codec is not None:
            codec.close()

    def __enter__(self) -> StreamEncoder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_encoder(
    response_format: str,
    input_rate_hz: int,
    output_rate_hz: int,
    *,
    encoding: EncodingConfig = DEFAULT_ENCODING,
) -> StreamEncoder:
    """A streaming encoder from float32 mono at input_rate_hz to `response_format`.

    The encoded rate is `encoded_rate_hz(response_format, output_rate_hz)` (read it back as
    `.output_rate_hz`); bit rates, Ogg page duration and resampling quality come from
    `encoding` (the settings' `encoding` section). Raises UnsupportedFormat or
    UnsupportedSampleRate (both ValueError).
    """
    return StreamEncoder(response_format, input_rate_hz, output_rate_hz, encoding=encoding)

"""ElevenLabs' `output_format` (`codec_rate[_kbps]`) as one of app/audio.py's encoders.

    mp3_<rate>_<kbps>   mp3 (bare MPEG frames, constant bit rate), rate an MPEG rate
    pcm_<rate>          raw s16le mono, any rate from 8000 to 48000 Hz
    ulaw_8000           raw G.711 u-law (telephony: Twilio's media streams)
    alaw_8000           raw G.711 A-law (telephony outside North America and Japan)
    opus_48000_<kbps>   Ogg Opus at 48 kHz

The default (no output_format) is ElevenLabs' own: mp3_44100_128.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from app.audio import FORMATS, StreamEncoder, open_encoder
from app.audio_codecs import MP3_RATES_HZ
from app.client_json import quote
from app.encoding_config import (
    MP3_BITRATE_RANGE_BPS,
    OPUS_BITRATE_RANGE_BPS,
    EncodingConfig,
)

DEFAULT_OUTPUT_FORMAT = "mp3_44100_128"
PCM_RATE_RANGE_HZ = (8000, 48000)
_PATTERN = re.compile(r"(mp3|pcm|ulaw|alaw|opus)_(\d{4,6})(?:_(\d{1,3}))?")
SUPPORTED = "mp3_<rate>_<kbps>, pcm_<rate>, ulaw_8000, alaw_8000, opus_48000_<kbps>"


class BadOutputFormat(ValueError):
    """An output_format Playhead cannot produce; the message says what it can."""


@dataclass(frozen=True)
class OutputFormat:
    name: str  # as the client wrote it
    codec: str  # one of app/audio.py's FORMATS
    rate_hz: int
    bitrate_bps: int | None = None  # mp3, opus

    @property
    def content_type(self) -> str:
        return FORMATS[self.codec]

    def open(self, input_rate_hz: int, encoding: EncodingConfig) -> StreamEncoder:
        """A streaming encoder from the voice's rate to this format."""
        if self.codec == "mp3" and self.bitrate_bps is not None:
            encoding = replace(encoding, mp3_bitrate_bps=self.bitrate_bps)
        elif self.codec == "opus" and self.bitrate_bps is not None:
            encoding = replace(encoding, opus_bitrate_bps=self.bitrate_bps)
        return open_encoder(self.codec, input_rate_hz, self.rate_hz, encoding=encoding)


def parse_output_format(name: str | None) -> OutputFormat:
    """The format named `name` (None: the default); BadOutputFormat when not produced."""
    name = DEFAULT_OUTPUT_FORMAT if name is None else name
    match = _PATTERN.fullmatch(name)
    if match is None:
        raise BadOutputFormat(
            f"Unknown output_format {quote(name, 40)}; Playhead produces {SUPPORTED}."
        )
    codec, rate_hz, kbps = match.group(1), int(match.group(2)), match.group(3)
    bitrate_bps = int(kbps) * 1000 if kbps is not None else None
    if codec in ("pcm", "ulaw", "alaw") and kbps is not None:
        raise BadOutputFormat(f"output_format {name}: {codec} takes no bit rate ({codec}_<rate>).")
    if codec in ("ulaw", "alaw") and rate_hz != 8000:
        law = "u-law" if codec == "ulaw" else "A-law"
        raise BadOutputFormat(f"output_format {name}: {law} is produced at 8000 Hz only.")
    if codec == "pcm" and not PCM_RATE_RANGE_HZ[0] <= rate_hz <= PCM_RATE_RANGE_HZ[1]:
        raise BadOutputFormat(f"output_format {name}: pcm rates are 8000 to 48000 Hz.")
    if codec == "mp3":
        if rate_hz not in MP3_RATES_HZ:
            rates = ", ".join(map(str, MP3_RATES_HZ))
            raise BadOutputFormat(f"output_format {name}: mp3 rates are {rates} Hz.")
        _check_bitrate(name, bitrate_bps, MP3_BITRATE_RANGE_BPS)
    if codec == "opus":
        if rate_hz != 48000:
            raise BadOutputFormat(f"output_format {name}: opus is produced at 48000 Hz.")
        _check_bitrate(name, bitrate_bps, OPUS_BITRATE_RANGE_BPS)
    return OutputFormat(name, codec, rate_hz, bitrate_bps)


def _check_bitrate(name: str, bitrate_bps: int | None, range_bps: tuple[int, int]) -> None:
    if bitrate_bps is None:
        raise BadOutputFormat(f"output_format {name} needs a bit rate in kb/s (e.g. _128).")
    low, high = range_bps
    if not low <= bitrate_bps <= high:
        raise BadOutputFormat(
            f"output_format {name}: the bit rate must be {low // 1000} to {high // 1000} kb/s."
        )

"""EncodingConfig: its own validation (ConfigError naming the field), and that every value it
accepts opens a real encoder at every rate the codec is encoded at."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from app.audio import open_encoder
from app.audio_codecs import AAC_RATES_HZ, MP3_RATES_HZ, OPUS_RATES_HZ
from app.encoding_config import (
    AAC_BITRATE_RANGE_BPS,
    MP3_BITRATE_RANGE_BPS,
    OPUS_BITRATE_RANGE_BPS,
    RESAMPLE_QUALITIES,
    EncodingConfig,
)
from scheduling import ConfigError

INPUT_RATE_HZ = 22050

BAD_VALUES = [
    ("mp3_bitrate_bps", 7_999),
    ("mp3_bitrate_bps", 320_001),
    ("mp3_bitrate_bps", 64_000.0),
    ("mp3_bitrate_bps", True),
    ("opus_bitrate_bps", 5_999),
    ("opus_bitrate_bps", 256_001),
    ("aac_bitrate_bps", 7_999),
    ("aac_bitrate_bps", 512_001),
    ("aac_bitrate_bps", "64000"),
    ("ogg_page_ms", 4),
    ("ogg_page_ms", 1001),
    ("ogg_page_ms", None),
    ("resample_quality", "hq"),
    ("resample_quality", "XQ"),
    ("resample_quality", None),
    ("inline_encode_max_s", -0.001),
    ("inline_encode_max_s", 1.001),
    ("inline_encode_max_s", float("nan")),
    ("inline_encode_max_s", float("inf")),
    ("inline_encode_max_s", False),
    ("encoder_threads", 0),
    ("encoder_threads", 65),
    ("encoder_threads", 1.5),
]


@pytest.mark.parametrize(("field", "value"), BAD_VALUES)
def test_each_bad_value_is_a_config_error_naming_the_field(field, value):
    with pytest.raises(ConfigError) as info:
        EncodingConfig(**{field: value})
    assert str(info.value).startswith(f"{field} must be ")
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(
    "changes",
    [
        {"mp3_bitrate_bps": 8_000, "opus_bitrate_bps": 6_000, "aac_bitrate_bps": 8_000},
        {"mp3_bitrate_bps": 320_000, "opus_bitrate_bps": 256_000, "aac_bitrate_bps": 512_000},
        {"ogg_page_ms": 5, "inline_encode_max_s": 0},
        {"ogg_page_ms": 1000, "inline_encode_max_s": 1.0},
        *({"resample_quality": quality} for quality in RESAMPLE_QUALITIES),
    ],
)
def test_edges_are_accepted(changes):
    config = EncodingConfig(**changes)
    assert dataclasses.asdict(config) == {**dataclasses.asdict(EncodingConfig()), **changes}


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        EncodingConfig().mp3_bitrate_bps = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fmt", "field", "bounds", "rates_hz"),
    [
        ("mp3", "mp3_bitrate_bps", MP3_BITRATE_RANGE_BPS, MP3_RATES_HZ),
        ("opus", "opus_bitrate_bps", OPUS_BITRATE_RANGE_BPS, OPUS_RATES_HZ),
        ("aac", "aac_bitrate_bps", AAC_BITRATE_RANGE_BPS, [r for r in AAC_RATES_HZ if r >= 8000]),
    ],
)
def test_every_accepted_bitrate_opens_at_every_encoded_rate(fmt, field, bounds, rates_hz):
    """The ranges are what the encoders take: libopus, for one, refuses to open above
    256 kb/s mono, which would be a 500 on every opus request instead of a config error."""
    pcm = np.zeros(INPUT_RATE_HZ // 10, dtype=np.float32)
    for bitrate_bps in bounds:
        encoding = EncodingConfig(**{field: bitrate_bps})
        for rate_hz in rates_hz:
            encoder = open_encoder(fmt, INPUT_RATE_HZ, rate_hz, encoding=encoding)
            assert encoder.output_rate_hz == rate_hz
            assert encoder.encode(pcm) + encoder.finish()
